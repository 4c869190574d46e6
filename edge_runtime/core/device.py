"""The `Device` role protocols: what the HTTP layer and the MQTT commands see of the running daemon.

No engine imports here: `api/` and `delivery/mqtt/commands.py` depend on these roles only, handed to
them as one `DeviceRoles` whose fields are the parts that answer each role (built in `app/daemon.py`),
so they never reach into the daemon's insides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from edge_runtime.core.errors import InputError
from edge_runtime.core.result import Result
from edge_runtime.core.result_filter import ResultFilter

if TYPE_CHECKING:
    from edge_runtime.config import Config

T = TypeVar("T")


@dataclass(frozen=True)
class ModelInfo:
    """The loaded model as clients see it (`/v1/models`, `/readyz`, the status page)."""

    name: str  # the bundle's manifest name: the OpenAI model id
    model_name: str  # name plus version, as Results record it
    ready: bool
    max_tokens: int
    context_size: int
    verdict_schema: dict[str, Any]  # the JSON schema every verdict (and a reviewer's correction) follows
    several_images: bool = False  # a prompt may hold several images (a GGUF + mmproj bundle)


@dataclass(frozen=True)
class ChatJob:
    """One chat completion as the API asks it of the device (already bounded and validated)."""

    prompt: str  # the conversation, laid into the bundle's prompt slot
    system: str | None = None
    image: np.ndarray | None = None  # decoded, within images.max_pixels
    grammar: str | None = None  # from `Device.constraint`; None: free text
    max_tokens: int = 0  # 0: the model's default
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int = 0
    stops: list[str] = field(default_factory=list)
    on_text: Callable[[str], None] | None = None  # each decoded piece, as it is generated (streaming)
    on_end: Callable[[], None] | None = None  # once the job ran, whatever happened (ends a stream)
    more_images: list[np.ndarray] = field(default_factory=list)  # the request's further images, in order
    # Where each image goes in `prompt` (an offset per image, ascending) when they sit among its text;
    # empty: all at the template's image slot.
    image_at: tuple[int, ...] = ()
    # Each image's field in the request, in order (the API's `messages.<i>.content.<j>.image_url.url`): a
    # refused image is named by its own part, not as `image`.
    image_fields: tuple[str, ...] = ()
    # The request's field that set max_tokens (max_tokens or max_completion_tokens); None: the client set
    # neither (the model's default): a refusal for the answer's room names it, or `messages` (naming_answer).
    max_tokens_field: str | None = "max_tokens"

    def image_refused(self, exc: InputError, i: int) -> InputError:
        """`exc`, an image's refusal naming `image`, naming this job's i-th image's field instead."""
        if exc.field != "image" or i >= len(self.image_fields):
            return exc
        name = self.image_fields[i]
        return InputError(f"{name}: {str(exc).removeprefix('image: ')}", field=name, status=exc.status)


class ChatOutput(Protocol):
    """What a finished chat job returns (the language model's Generation)."""

    @property
    def text(self) -> str: ...

    @property
    def finish_reason(self) -> str: ...  # "stop" or "length"

    @property
    def tokens(self) -> int: ...

    @property
    def prompt_tokens(self) -> int: ...


@dataclass(frozen=True)
class EvidenceFile:
    """A kept evidence image (or its thumbnail) on disk; retention may delete it at any time."""

    path: Path
    etag: str  # content-addressed: the image's sha256 (plus "-t" for a thumbnail)


class DeviceStatus(Protocol):
    """What the device is and how it is doing: the status page, health probes, metrics, telemetry."""

    @property
    def config(self) -> Config: ...

    @property
    def started(self) -> float: ...  # time.time() at construction

    def status(self) -> dict[str, Any]: ...

    def health(self) -> dict[str, Any]: ...  # cheap: no journal query

    def alive(self) -> bool: ...

    def camera_names(self) -> list[str]: ...

    def model_info(self) -> ModelInfo | None: ...  # None until the model is loaded

    def verdict_status(self) -> dict[str, Any] | None: ...  # rules, evidence, webhooks, reviews (metrics)


