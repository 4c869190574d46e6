"""Where inspections enter besides the camera schedules: the `DeviceCameras` and `DeviceInference` roles
of `core/device.py` (a camera's newest frame, an inspection of it now, an uploaded image, a job or a
chat completion in the model's turn), every one through the one bounded queue (`QueueFull` when full).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

import numpy as np

from edge_runtime.capture.rig import CameraRig
from edge_runtime.config import Config
from edge_runtime.core.device import ChatJob, ChatOutput
from edge_runtime.core.errors import EdgeRuntimeError, StorageFull, UnknownCamera
from edge_runtime.core.inspection_queue import InspectionQueue, InspectionRequest
from edge_runtime.core.result import Result
from edge_runtime.core.sink import ResultJournal

T = TypeVar("T")


class RunningCameras(Protocol):
    """What a reload replaces, as the entry points read it (`app/running.py:Running`)."""

    @property
    def config(self) -> Config: ...

    @property
    def rigs(self) -> dict[str, CameraRig]: ...


class Constraining(Protocol):
    """The loaded model's grammar for a JSON schema (`inference/inspector.py:Inspector.constraint`)."""

    def constraint(self, schema: dict[str, Any]) -> str: ...


class EntryPoints:
    """The cameras and the inference queue as `api/` and the MQTT commands see them. `model` raises
    EdgeRuntimeError while no model is loaded."""

    def __init__(self, running: RunningCameras, inspections: InspectionQueue, journal: ResultJournal,
                 model: Callable[[], Constraining]) -> None:
        self.running = running
        self.inspections = inspections
        self.journal = journal
        self.model = model

    def trigger(self, camera: str, prompt: str | None = None) -> Future[Result]:
        """Inspect a camera's newest frame now (any trigger mode). Raises QueueFull or UnknownCamera."""
        rig = self.running.rigs.get(camera)
        if rig is None:
            raise UnknownCamera(f"no camera named {camera!r}")
        if self.journal.refusing():
            raise StorageFull("disk full: the journal cannot store results; free space on the device")
        frame = rig.camera.slot.peek()
        if frame is None:
            raise EdgeRuntimeError(f"camera {camera!r} has no frame yet (state: {rig.camera.state.value})")
        return self.inspections.submit(InspectionRequest(
            frame.image, camera, prompt or rig.cfg.prompt, frame.seq, frame.capture_ms, "trigger"))

    def latest_jpeg(self, camera: str) -> bytes | None:
        rig = self.running.rigs.get(camera)
        if rig is None:
            raise UnknownCamera(f"no camera named {camera!r}")
        return rig.latest_jpeg(self.running.config.inspection.jpeg_quality)

    def submit_image(self, image: np.ndarray, prompt: str | None = None, camera: str = "api",
                     journal: bool = False) -> Future[Result]:
        """Inspect an uploaded image through the shared queue. Raises QueueFull."""
        return self.inspections.submit(InspectionRequest(image, camera, prompt, journal=journal))

    def submit_job(self, job: Callable[[Any], T]) -> Future[T]:
        """Run `job(inspector)` in the worker, in turn with inspections. Raises QueueFull."""
        return self.inspections.submit(InspectionRequest(None, "openai", journal=False, job=job))

    def constraint(self, schema: dict[str, Any]) -> str:
        return self.model().constraint(schema)

    def chat(self, job: ChatJob) -> Future[ChatOutput]:
        """Queue a chat completion: the worker generates it in the same batched decode as the cameras'
        verdicts and other chats (its image encoded ahead like a frame). Raises QueueFull."""
        future: Future[ChatOutput] = self.inspections.submit(InspectionRequest(
            job.image, "openai", journal=False, chat=job))
        if job.on_end is not None:
            on_end = job.on_end
            # Whatever settles it (its generation, a failure, the daemon stopping): the stream ends.
            future.add_done_callback(lambda _future: on_end())
        return future
