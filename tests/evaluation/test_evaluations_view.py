"""The Evaluations view's data: eval keeps its summary in the data folder, the API lists them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edge_runtime.api import create_app
from edge_runtime.evaluation.evaluate import EVALUATIONS_KEPT, register
from tests.api.test_api_device import FakeDevice, _as_device


def report(n: int, model: str = "m@1") -> dict[str, Any]:
    rate = {"count": 1, "of": 10, "rate": 0.1, "ci95": [0.02, 0.4]}
    variant = {"label": "A", "key": f"{n:016x}", "model": model, "prompt": "p", "errors": {},
               "defect": {"escape": rate, "false_reject": rate, "precision": 1.0, "recall": 0.9, "f1": 0.95},
               "fields": {}, "latency": {"total_ms": {"p50": 1.0, "p95": 2.0}, "tokens": {"mean": 30.0}},
               "confidence": {"threshold": None}, "run": {"images_per_s": 3.0}}
    return {"generated": f"2026-12-02T02:{n // 60:02d}:{n % 60:02d}.000Z", "defect_rule": "verdict.defect == true",
            "dataset": {"path": "ds", "source": "jsonl", "samples": 20, "issue_counts": {}},
            "variants": [variant], "comparisons": []}


def test_eval_keeps_the_newest_summaries_and_the_api_lists_them_newest_first(tmp_path: Path) -> None:
    for n in range(EVALUATIONS_KEPT + 2):
        assert register(tmp_path, tmp_path / "out", report(n, model="<b>m</b>@1" if n == 51 else "m@1"))
    folder = tmp_path / "evaluations"
    assert len(list(folder.glob("*.json"))) == EVALUATIONS_KEPT
    (folder / "9999-junk.json").write_text("{not json")
    (folder / "9998-big.json").write_text(json.dumps({"x": "y" * 300_000}))
    (folder / "9997-link.json").symlink_to("/etc/passwd")
    client = create_app(_as_device(FakeDevice(tmp_path)), FakeDevice(tmp_path).config.api).test_client()
    res = client.get("/api/v1/evaluations")
    assert res.status_code == 200
    items = res.get_json()["evaluations"]
    # the link is not listed; the two bad files took places among the newest 50 and were skipped
    assert len(items) == EVALUATIONS_KEPT - 2
    assert items[0]["variants"][0]["model"] == "<b>m</b>@1"  # as stored: the page escapes it
    assert items[0]["generated"] > items[-1]["generated"]
    assert items[0]["variants"][0]["escape"]["rate"] == 0.1 and items[0]["out"] == str((tmp_path / "out").resolve())


def test_no_evaluations_is_an_empty_list(tmp_path: Path) -> None:
    client = create_app(_as_device(FakeDevice(tmp_path)), FakeDevice(tmp_path).config.api).test_client()
    assert client.get("/api/v1/evaluations").get_json() == {"evaluations": []}


def test_the_page_escapes_what_it_shows() -> None:
    js = (Path(__file__).resolve().parents[2] / "edge_runtime/api/static/app.js").read_text()
    start = js.index("async function loadEvaluations")
    body = js[start:js.index("function listen", start)]
    assert "${ev." not in body and "${v." not in body  # every interpolated value goes through esc()


def test_the_status_page_lists_evaluations_as_text(tmp_path: Path, demo_dir: Path) -> None:
    """Chromium via Playwright: the panel appears with the summary; a hostile model name stays text."""
    from tests.api.test_api import running_daemon
    from tests.support.browser import chromium

    for daemon in running_daemon(tmp_path, demo_dir, results=1):
        assert register(daemon.config.data_dir, tmp_path / "out", report(1, model="<img src=x onerror=boom()>"))
        base = f"http://127.0.0.1:{daemon.api.port}"  # type: ignore[union-attr]
        with chromium() as browser:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))  # noqa: B023 - the loop runs once
            page.goto(base + "/")
            page.wait_for_selector("#evaluations-panel:not([hidden]) #evaluations tr", timeout=15000)
            text = page.inner_text("#evaluations")
            assert "<img src=x onerror=boom()>" in text and "10.00% (1/10)" in text, text
            assert page.query_selector("#evaluations img") is None
            assert not errors, errors
