"""The images held for second opinions are bounded by the config's `offload.escalate.max_held_mb` and
by MAX_HELD frames (the local pipeline's, whatever the offload queue's size); beyond them the oldest is
let go and counted, and the held ones still escalate."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from pydantic import ValidationError

from edge_runtime.config.offload import OffloadConfig
from edge_runtime.core.governor_gate import OpenGate
from edge_runtime.fleet.offload.escalation import MAX_HELD, Escalation
from edge_runtime.fleet.offload.router import Offloader
from tests.fleet.test_escalation import WHEN, Asked, committed, request

FRAME = 300 * 300 * 3  # bytes of one held frame


def config(**offload: Any) -> OffloadConfig:
    return OffloadConfig.model_validate({"enabled": True, "endpoints": [{"url": "http://127.0.0.1:9/v1"}],
                                         **offload})


def test_frames_over_the_configured_byte_bound_evict_the_oldest_and_the_held_ones_still_escalate() -> None:
    asked = Asked()
    escalation = Escalation.from_config(config(queue_size=8, escalate={"when": WHEN, "max_held_mb": 1}), asked)
    reqs = [request(i, side=300) for i in range(5)]
    for req in reqs:
        escalation.hold(req)
    assert 3 * FRAME <= 1024 * 1024 < 4 * FRAME  # 1 MiB holds three of these frames
    assert escalation.status() == {"images_held": 3, "images_held_bytes": 3 * FRAME, "images_evicted": 2}
    escalation.notify(committed(reqs[0], defect=True))  # the oldest was let go: nothing to send
    assert asked.calls == []
    for req in reqs[2:]:
        escalation.notify(committed(req, defect=True))
    assert [image is req.image for (_, image, _), req in zip(asked.calls, reqs[2:], strict=True)] == [True] * 3
    assert escalation.status() == {"images_held": 0, "images_held_bytes": 0, "images_evicted": 2}


def test_a_small_offload_queue_does_not_evict_frames_still_waiting_for_their_local_verdict() -> None:
    """The held frames are the local pipeline's (queue, batch, one encoding ahead per camera), not the
    offload queue's: four cameras with three frames each in flight outnumber an offload queue of 2."""
    asked = Asked()
    escalation = Escalation.from_config(config(queue_size=2, escalate={"when": WHEN}), asked)
    reqs = [request(i) for i in range(12)]
    for req in reqs:
        escalation.hold(req)
    assert escalation.status()["images_held"] == 12 and escalation.status()["images_evicted"] == 0
    escalation.notify(committed(reqs[0], defect=True))  # the oldest, still held
    assert len(asked.calls) == 1


def test_no_more_than_max_held_frames_are_held() -> None:
    escalation = Escalation.from_config(config(escalate={"when": WHEN, "max_held_mb": 1024}), Asked())
    for i in range(MAX_HELD + 1):
        escalation.hold(request(i))
    assert escalation.status()["images_held"] == MAX_HELD and escalation.status()["images_evicted"] == 1


def test_the_offloader_builds_its_escalation_with_the_configured_bounds() -> None:
    cfg = config(queue_size=4, escalate={"when": WHEN, "max_held_mb": 16})
    offloader = Offloader(cfg, set(), "d", inspector=lambda: None,  # type: ignore[arg-type, return-value]
                          deliver=lambda _req, result: result, local=lambda _req: Future(), gate=OpenGate().decision)
    assert offloader.escalation is not None
    assert (offloader.escalation.max_held, offloader.escalation.max_bytes) == (MAX_HELD, 16 * 1024 * 1024)
    default = config(escalate={"when": WHEN}).escalate
    assert default is not None and default.max_held_mb == 64


@pytest.mark.parametrize("value", [0, 1025])
def test_a_held_bytes_bound_out_of_range_is_refused_naming_the_key(value: int) -> None:
    with pytest.raises(ValidationError, match=r"escalate\.max_held_mb"):
        config(escalate={"when": WHEN, "max_held_mb": value})
