"""A review sent while the journal's disk is full (a real tmpfs) is a 503 `storage_full` with
Retry-After, like a trigger then, and goes through once space returns. It was a 500
`internal_error` whose message was SQLite's exception ("OperationalError: database or disk is full")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import requests

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import load_config
from tests.support.tmpfs import fill_disk, tmpfs


def test_a_review_on_a_full_disk_is_a_503_storage_full_and_goes_through_when_space_returns(
        tmp_path: Path, demo_dir: Path) -> None:
    with tmpfs(tmp_path / "disk", "8m") as disk:
        cfg = load_config(None)
        cfg.device_id, cfg.data_dir = "full-review", disk / "data"
        cfg.model.path, cfg.model.threads = demo_dir, 2
        cfg.mqtt.enabled = cfg.evidence.enabled = False
        cfg.journal.min_free_mb = 0
        cfg.api.host, cfg.api.port = "127.0.0.1", 0
        daemon = Daemon(cfg)
        daemon.start()
        try:
            assert daemon.api is not None
            url = f"http://127.0.0.1:{daemon.api.port}"
            frame = np.full((64, 64, 3), 90, np.uint8)
            result = daemon.entry.submit_image(frame, journal=True).result(timeout=60)
            filler = fill_disk(disk)
            review = {"action": "confirm", "note": "checked at the bench " + "x" * 400}
            full = requests.post(f"{url}/api/v1/results/{result.id}/review", json=review, timeout=30)
            assert full.status_code == 503, full.text
            assert full.json()["error"]["type"] == "storage_full"
            assert "disk full" in full.json()["error"]["message"]
            assert int(full.headers["Retry-After"]) > 0
            assert requests.get(f"{url}/healthz", timeout=5).status_code == 200
            filler.unlink()
            ok = requests.post(f"{url}/api/v1/results/{result.id}/review", json=review, timeout=30)
            assert ok.status_code == 200 and ok.json()["review"]["state"] == "confirmed"
            assert daemon.journal.get(result.id)["review"]["state"] == "confirmed"  # type: ignore[index]
        finally:
            daemon.stop()
