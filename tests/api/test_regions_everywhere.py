"""Per-region verdicts reach every consumer of a result (issue 41), on the demo bundle in a running daemon
with a real Mosquitto and a real Chromium: the MQTT result, a rule's MQTT alert and the REST result carry
`regions` as the inspector made them, the kept evidence JPEG has each box in its outcome's colour, and the status page
lists each region with its outcome on the camera's card and in the inspection view."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest
import requests

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, ProgramConfig, TriggerConfig
from edge_runtime.config.rules import Rule
from edge_runtime.core.result import Result
from edge_runtime.core.samples import write_sample_video
from edge_runtime.verdicts.region_marks import OUTCOME_BGR
from tests.support.broker import Broker
from tests.support.browser import chromium
from tests.support.receiver import Subscriber
from tests.support.waiting import wait_for

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
PROGRAM = {"regions": [{"name": "screw", "box": [10, 20, 100, 80]}, {"name": "label", "box": [180, 120, 120, 100]}],
           "tiling": {"rows": 1, "cols": 2}}
NAMES = ["screw", "label", "tile_r1_c1", "tile_r1_c2"]


@pytest.fixture(scope="module")
def line(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[tuple[Daemon, Subscriber, Result]]:
    tmp = tmp_path_factory.mktemp("regions")
    broker = Broker(tmp / "broker").start()
    results = Subscriber(broker.port, "edge/regions-line/#")  # results and alerts
    cfg = Config(device_id="regions-line", data_dir=tmp / "data")
    cfg.model.path, cfg.model.threads = demo_dir, 2
    cfg.mqtt.host, cfg.mqtt.port = "127.0.0.1", broker.port
    cfg.api.port, cfg.api.host = 0, "127.0.0.1"
    cfg.evidence.keep_passes = 1
    cfg.rules = [Rule.model_validate({"name": "every-cover", "when": [{"field": "camera", "equals": "cover-cam"}],
                                      "actions": [{"type": "alert"}]})]
    cfg.programs = {"cover": ProgramConfig.model_validate(PROGRAM)}
    cfg.cameras = [CameraConfig(name="cover-cam", source=str(write_sample_video(tmp / "v.avi", frames=60)), fps=10,
                                trigger=TriggerConfig(mode="on_demand"), program="cover")]
    daemon = Daemon(cfg)
    daemon.start()
    try:
        wait_for(lambda: daemon.rigs["cover-cam"].camera.slot.peek() is not None, 10, "a frame")
        result = daemon.entry.trigger("cover-cam").result(timeout=60)
        yield daemon, results, result
    finally:
        daemon.stop()
        results.close()
        broker.stop()


def test_mqtt_results_alerts_and_rest_carry_each_regions_verdict(line: tuple[Daemon, Subscriber, Result]) -> None:
    daemon, results, result = line
    assert result.regions is not None and [r["name"] for r in result.regions] == NAMES
    assert all(r["outcome"] in ("ok", "nok") for r in result.regions)  # the demo's grammar always says defect
    published = wait_for(lambda: [m for m in results.on("/cover-cam/result") if m["id"] == result.id], 10,
                         "the MQTT result")[0]
    assert published["regions"] == result.regions and published["verdict"] == result.verdict
    alert = wait_for(lambda: [m for m in results.on("/cover-cam/alert") if m["result_id"] == result.id], 10,
                     "the rule's MQTT alert")[0]
    assert alert["regions"] == result.regions  # an alert says which region failed
    base = f"http://127.0.0.1:{daemon.api.port}"  # type: ignore[union-attr]
    rest = requests.get(f"{base}/api/v1/results/{result.id}", timeout=10).json()
    assert rest["regions"] == result.regions
    listed = requests.get(f"{base}/api/v1/results", params={"limit": 5}, timeout=10).json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert next(r for r in rows if r["id"] == result.id)["regions"] == result.regions
    doc = requests.get(f"{base}/api/v1/openapi.json", timeout=10).json()
    assert "outcome" in doc["components"]["schemas"]["ResultModel"]["properties"]["regions"]["description"]


def test_the_evidence_served_for_the_result_draws_each_region_in_its_outcome_colour(
        line: tuple[Daemon, Subscriber, Result]) -> None:
    daemon, _, result = line
    assert result.evidence is not None and result.regions is not None
    base = f"http://127.0.0.1:{daemon.api.port}"  # type: ignore[union-attr]
    data = requests.get(base + result.evidence["uri"], timeout=10).content
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None
    for region in result.regions:
        x, y, w, h = region["box"]
        colour = np.array(OUTCOME_BGR[region["outcome"]])
        for px, py in ((x, y + h // 2), (x + w - 1, y + h // 2), (x + w // 2, y + h - 1)):
            if region["outcome"] == "ok" and any(o["outcome"] == "nok" and _on_edge(o["box"], px, py)
                                                 for o in result.regions):
                continue  # a NOK box drawn over this point (tiles overlap the named regions)
            assert np.all(np.abs(image[py, px].astype(int) - colour) <= 60), (region["name"], image[py, px])


def _on_edge(box: list[int], px: int, py: int, width: int = 3) -> bool:
    x, y, w, h = box
    inside = x - width <= px <= x + w - 1 + width and y - width <= py <= y + h - 1 + width
    deep = x + width < px < x + w - 1 - width and y + width < py < y + h - 1 - width
    return inside and not deep


def test_the_status_page_lists_each_region_with_its_outcome(line: tuple[Daemon, Subscriber, Result]) -> None:
    daemon, _, result = line
    assert result.regions is not None
    expected = [(r["name"], r["outcome"]) for r in result.regions]
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 820, "height": 1180})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"http://127.0.0.1:{daemon.api.port}/")  # type: ignore[union-attr]
        card = '[data-camera="cover-cam"] .regions li'
        page.wait_for_selector(card, timeout=15000)
        shown = page.eval_on_selector_all(card, "els => els.map(e => [e.dataset.region, e.dataset.outcome,"
                                          " e.className, e.textContent])")
        assert [(s[0], s[1]) for s in shown] == expected
        for _, outcome, cls, text in shown:
            assert ("bad" if outcome == "nok" else "ok") in cls and ("NOK" if outcome == "nok" else "OK") in text
        page.click(f'#insp-list tr[data-id="{result.id}"]')  # the result's own view, with its evidence
        page.wait_for_selector("#insp-regions li", timeout=5000)
        detail = page.eval_on_selector_all("#insp-regions li",
                                           "els => els.map(e => [e.dataset.region, e.dataset.outcome])")
        assert [tuple(d) for d in detail] == expected
        page.wait_for_function("(() => { const i = document.getElementById('insp-image'); "
                               "return i.complete && i.naturalWidth > 0; })()", timeout=5000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "regions_page.png"), full_page=True)
        assert errors == []
