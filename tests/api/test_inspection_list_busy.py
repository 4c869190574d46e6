"""The Inspections list when the device refuses a result query (429: two queries at a time, docs/api.md):
the page asks again, and the list it shows does not go blank meanwhile. It destructured `{results}` from
the 429 body, the TypeError was swallowed, and after a filter change the list had already been cleared."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import requests

from tests.api.test_api import running_daemon
from tests.support.browser import chromium

# ruff: noqa: B023 - the loop runs once (a generator fixture used inline)


def test_a_refused_query_is_asked_again_and_the_list_never_goes_blank(tmp_path: Path, demo_dir: Path) -> None:
    for daemon in running_daemon(tmp_path, demo_dir, results=1):
        base = f"http://127.0.0.1:{daemon.api.port}"  # type: ignore[union-attr]
        requests.get(base + "/api/v1/results?limit=1", timeout=10).raise_for_status()
        asked: list[str] = []

        def refuse_twice(route: Any) -> None:
            asked.append(route.request.url)
            if len(asked) <= 2:
                route.fulfill(status=429, content_type="application/json", headers={"Retry-After": "1"},
                              body='{"error": "too many result queries at once"}')
            else:
                route.continue_()

        with chromium() as browser:
            page = browser.new_page(viewport={"width": 820, "height": 1180})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(base + "/")
            page.wait_for_selector("#insp-list tr", timeout=10000)
            # Record whether the list is ever empty from here on.
            page.evaluate("""() => { const list = document.getElementById('insp-list'); window.blank = false;
                new MutationObserver(() => { if (!list.children.length) window.blank = true; })
                  .observe(list, { childList: true }); }""")
            page.route("**/api/v1/inspections*", refuse_twice)
            # The technician picks the list's filter again (a reset: the same query from the start).
            page.dispatch_event("#insp-filter", "change")
            deadline = time.monotonic() + 10
            while len(asked) < 3 and time.monotonic() < deadline:  # two refusals, then the answer
                page.wait_for_timeout(100)
            page.wait_for_function("(() => { const l = document.getElementById('insp-list'); "
                                   "return l.children.length > 0 && !l.hasAttribute('aria-busy'); })()",
                                   timeout=10000)
            assert len(asked) >= 3, asked
            first = asked[0]
            assert "after=" not in first  # the reset's query, asked again after the refusals
            assert asked[2] == first, asked
            assert not page.evaluate("window.blank"), "the list went blank while the device refused the query"
            assert page.locator("#insp-list tr").count() > 0
            assert not errors, errors
