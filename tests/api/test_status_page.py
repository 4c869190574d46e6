"""The status page in a real headless Chromium (Debian's), driven by Playwright.

`make test` installs Chromium; without it these tests FAIL (a skipped browser test hides a broken page)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, TriggerConfig
from edge_runtime.core.samples import write_sample_video
from tests.support.browser import chromium

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture(autouse=True)
def streams_released(request: pytest.FixtureRequest) -> None:
    """A closed page's event stream is noticed at its next keep-alive; wait for it so each test has
    the stream slots to itself."""
    if "daemon" not in request.fixturenames:
        return
    d: Daemon = request.getfixturevalue("daemon")
    streams = d.api.app.extensions["edge_runtime_streams"]  # type: ignore[union-attr]
    deadline = time.monotonic() + 20
    while streams.in_flight and time.monotonic() < deadline:
        time.sleep(0.1)


def watch(page: Any) -> list[str]:
    """Every console error and uncaught exception of the page (a 404 favicon, an SVG NaN, ...)."""
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    return errors


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("page")
    cfg = Config(device_id="press-7", data_dir=tmp / "data")
    cfg.model.path, cfg.model.threads = demo_dir, 2
    cfg.mqtt.enabled = False
    cfg.api.port, cfg.api.host = 0, "127.0.0.1"
    cfg.cameras = [CameraConfig(name="station-a", source=str(write_sample_video(tmp / "v.avi", frames=90)), fps=10,
                                trigger=TriggerConfig(mode="on_demand"))]
    d = Daemon(cfg)
    d.start()
    deadline = time.monotonic() + 10
    while d.rigs["station-a"].camera.slot.peek() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    d.entry.trigger("station-a").result(timeout=10)
    yield d
    d.stop()


def test_status_page_renders_and_updates_live(daemon: Daemon, browser: Any) -> None:
    url = f"http://127.0.0.1:{daemon.api.port}/"  # type: ignore[union-attr]
    if True:
        page = browser.new_page(viewport={"width": 820, "height": 1180})  # a tablet
        try:
            errors = watch(page)
            page.goto(url)
            page.wait_for_selector('[data-camera="station-a"] .verdict:not(:empty)', timeout=15000)
            assert page.inner_text("#device") == "press-7"
            assert page.inner_text('[data-camera="station-a"] .state') == "streaming"
            assert page.inner_text("#ready") == "ready"
            page.wait_for_function("document.querySelectorAll('#results tr').length >= 1", timeout=10000)
            page.wait_for_selector("#live.ok", timeout=10000)
            before = page.eval_on_selector_all("#results tr", "rows => rows.length")
            result = daemon.entry.trigger("station-a").result(timeout=10)  # a new verdict arrives
            page.wait_for_function(f"seen.has({json.dumps(result.id)})", timeout=10000)
            page.wait_for_function(f"document.querySelectorAll('#results tr').length > {before}", timeout=10000)
            assert page.inner_text("#results tr:first-child td:nth-child(2)") == "station-a"
            # The frame's src is refreshed on every poll and result: wait for one load to finish.
            page.wait_for_function("(() => { const i = document.querySelector('[data-camera=\"station-a\"] img');"
                                   " return i.complete && i.naturalWidth > 0; })()", timeout=10000)
            page.wait_for_timeout(300)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "status_page.png"), full_page=True)
            legend = page.inner_text("#stage-legend")
            assert all(stage in legend for stage in ("capture", "preprocess", "encode", "prefill", "decode"))
            text = page.inner_text("body") + page.inner_html("main")
            assert "Infinity" not in text and "NaN" not in text  # no sensors here: nothing, not -Infinity
            assert errors == []
        finally:
            page.close()


def test_degraded_device_shows_a_banner_with_its_reasons(daemon: Daemon, browser: Any) -> None:
    page = browser.new_page()
    try:
        errors = watch(page)
        page.goto(f"http://127.0.0.1:{daemon.api.port}/")  # type: ignore[union-attr]
        page.wait_for_selector("#ready.ok", timeout=10000)
        assert page.is_hidden("#banner")
        daemon.faults.add("offload endpoints down")
        try:
            page.wait_for_selector("#banner:visible", timeout=8000)
            assert "offload endpoints down" in page.inner_text("#banner")
        finally:
            daemon.faults.discard("offload endpoints down")
        page.wait_for_selector("#banner", state="hidden", timeout=8000)
        assert errors == []
    finally:
        page.close()


def test_page_resumes_events_it_missed_while_loading(daemon: Daemon, browser: Any) -> None:
    # Hold the event stream back until after a new verdict: the page must still show it (by id).
    page = browser.new_page()
    try:
        errors = watch(page)
        held: list[Any] = []
        page.route("**/api/v1/events*", lambda route: held.append(route))
        page.goto(f"http://127.0.0.1:{daemon.api.port}/")  # type: ignore[union-attr]
        page.wait_for_function("document.querySelectorAll('#results tr').length >= 1", timeout=10000)
        deadline = time.monotonic() + 10
        while not held and time.monotonic() < deadline:
            page.wait_for_timeout(50)
        result = daemon.entry.trigger("station-a").result(timeout=10)  # made between the fetch and the connect
        assert held and "last_event_id=" in held[0].request.url
        held[0].continue_()
        page.wait_for_function(f"seen.has({json.dumps(result.id)})", timeout=10000)
        assert errors == []
    finally:
        page.close()


def test_temperature_axis_starts_near_the_readings_and_power_history_is_drawn(
        tmp_path: Path, demo_dir: Path, browser: Any) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"temperatures": {"cpu": 61 + i % 5, "gpu": 58.0},
                                         "power_w": {"VDD_IN": 7.5 + i % 3}}) + "\n" for i in range(20)))
    cfg = Config(device_id="press-8", data_dir=tmp_path / "data")
    cfg.model.path, cfg.model.threads = demo_dir, 2
    cfg.mqtt.enabled = False
    cfg.api.port, cfg.api.host = 0, "127.0.0.1"
    cfg.governor.sensor, cfg.governor.replay_file, cfg.governor.interval_s = "replay", trace, 0.2
    d = Daemon(cfg)
    d.start()
    page = browser.new_page()
    try:
        errors = watch(page)
        page.goto(f"http://127.0.0.1:{d.api.port}/")  # type: ignore[union-attr]
        page.wait_for_function("document.querySelectorAll('#power polyline').length === 1 && "
                               "document.querySelector('#thermal polyline').getAttribute('points').split(' ')"
                               ".length >= 2", timeout=15000)
        labels = page.eval_on_selector_all("#thermal text", "ts => ts.map(t => parseFloat(t.textContent))")
        assert len(labels) == 2 and 50 < min(labels) < max(labels) < 80  # axis spans the readings, not 0..max
        assert "W" in page.eval_on_selector("#power", "s => s.textContent")
        assert errors == []
    finally:
        page.close()
        d.stop()
