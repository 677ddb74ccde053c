"""The Dagster UI as an operator opens it: headless Chromium (Debian's ``chromium``, driven
by Playwright) against ``dagster-webserver`` on 127.0.0.1 over a small demo lake
(:mod:`tests.ui.demo`). Every page must load without an error — no uncaught script error,
no GraphQL error or ``PythonError`` in any response, no error banner, no traceback in the
webserver's log — and show the expected names and numbers:

- the asset graph: its groups (raw, dimensions, segments, microbatch); the lineage of
  ``enriched_events``: events, dim_products, user_segments upstream of it;
- ``user_segments``, events: the newest partition with its segment_vip and input_rows;
  overview: its Metadata section's Plots toggle (Dagster 1.13 has it there, not on the
  events tab) plots the per-day metadata over its materialization events (segment_vip,
  changed_users, input_rows; the by-partition view of 1.13 shows no plot for this asset);
- ``enriched_events``: the batch's events_in and state_budget_bytes; its checks
  (state_budget, broadcast_versions_accepted);
- ``events`` (observable source): the observed Delta version;
- the sensor and the schedule: their names, target jobs and descriptions;
- the backfill made with the README's CLI (``python -m jobs.backfill``): its id and assets.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

import pytest

from tests.ui import demo
from tests.ui.graphql import graphql_errors

pytestmark = [pytest.mark.ui, pytest.mark.slow]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TIMEOUT_MS = 30_000
#: what the UI shows when a page fails
ERROR_SIGNS = ("Unexpected GraphQL error", "An unexpected error", "Something went wrong")


Visit = Callable[..., None]


def _visitor(page: Any, url: str, shots: Any, problems: list[str]) -> Visit:
    """``visit(name, path, texts, pairs, names, clicks)``: open ``url + path`` (and click
    the buttons named in ``clicks``, in order), wait for every text (``names``: exact), and
    for each ``(key, value)`` a table row holding both, then check that nothing failed;
    what went wrong goes to ``problems`` (every page is visited; a screenshot of each is
    kept)."""
    from playwright.sync_api import expect

    failures: list[str] = []
    responses: list[Any] = []
    page.on("pageerror", lambda e: failures.append(f"script error: {e}"))
    page.on("response", lambda r: responses.append(r) if "/graphql" in r.url else None)

    def visit(name: str, path: str, texts: list[str] = (), pairs: list[tuple[str, str]] = (),
              names: list[str] = (), clicks: tuple[str, ...] = ()) -> None:
        failures.clear()
        responses.clear()
        page.goto(url + path)
        try:
            for click in clicks:  # in order; the last element with the text (the Metadata
                # section's toggles come after the page's tabs of the same names)
                page.get_by_text(click, exact=True).last.click(timeout=TIMEOUT_MS)
            wanted = [(t, False) for t in texts] + [(n, True) for n in names]
            for text, exact in wanted:
                expect(page.get_by_text(text, exact=exact).first).to_be_visible(
                    timeout=TIMEOUT_MS)
            for key, value in pairs:
                row = page.locator("tr").filter(has_text=key).first
                expect(row).to_contain_text(value, timeout=TIMEOUT_MS)
        except AssertionError as e:
            failures.append(str(e).splitlines()[0])
        page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
        failures.extend(graphql_errors(responses))
        body = page.inner_text("body")
        failures.extend(f"shows {sign!r}" for sign in ERROR_SIGNS if sign in body)
        problems.extend(f"{name} ({path}): {f}" for f in failures)

    return visit


def test_operator_pages_load_and_show_the_demo(spark, lake, tmp_path):
    # a missing browser fails the test (never a skip): the browser test is a feature
    assert CHROMIUM is not None, ("Debian's chromium is not installed: run `make test` "
                                  "(it installs it) or `apt-get install -y chromium`")
    from playwright.sync_api import sync_playwright

    shots = tmp_path / "pages"
    shots.mkdir()
    problems: list[str] = []
    with demo.webserver(tmp_path / "webserver.log") as server:
        d = demo.build(spark, lake)  # while the webserver loads the code location
        url = server.wait_serving()
        with sync_playwright() as pw:
            _visit_pages(pw, url, d, shots, problems)
        served = server.log.read_text(errors="replace")
        problems += [f"webserver log: {ln}" for ln in served.splitlines()
                     if "Traceback" in ln or " - ERROR - " in ln]
    assert not problems, "\n".join(problems)


def _visit_pages(pw: Any, url: str, d: demo.Demo, shots: Any, problems: list[str]) -> None:
    """The operator's pages, in Chromium (see the module doc)."""
    browser = pw.chromium.launch(executable_path=CHROMIUM)
    try:
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        visit = _visitor(page, url, shots, problems)
        visit("asset graph", "/asset-groups",
              names=["raw", "dimensions", "segments", "microbatch"])
        visit("enriched_events lineage", "/assets/enriched_events?view=lineage",
              names=["events", "dim_products", "user_segments", "enriched_events"])
        visit("user_segments", "/assets/user_segments?view=events",
              [d.segments_day], [("segment_vip", str(d.segments["segment_vip"])),
                                 ("input_rows", str(d.segments["input_rows"]))])
        visit("user_segments plots", "/assets/user_segments",
              names=["segment_vip", "changed_users", "input_rows"],
              clicks=("Plots", "Events"))
        visit("enriched_events", "/assets/enriched_events?view=events",
              names=["enriched_events"], pairs=[("events_in", str(d.batch["events_in"])),
                                                ("state_budget_bytes", str(100 * 2**20))])
        visit("enriched_events checks", "/assets/enriched_events?view=checks",
              ["state_budget", "broadcast_versions_accepted"])
        visit("events", "/assets/events?view=events", names=["events"],
              pairs=[("delta_version", d.events_version)])
        visit("sensor", f"/locations/{demo.REPO_PATH}/sensors/broadcast_versions_sensor",
              ["broadcast_versions_sensor", "enrichment_microbatch",
               "Requests one enrichment micro-batch"])
        visit("schedule", f"/locations/{demo.REPO_PATH}/schedules/daily_segment_refresh",
              ["daily_segment_refresh", "daily_segment_refresh_job",
               "segment users for the day that just ended"])
        visit("backfill", f"/runs/b/{d.backfill_id}",
              [d.backfill_id, "user_segments", "user_features"])
    finally:
        browser.close()
