"""The status page in a real headless Chromium (Debian's), driven by Playwright."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_runtime.app import Daemon
from edge_runtime.config import CameraConfig, Config, TriggerConfig
from edge_runtime.samples import write_sample_video

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium is not installed")


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
    d.trigger("station-a").result(timeout=10)
    yield d
    d.stop()


def test_status_page_renders_and_updates_live(daemon: Daemon) -> None:
    from playwright.sync_api import sync_playwright

    url = f"http://127.0.0.1:{daemon.api.port}/"  # type: ignore[union-attr]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 820, "height": 1180})  # a tablet
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url)
            page.wait_for_selector('[data-camera="station-a"] .verdict:not(:empty)', timeout=15000)
            assert page.inner_text("#device") == "press-7"
            assert page.inner_text('[data-camera="station-a"] .state') == "streaming"
            assert page.inner_text("#ready") == "ready"
            page.wait_for_function("document.querySelectorAll('#results tr').length >= 1", timeout=10000)
            page.wait_for_selector("#live.ok", timeout=10000)
            before = page.eval_on_selector_all("#results tr", "rows => rows.length")
            result = daemon.trigger("station-a").result(timeout=10)  # a new verdict arrives
            page.wait_for_function(f"document.querySelectorAll('#results tr').length > {before}", timeout=10000)
            assert page.inner_text("#results tr:first-child td:nth-child(2)") == "station-a"
            frame_ok = page.eval_on_selector('[data-camera="station-a"] img', "i => i.complete && i.naturalWidth > 0")
            assert frame_ok and result.id
            page.wait_for_timeout(300)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "status_page.png"), full_page=True)
            assert errors == []
        finally:
            browser.close()
