"""Done-when test of issue 17, end to end on the demo line in a real Chromium: a defect shows its image
on the status page within a second, fires an MQTT alert and a webhook, is corrected by a technician in
the page, and appears in a dataset export."""

from __future__ import annotations

import json
import time
from pathlib import Path

from pydantic import SecretStr

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, TriggerConfig
from edge_runtime.config.rules import Rule
from edge_runtime.core.samples import write_sample_video
from edge_runtime.verdicts.review import export_from_config
from tests.support.broker import Broker
from tests.support.browser import chromium
from tests.support.receiver import Receiver, Subscriber
from tests.support.waiting import wait_for

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def test_a_defect_is_seen_alerted_corrected_in_the_page_and_exported(tmp_path: Path, demo_dir: Path) -> None:
    broker = Broker(tmp_path / "broker").start()
    receiver = Receiver().start()
    alerts = Subscriber(broker.port, "edge/demo-line/+/alert")
    cfg = Config(device_id="demo-line", data_dir=tmp_path / "data")
    cfg.model.path, cfg.model.threads = demo_dir, 2
    cfg.mqtt.host, cfg.mqtt.port = "127.0.0.1", broker.port
    cfg.api.port, cfg.api.host = 0, "127.0.0.1"
    cfg.api.token = SecretStr("tech-token")
    cfg.cameras = [CameraConfig(name="demo", source=str(write_sample_video(tmp_path / "v.avi", frames=60)), fps=10,
                                trigger=TriggerConfig(mode="on_demand"),
                                # The demo's random weights answer defect: true to this on every sample frame.
                                prompt="Inspect the aluminium part.")]
    cfg.rules = [Rule.model_validate({"name": "any-defect", "when": [{"field": "verdict.defect", "equals": True}],
                                      "actions": [{"type": "alert"}, {"type": "webhook", "url": receiver.url},
                                                  {"type": "review"}]})]
    daemon = Daemon(cfg)
    daemon.start()
    try:
        wait_for(lambda: daemon.rigs["demo"].camera.slot.peek() is not None, 10, "a frame")
        with chromium() as browser:
            page = browser.new_page(viewport={"width": 820, "height": 1180})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"http://127.0.0.1:{daemon.api.port}/")  # type: ignore[union-attr]
            page.wait_for_selector("#insp-filter")
            page.select_option("#insp-filter", "defect=true")  # the technician filters to defects

            result = daemon.entry.trigger("demo").result(timeout=60)
            journaled = time.monotonic()
            assert result.verdict["defect"] is True and result.evidence is not None
            row = f'#insp-list tr[data-id="{result.id}"] img'
            page.wait_for_function(f"(() => {{ const i = document.querySelector('{row}'); "
                                   "return i && i.complete && i.naturalWidth > 0; })()", timeout=5000)
            seen_after = time.monotonic() - journaled
            assert seen_after < 1.0, f"the defect's image showed after {seen_after:.2f} s"
            print(f"defect image on the page {seen_after * 1000:.0f} ms after the verdict was journaled")

            alert = wait_for(lambda: alerts.on("/demo/alert"), 10, "the MQTT alert")[0]
            assert alert["result_id"] == result.id and alert["rule"] == "any-defect"
            wait_for(lambda: f"{result.id}:any-defect:1" in receiver.keys(), 10, "the webhook")

            page.click(f'#insp-list tr[data-id="{result.id}"]')  # open the result
            page.wait_for_function("(() => { const i = document.getElementById('insp-image'); "
                                   "return i.complete && i.naturalWidth > 0; })()", timeout=5000)
            assert page.inner_text("#insp-verdict").startswith("DEFECT")
            assert page.inner_text("#insp-review") == "pending"
            # The technician corrects: not a defect after all (a reflection), with the API token.
            page.fill("#api-token", "tech-token")
            page.uncheck("#rv-defect")
            page.select_option("#rv-category", "none")
            page.fill("#rv-confidence", "1")
            page.select_option("#rv-notes", "surface clean")  # the demo schema: a fixed phrase
            page.click("#review-correct")
            page.wait_for_function("document.getElementById('review-status').textContent === 'saved: corrected'",
                                   timeout=5000)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "inspection_review.png"), full_page=True)
            assert errors == []
        fixed = {"defect": False, "category": "none", "confidence": 1, "notes": "surface clean"}
        assert daemon.journal.get(result.id)["review"]["correction"] == fixed  # type: ignore[index]
        summary = export_from_config(cfg, tmp_path / "dataset")
        rows = [json.loads(x) for x in (tmp_path / "dataset" / "train" / "metadata.jsonl").read_text().splitlines()]
        assert summary["images"] == 1 and rows[0]["id"] == result.id
        assert rows[0]["verdict"] == result.verdict and rows[0]["label"] == fixed
        assert (tmp_path / "dataset" / "train" / rows[0]["file_name"]).stat().st_size == result.evidence["bytes"]

        # The image is removed from the device (a technician's rm): the page says so, no broken image.
        found = daemon.verdicts.evidence.lookup(result.id)  # type: ignore[union-attr]
        assert found is not None
        found.path.unlink()
        with chromium() as browser:
            page = browser.new_page(viewport={"width": 820, "height": 1180})
            page.goto(f"http://127.0.0.1:{daemon.api.port}/")  # type: ignore[union-attr]
            page.wait_for_selector(f'#insp-list tr[data-id="{result.id}"]')
            page.click(f'#insp-list tr[data-id="{result.id}"]')
            page.wait_for_selector("#insp-image-gone:not([hidden])", timeout=5000)
            assert page.inner_text("#insp-image-gone").startswith(
                "evidence removed (removed from the device's evidence folder, ")
            assert page.is_hidden("#insp-image")
            # The list row, read before the removal was known, shows the words instead of its thumbnail.
            page.wait_for_selector(f'#insp-list tr[data-id="{result.id}"] small.gone', timeout=5000)
    finally:
        daemon.stop()
        alerts.close()
        receiver.stop()
        broker.stop()
