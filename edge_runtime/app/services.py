"""The chat, evidence and review half of `core.device.Device`, for `app.Daemon` (kept apart so the
composition root stays small): each method delegates to the service that owns the data."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from edge_runtime.core.device import ChatJob, ChatOutput, EvidenceFile
from edge_runtime.core.inspection_queue import InspectionQueue, InspectionRequest
from edge_runtime.core.result_filter import ResultFilter
from edge_runtime.inference.inspector import Inspector
from edge_runtime.verdicts.stage import VerdictServices

T = TypeVar("T")


class ServicesHost(Protocol):
    """What the mixin needs of the class it is mixed into (`app.Daemon`); mypy checks each use."""

    verdicts: VerdictServices
    inspections: InspectionQueue

    def submit_job(self, job: Callable[[Any], T]) -> Future[T]: ...

    def _current_inspector(self) -> Inspector: ...


class DeviceServices:
    """Mixed into `app.Daemon`: the chat, evidence and review methods of `core.device.Device`."""

    def constraint(self: ServicesHost, schema: dict[str, Any]) -> str:
        return self._current_inspector().constraint(schema)

    def chat(self: ServicesHost, job: ChatJob) -> Future[ChatOutput]:
        """Queue a chat completion: the worker generates it in the same batched decode as the cameras'
        verdicts and other chats (its image encoded ahead like a frame). Raises QueueFull."""
        future: Future[ChatOutput] = self.inspections.submit(InspectionRequest(
            job.image, "openai", journal=False, chat=job))
        if job.on_end is not None:
            on_end = job.on_end
            # Whatever settles it (its generation, a failure, the daemon stopping): the stream ends.
            future.add_done_callback(lambda _future: on_end())
        return future

    # ---- evidence and review (VerdictServices) -------------------------------------------------

    def verdict_status(self: ServicesHost) -> dict[str, Any] | None:
        return self.verdicts.status()

    def evidence_file(self: ServicesHost, result_id: str, thumbnail: bool = False) -> EvidenceFile | None:
        store = self.verdicts.evidence
        found = store.lookup(result_id) if store is not None else None
        if store is None or found is None:
            return None
        return EvidenceFile(store.thumbnail(found), found.sha256 + "-t") if thumbnail else \
            EvidenceFile(found.path, found.sha256)

    def query_inspections(self: ServicesHost, f: ResultFilter) -> tuple[list[dict[str, Any]], int | None]:
        return self.verdicts.reviews.query(f)

    def iterate_inspections(self: ServicesHost, f: ResultFilter) -> Iterator[dict[str, Any]]:
        return self.verdicts.reviews.iterate(f)

    def verdict_error(self: ServicesHost, verdict: dict[str, Any]) -> tuple[str, str] | None:
        errors = sorted(self._current_inspector().validator.iter_errors(verdict), key=str)
        return (errors[0].message, "".join(f".{p}" for p in errors[0].absolute_path)) if errors else None

    def review_result(self: ServicesHost, result: dict[str, Any], action: str, correction: dict[str, Any] | None,
                      note: str | None) -> dict[str, Any]:
        return self.verdicts.reviews.write(result, action, correction, note)
