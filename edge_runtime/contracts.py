"""Types shared across layers: the governor's gate, a batched inspection job, and the `Device`.

No engine imports here (no ONNX Runtime, llama.cpp, OpenCV, paho, Flask): every layer may import
this module, so it must stay cheap and must not import any sibling but `config` and `result`.
`Device` is what the HTTP layer and the MQTT commands depend on; `app.Daemon` implements it
(mypy checks that in `app.py`), so they never reach into the daemon's insides.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from .config import Config
from .errors import EdgeRuntimeError
from .result import Result

T = TypeVar("T")


class CommandError(Exception):
    """A remote command's payload is wrong; the message goes back in the MQTT error reply."""


class QueueFull(EdgeRuntimeError):
    """The inspection queue is full; retry later (the API answers 429 with Retry-After)."""


class UnknownCamera(EdgeRuntimeError):
    """No camera of that name is configured."""


@dataclass(frozen=True)
class GateDecision:
    """What the governor allows now: a rate factor (1 = configured rate) or a pause."""

    rate_factor: float = 1.0
    paused: bool = False
    state: dict[str, Any] | None = None


class Gate(Protocol):
    def decision(self) -> GateDecision: ...


class OpenGate:
    """No governor: always full rate."""

    def decision(self) -> GateDecision:
        return GateDecision()


@dataclass
class Encoded:
    """The output of the first half: image embeddings plus what the Result needs of the frame."""

    embeds: np.ndarray  # [T*N, D]: N embeddings per tile, T tiles (1 unless the bundle tiles)
    width: int
    height: int
    preprocess_ms: float
    encode_ms: float
    grid: tuple[int, int] = (0, 0)  # tile rows, cols; (0, 0) for one untiled image


@dataclass
class BatchJob:
    """One frame of a batched inspection: already encoded, plus what its Result records."""

    encoded: Encoded
    camera: str
    prompt: str | None = None
    seq: int = 0
    capture_ms: float = 0.0
    governor: dict[str, Any] | None = None


@dataclass(frozen=True)
class ModelInfo:
    """The loaded model as clients see it (`/v1/models`, `/readyz`, the status page)."""

    name: str  # the bundle's manifest name: the OpenAI model id
    model_name: str  # name plus version, as Results record it
    ready: bool
    max_tokens: int
    context_size: int
    verdict_schema: dict[str, Any]  # the JSON schema every verdict (and a reviewer's correction) follows


ResultListener = Callable[[Result], None]


class Device(Protocol):
    """The running device as the HTTP API and the MQTT commands see it (implemented by `app.Daemon`).

    Methods that queue work raise `scheduler.QueueFull` when the queue is full, `UnknownCamera`
    for a camera that is not configured and `StorageFull` when the journal refuses results.
    """

    @property
    def config(self) -> Config: ...

    @property
    def started(self) -> float: ...  # time.time() at construction

    def status(self) -> dict[str, Any]: ...

    def health(self) -> dict[str, Any]: ...  # cheap: no journal query

    def alive(self) -> bool: ...

    def camera_names(self) -> list[str]: ...

    def model_info(self) -> ModelInfo | None: ...  # None until the model is loaded

    def get_result(self, result_id: str) -> dict[str, Any] | None: ...

    def query_results(self, camera: str | None = None, since: str | None = None, until: str | None = None,
                      limit: int = 50, before_seq: int | None = None) -> list[dict[str, Any]]: ...

    def latest_jpeg(self, camera: str) -> bytes | None: ...

    def trigger(self, camera: str, prompt: str | None = None) -> Future[Result]: ...

    def submit_image(self, image: np.ndarray, prompt: str | None = None, camera: str = "api",
                     journal: bool = False) -> Future[Result]: ...

    def submit_job(self, job: Callable[[Any], T]) -> Future[T]: ...  # runs with the inspector (chat)

    def reload(self) -> dict[str, Any]: ...

    def subscribe(self, listener: ResultListener) -> None: ...  # every Result after it is journaled