class DeviceResults(Protocol):
    """The journaled verdicts: one result, filtered queries, exports, evidence images."""

    def get_result(self, result_id: str) -> dict[str, Any] | None: ...

    def query_results(self, camera: str | None = None, since: str | None = None, until: str | None = None,
                      limit: int = 50, before_seq: int | None = None) -> list[dict[str, Any]]: ...

    def query_inspections(self, f: ResultFilter) -> tuple[list[dict[str, Any]], int | None]: ...

    def iterate_inspections(self, f: ResultFilter) -> Iterator[dict[str, Any]]: ...  # every match, for exports

    def evidence_file(self, result_id: str, thumbnail: bool = False) -> EvidenceFile | None:
        """The kept image of a result, None if none was kept; OSError if retention just deleted it."""
        ...


class DeviceCameras(Protocol):
    """The cameras: their newest frame and an inspection on demand (`UnknownCamera`, `QueueFull`)."""

    def latest_jpeg(self, camera: str) -> bytes | None: ...

    def trigger(self, camera: str, prompt: str | None = None) -> Future[Result]: ...


class DeviceInference(Protocol):
    """The one loaded model, in turn with the cameras through the one bounded queue (`QueueFull`)."""

    def submit_image(self, image: np.ndarray, prompt: str | None = None, camera: str = "api",
                     journal: bool = False) -> Future[Result]: ...

    def submit_job(self, job: Callable[[Any], T]) -> Future[T]: ...  # runs with the inspector (chat)

    def constraint(self, schema: dict[str, Any]) -> str:
        """The JSON schema as a grammar for `ChatJob.grammar`; `InputError` over the complexity budget,
        any other exception for a schema the converter cannot take."""
        ...

    def chat(self, job: ChatJob) -> Future[ChatOutput]: ...  # the OpenAI endpoint


class DeviceReview(Protocol):
    """A technician's review of a verdict, checked against the bundle's schema."""

    def verdict_error(self, verdict: dict[str, Any]) -> tuple[str, str] | None:
        """(message, dotted path) of the first way `verdict` breaks the bundle's schema, None if valid.
        Raises EdgeRuntimeError while no model is loaded."""
        ...

    def review_result(self, result: dict[str, Any], action: str, correction: dict[str, Any] | None,
                      note: str | None) -> dict[str, Any]: ...  # ReviewError for a wrong action or note


class DeviceControl(Protocol):
    def reload(self) -> dict[str, Any]: ...  # re-read the config file; what changed and what needs a restart


class Device(DeviceStatus, DeviceResults, DeviceCameras, DeviceInference, DeviceReview, DeviceControl, Protocol):
    """Every role in one object (a test's fake device: `DeviceRoles.of(fake)`).

    Consumers depend on the roles they use, as vLLM's `EngineClient` keeps a client to the engine
    alone: the metrics on `DeviceStatus`, the review blueprint on results + review, the OpenAI
    endpoint on `DeviceInference`. Methods that queue work raise `QueueFull` when the queue is full,
    `UnknownCamera` for a camera that is not configured and `StorageFull` when the journal refuses results.
    """


@dataclass(frozen=True)
class DeviceRoles:
    """The running device handed to `api/` and the MQTT commands: one typed collaborator per role (as
    Home Assistant's typed `runtime_data`), each the part that answers it (`app/daemon.py` says which)."""

    status: DeviceStatus
    results: DeviceResults
    cameras: DeviceCameras
    inference: DeviceInference
    review: DeviceReview
    control: DeviceControl

    @classmethod
    def of(cls, device: Device) -> DeviceRoles:
        """One object answering every role (a test's fake device)."""
        return cls(device, device, device, device, device, device)
