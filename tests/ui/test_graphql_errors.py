"""The browser test's GraphQL check reports every failed response (no browser needed):
only a body the browser no longer keeps goes unchecked."""

from __future__ import annotations

from dataclasses import dataclass

from playwright.sync_api import Error as PlaywrightError

from tests.ui.graphql import graphql_errors


@dataclass
class FakeResponse:
    status: int
    body: str | None  # None: the browser no longer keeps it

    def text(self) -> str:
        if self.body is None:
            raise PlaywrightError("No resource with given identifier found")
        return self.body


def test_graphql_errors_reports_each_failed_response():
    responses = [
        FakeResponse(200, '{"data": {"ok": 1}}'),  # fine
        FakeResponse(200, None),  # gone, status fine: unchecked
        FakeResponse(200, "<html>502 Bad Gateway</html>"),  # not JSON
        FakeResponse(200, '{"errors": [{"message": "boom"}]}'),
        FakeResponse(200, '{"data": {"x": {"__typename": "PythonError"}}}'),
        FakeResponse(500, None),  # gone, but an error status
        FakeResponse(200, '["a list"]'),
    ]
    errors = graphql_errors(responses)
    assert [e.split(" ", 1)[0] for e in errors] == ["200", "200", "200", "500", "200"]
    assert errors[0] == "200 not JSON: <html>502 Bad Gateway</html>"
    assert "boom" in errors[1] and "PythonError" in errors[2]
    assert errors[3] == "500 (body gone)" and errors[4] == '200 ["a list"]'
