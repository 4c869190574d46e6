"""The review panel shows "—" for a timing that is not a number, never "NaN" (Chromium via Playwright)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import requests

from tests.api.test_api import running_daemon
from tests.support.browser import chromium

# ruff: noqa: B023 - the loop runs once (a generator fixture used inline)


def test_a_timing_that_is_not_a_number_shows_a_dash(tmp_path: Path, demo_dir: Path) -> None:
    for daemon in running_daemon(tmp_path, demo_dir, results=1):
        base = f"http://127.0.0.1:{daemon.api.port}"  # type: ignore[union-attr]
        rid = requests.get(base + "/api/v1/results?limit=1", timeout=10).json()["results"][0]["id"]
        original = requests.get(f"{base}/api/v1/results/{rid}", timeout=10).json()

        def tamper(route: Any) -> None:
            body = {**original, "timings_ms": {"total": "slow", "decode": None, "vision": 12.5}}
            route.fulfill(status=200, content_type="application/json", body=json.dumps(body))

        with chromium() as browser:
            page = browser.new_page(viewport={"width": 820, "height": 1180})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.route(f"**/api/v1/results/{rid}", tamper)
            page.goto(base + "/")
            page.wait_for_selector(f'#insp-list tr[data-id="{rid}"]', timeout=10000)
            page.click(f'#insp-list tr[data-id="{rid}"]')
            page.wait_for_function("document.getElementById('insp-info').textContent.includes('vision')",
                                   timeout=5000)
            info = page.inner_text("#insp-info")
            assert "NaN" not in info and "12.5" in info, info
            assert info.count("—") == 2, info
            assert not errors, errors
