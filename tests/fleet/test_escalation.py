"""Escalation is a sink of committed verdicts: the camera schedule has offload hold a local frame's
image under a tag that travels on the request and comes back on the result; a committed verdict that
matches `escalate.when` sends that image for a second opinion. The held images are bounded by count
and bytes (evictions counted). The real central server and daemon run in test_offload.py."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from edge_runtime.capture.camera import Camera
from edge_runtime.capture.scheduler import CameraSchedule
from edge_runtime.config import TriggerConfig
from edge_runtime.core.errors import QueueFull
from edge_runtime.core.governor_gate import OpenGate
from edge_runtime.core.inspection_queue import InspectionQueue, InspectionRequest
from edge_runtime.core.result import FrameInfo, Result
from edge_runtime.core.sink import Sink
from edge_runtime.fleet.offload.escalation import Escalation, pinned_bytes
from edge_runtime.verdicts.pipeline import VerdictPipeline

WHEN = {"defect": True}


class Asked:
    """Stands in for `Offloader.second_opinion`: records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, np.ndarray, str | None]] = []

    def __call__(self, result: Result, image: np.ndarray, prompt: str | None) -> Future[Result]:
        self.calls.append((result.id, image, prompt))
        return Future()


def request(value: int = 1, prompt: str | None = "look", side: int = 8) -> InspectionRequest:
    return InspectionRequest(np.full((side, side, 3), value, np.uint8), "cam", prompt, seq=value)


def committed(req: InspectionRequest, defect: bool) -> Result:
    """The result as the pipeline commits it: `deliver` copies the request's tag onto it."""
    result = Result(device="d", camera=req.camera, frame=FrameInfo(req.seq, 8, 8), verdict={"defect": defect},
                    text="", model="m", timings_ms={"total": 1.0}, prompt=req.prompt or "default")
    return VerdictPipeline(_NoJournal(), lambda _camera: None).deliver(
        InspectionRequest(req.image, req.camera, req.prompt, journal=False, offload_tag=req.offload_tag), result)


class _NoJournal:
    def refusing(self) -> bool:
        return False

    def add(self, result: Result, extra: Any = None) -> int:
        return 0


def test_a_committed_matching_verdict_asks_with_the_held_image_and_the_requests_prompt() -> None:
    asked = Asked()
    escalation = Escalation(WHEN, asked)
    assert isinstance(escalation, Sink)
    req = request(7)
    escalation.hold(req)
    assert req.offload_tag is not None
    result = committed(req, defect=True)
    assert result.offload_tag == req.offload_tag and "offload_tag" not in result.to_dict()  # never in the JSON
    escalation.notify(result)
    assert [(rid, prompt) for rid, _, prompt in asked.calls] == [(result.id, "look")]
    assert asked.calls[0][1] is req.image
    assert escalation.status()["images_held"] == 0  # taken back by the verdict


def test_a_verdict_that_does_not_match_asks_nothing_and_frees_its_image() -> None:
    asked = Asked()
    escalation = Escalation(WHEN, asked)
    req = request()
    escalation.hold(req)
    escalation.notify(committed(req, defect=False))
    assert asked.calls == [] and escalation.status() == {"images_held": 0, "images_held_bytes": 0,
                                                         "images_evicted": 0}


def test_a_result_without_a_tag_is_never_escalated() -> None:
    """An API image, a line job, a remote answer (a second opinion itself): none was held."""
    asked = Asked()
    escalation = Escalation(WHEN, asked)
    escalation.hold(request(1))
    escalation.notify(committed(request(2), defect=True))
    assert asked.calls == [] and escalation.status()["images_held"] == 1


def test_the_held_images_are_bounded_by_count_and_by_bytes_and_evictions_are_counted() -> None:
    asked = Asked()
    by_count = Escalation(WHEN, asked, max_held=2)
    reqs = [request(i) for i in range(3)]
    for req in reqs:
        by_count.hold(req)
    assert by_count.status() == {"images_held": 2, "images_held_bytes": 2 * 8 * 8 * 3, "images_evicted": 1}
    by_count.notify(committed(reqs[0], defect=True))  # its image was pushed out: nothing to send
    assert asked.calls == []
    by_count.notify(committed(reqs[2], defect=True))
    assert len(asked.calls) == 1

    by_bytes = Escalation(WHEN, asked, max_bytes=2 * 16 * 16 * 3)
    for i in range(5):
        by_bytes.hold(request(i, side=16))
    assert by_bytes.status() == {"images_held": 2, "images_held_bytes": 2 * 16 * 16 * 3, "images_evicted": 3}


def test_a_crop_counts_the_whole_frame_it_keeps_alive() -> None:
    frame = np.zeros((100, 100, 3), np.uint8)
    assert pinned_bytes(frame[10:20, 10:20]) == frame.nbytes


def test_a_frame_the_local_queue_refuses_is_released_and_goes_to_offload_untagged() -> None:
    escalation = Escalation(WHEN, Asked())
    taken: list[InspectionRequest] = []

    class Router:
        engages_on_queue_full = True

        def route(self, camera: str, gate: Any) -> str | None:
            return None

        def take(self, req: InspectionRequest, reason: str) -> Future[Result]:
            taken.append(req)
            return Future()

        hold = escalation.hold
        release = escalation.release

    queue = InspectionQueue(1)
    queue.submit(request(0))  # full
    camera = cast(Camera, SimpleNamespace(name="cam"))
    schedule = CameraSchedule(camera, TriggerConfig(mode="on_demand"), None, queue, OpenGate(), offload=Router())
    schedule._submit(request(1), None)
    assert [r.offload_tag for r in taken] == [None] and escalation.status()["images_held"] == 0

    Router.engages_on_queue_full = False
    with pytest.raises(QueueFull):
        schedule._submit(request(2), None)
    assert escalation.status()["images_held"] == 0
