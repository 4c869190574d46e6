"""edge_camera_state has a series for every state a camera can be in, and exactly one of them is 1."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from edge_runtime.api.metrics import StatusCollector
from edge_runtime.capture.camera import CameraState


def _status(state: str) -> dict[str, object]:
    return {"cameras": [{"name": "belt", "state": state, "fps": 0.0, "frames": {}}], "ready": True,
            "inspection": {"queue_depth": 0, "queue_size": 4, "errors": 0},
            "journal": {"total": 0, "unsent": 0}}


@pytest.mark.parametrize("state", [s.value for s in CameraState])
def test_every_camera_state_is_reported_as_itself(state: str) -> None:
    registry = CollectorRegistry()
    registry.register(StatusCollector(lambda: _status(state)))
    lines = [ln for ln in generate_latest(registry).decode().splitlines() if ln.startswith("edge_camera_state{")]
    assert f'edge_camera_state{{camera="belt",state="{state}"}} 1.0' in lines
    assert len(lines) == len(CameraState)
    assert sum(ln.endswith(" 1.0") for ln in lines) == 1
