"""Second opinions as a sink: a committed local verdict that matches `offload.escalate.when` sends its
frame to the central server (docs/scale-out.md).

A committed `Result` does not carry its image, so the camera schedule hands each local request here
first (`hold`): its image is kept under a tag that travels on the request (`InspectionRequest.
offload_tag`) and comes back on the result (`verdicts/pipeline.py` copies it, as a line job's tag).
`notify` takes the image back by that tag. The images wait in a ring bounded by count and bytes
(MAX_HELD frames, `offload.escalate.max_held_mb`: `from_config`): a verdict that never
comes (the inspection failed, the journal refused it) leaves its image behind until newer ones push
it out, counted in `evicted`; the memory stays bounded either way.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_runtime.config.offload import OffloadConfig
from edge_runtime.core.inspection_queue import InspectionRequest
from edge_runtime.core.result import Result
from edge_runtime.core.sink import SinkHealth

MAX_HELD = 64  # frames in flight locally: the queue, the batch, one encoding ahead per camera
MAX_HELD_BYTES = 64 * 1024 * 1024  # what the held images pin (a crop pins its whole frame)

SecondOpinion = Callable[[Result, np.ndarray, str | None], Future[Result]]  # Offloader.second_opinion


def matches(verdict: dict[str, Any], when: dict[str, Any]) -> bool:
    """Every listed top-level field equals its value (true is not 1 here, as in JSON)."""
    return all(k in verdict and isinstance(verdict[k], bool) == isinstance(v, bool) and verdict[k] == v
               for k, v in when.items())


def pinned_bytes(image: np.ndarray) -> int:
    """The bytes an image keeps alive: a view (an ROI crop) keeps the array it was cut from."""
    root = image
    while isinstance(root.base, np.ndarray):
        root = root.base
    return int(root.nbytes)


@dataclass(frozen=True)
class _Held:
    image: np.ndarray
    prompt: str | None
    size: int


class Escalation:
    """The `Sink` (core/sink.py) that asks `second_opinion(result, image, prompt)` for matching verdicts."""

    name = "escalation"

    def __init__(self, when: dict[str, Any], second_opinion: SecondOpinion, *, max_held: int = MAX_HELD,
                 max_bytes: int = MAX_HELD_BYTES) -> None:
        self.when = when
        self.second_opinion = second_opinion
        self.max_held = max(1, max_held)
        self.max_bytes = max_bytes
        self._held: OrderedDict[int, _Held] = OrderedDict()  # tag -> image, oldest first
        self._bytes = 0
        self._tags = itertools.count(1)
        self._lock = threading.Lock()
        self.evicted = 0  # images pushed out before their verdict was committed

    @classmethod
    def from_config(cls, cfg: OffloadConfig, second_opinion: SecondOpinion) -> Escalation:
        """Bounded by the config's `offload.escalate.max_held_mb` and by MAX_HELD frames. Not by
        `offload.queue_size`: the held frames wait in the local pipeline (its queue, its batch, an
        encoding ahead per camera), which holds more than a small offload queue. Needs `cfg.escalate`."""
        if cfg.escalate is None:
            raise ValueError("offload.escalate is not set")
        return cls(cfg.escalate.when, second_opinion, max_held=MAX_HELD,
                   max_bytes=cfg.escalate.max_held_mb * 1024 * 1024)

    def hold(self, request: InspectionRequest) -> None:
        """Keep the image of a local request that may escalate; tags the request. Never blocks."""
        if request.image is None:
            return
        held = _Held(request.image, request.prompt, pinned_bytes(request.image))
        with self._lock:
            tag = next(self._tags)
            self._held[tag] = held
            self._bytes += held.size
            while len(self._held) > 1 and (len(self._held) > self.max_held or self._bytes > self.max_bytes):
                _, old = self._held.popitem(last=False)
                self._bytes -= old.size
                self.evicted += 1
        request.offload_tag = tag

    def release(self, request: InspectionRequest) -> None:
        """The local queue refused the request: forget its image (it is not inspected here)."""
        if request.offload_tag is not None:
            self._take(request.offload_tag)
            request.offload_tag = None

    def _take(self, tag: int) -> _Held | None:
        with self._lock:
            held = self._held.pop(tag, None)
            if held is not None:
                self._bytes -= held.size
            return held

    # ---- the Sink --------------------------------------------------------------------------------

    def notify(self, result: Result) -> None:
        """A committed result: if it is a held request's, ask for a second opinion when it matches.
        `second_opinion` only queues (a full queue refuses at once), so this never blocks."""
        if result.offload_tag is None:
            return  # not a held request's (an API image, a line job, a remote answer)
        held = self._take(result.offload_tag)
        if held is not None and matches(result.verdict, self.when):
            self.second_opinion(result, held.image, held.prompt)

    def start(self) -> None:
        return None

    def stop(self) -> None:
        with self._lock:
            self._held.clear()
            self._bytes = 0

    def health(self) -> SinkHealth:
        """Always ok: a missing second opinion leaves the local verdict standing (offload's own faults
        degrade the device through its status)."""
        return SinkHealth(True, counters=self.status())

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"images_held": len(self._held), "images_held_bytes": self._bytes, "images_evicted": self.evicted}
