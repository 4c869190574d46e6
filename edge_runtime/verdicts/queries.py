"""The journaled verdicts as api/ reads and reviews them: the `DeviceResults` and `DeviceReview` roles
of `core/device.py`, answered from the journal, the evidence store and the review store."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from edge_runtime.core.device import EvidenceFile
from edge_runtime.core.result_filter import ResultFilter
from edge_runtime.verdicts.journal import Journal
from edge_runtime.verdicts.stage import VerdictServices


class _SchemaError(Protocol):
    @property
    def message(self) -> str: ...

    @property
    def absolute_path(self) -> Iterable[str | int]: ...


class _Validator(Protocol):
    def iter_errors(self, instance: Any) -> Iterable[_SchemaError]: ...


class SchemaHolder(Protocol):
    """The loaded model as a review reads it (`inference/inspector.py:Inspector`): its verdict schema."""

    @property
    def validator(self) -> _Validator: ...


class VerdictQueries:
    """One result, filtered queries, exports, evidence images and reviews; `model` raises
    EdgeRuntimeError while no model is loaded (a correction is checked against its schema)."""

    def __init__(self, journal: Journal, verdicts: VerdictServices, model: Callable[[], SchemaHolder]) -> None:
        self.journal = journal
        self.verdicts = verdicts
        self.model = model

    def get_result(self, result_id: str) -> dict[str, Any] | None:
        """The journaled result; a link to an image found missing now is marked removed first (one
        stat: lists and exports rely on the marks retention and the image route leave)."""
        result = self.journal.get(result_id)
        evidence = result.get("evidence") if result is not None else None
        if isinstance(evidence, dict) and evidence.get("uri") and self.verdicts.evidence_gone(result_id):
            result = self.journal.get(result_id)
        return result

    def query_results(self, camera: str | None = None, since: str | None = None, until: str | None = None,
                      limit: int = 50, before_seq: int | None = None) -> list[dict[str, Any]]:
        return self.journal.query(camera, since, until, limit, before_seq)

    def query_inspections(self, f: ResultFilter) -> tuple[list[dict[str, Any]], int | None]:
        return self.verdicts.reviews.query(f)

    def iterate_inspections(self, f: ResultFilter) -> Iterator[dict[str, Any]]:
        return self.verdicts.reviews.iterate(f)

    def evidence_file(self, result_id: str, thumbnail: bool = False) -> EvidenceFile | None:
        return self.verdicts.evidence_file(result_id, thumbnail)

    def verdict_error(self, verdict: dict[str, Any]) -> tuple[str, str] | None:
        errors = sorted(self.model().validator.iter_errors(verdict), key=str)
        return (errors[0].message, "".join(f".{p}" for p in errors[0].absolute_path)) if errors else None

    def review_result(self, result: dict[str, Any], action: str, correction: dict[str, Any] | None,
                      note: str | None) -> dict[str, Any]:
        return self.verdicts.reviews.write(result, action, correction, note)
