"""What the browser test checks in the Dagster UI's GraphQL responses."""

from __future__ import annotations

import json
from typing import Any


def graphql_errors(responses: list[Any]) -> list[str]:
    """Errors in the GraphQL responses the page received: an error status, a body that is
    not a JSON object, ``errors`` or a ``PythonError`` in it. Only a body the browser no
    longer keeps (Playwright's error) is not checked."""
    from playwright.sync_api import Error as PlaywrightError

    errors = []
    for r in responses:
        try:
            text = r.text()
        except PlaywrightError:  # a body no longer kept by the browser: nothing to check
            if r.status >= 400:
                errors.append(f"{r.status} (body gone)")
            continue
        try:
            body = json.loads(text)
        except ValueError:
            errors.append(f"{r.status} not JSON: {text[:200]}")
            continue
        if (r.status >= 400 or not isinstance(body, dict) or body.get("errors")
                or '"PythonError"' in text):
            errors.append(f"{r.status} {text[:500]}")
    return errors
