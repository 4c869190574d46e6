"""Stage 1 with two encoder lanes (model.encoder_lanes 2) on the tiny Qwen2.5-VL pair through a running
daemon: frames queued together are encoded at the same time, and their verdicts still come in the order
the frames were queued."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, TriggerConfig
from edge_runtime.core.inspection_queue import InspectionRequest
from edge_runtime.inference.llm.mtmd import MtmdContext
from tests.support.tiny_pairs import TinyPair, write_pair_bundle


def test_frames_queued_together_encode_at_once_on_two_lanes_and_answer_in_order(
        tmp_path: Path, tiny_pairs: Callable[[str], TinyPair], monkeypatch: pytest.MonkeyPatch) -> None:
    lanes = 2
    cfg = Config(device_id="lanes", data_dir=tmp_path / "data")
    cfg.model.path = write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp_path / "bundle")
    cfg.model.threads, cfg.model.warmup, cfg.model.encoder_lanes, cfg.model.encoder_cache_mb = 2, False, lanes, 0
    cfg.mqtt.enabled = cfg.api.enabled = cfg.governor.enabled = False
    still = tmp_path / "still.png"
    cv2.imwrite(str(still), np.zeros((64, 64, 3), np.uint8))
    cfg.cameras = [CameraConfig(name="line", source=str(still), trigger=TriggerConfig(mode="on_demand"))]
    # Each encode waits inside libmtmd's half for another: frames encoded one at a time never pass it.
    met = threading.Barrier(lanes, timeout=10)
    segments = MtmdContext.image_segments

    def together(self: MtmdContext, rgb: np.ndarray) -> Any:
        met.wait()
        return segments(self, rgb)

    monkeypatch.setattr(MtmdContext, "image_segments", together)
    daemon = Daemon(cfg)
    rng = np.random.default_rng(5)
    requests = [InspectionRequest(rng.integers(0, 256, (96, 96, 3), dtype=np.uint8), "line", seq=i)
                for i in range(4)]
    answered: list[int] = []
    for request in requests:  # queued before the worker starts: stage 1 finds them together
        daemon.inspections.submit(request)
        request.future.add_done_callback(lambda f: answered.append(f.result().frame.seq))
    daemon.start()
    try:
        results = [r.future.result(timeout=120) for r in requests]
    finally:
        daemon.stop()
    assert [r.frame.seq for r in results] == [0, 1, 2, 3]
    assert answered == [0, 1, 2, 3]
