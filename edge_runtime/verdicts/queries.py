"""The journaled verdicts as api/ reads and reviews them: the `DeviceResults` and `DeviceReview` roles
of `core/device.py`, answered from the journal, the evidence store and the review store."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from edge_runtime.core.device import EvidenceFile
from edge_runtime.core.result import utc_now
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
        stat; lists and exports stat too, but leave the mark to this read: `_as_on_disk`). A mark that
        could not be written (the journal busy) is still said in this answer; the next read writes it."""
        result = self.journal.get(result_id)
        evidence = result.get("evidence") if result is not None else None
        if result is None or not (isinstance(evidence, dict) and evidence.get("uri")):
            return result
        removal = self.verdicts.evidence_removal(result_id)
        if removal is None:
            return result
        again = self.journal.get(result_id)
        marked = again.get("evidence") if again is not None else None
        if again is not None and isinstance(marked, dict) and marked.get("removed"):
            return again
        return {**result, "evidence": {**evidence, "uri": None, "removed": removal}}

    def query_results(self, camera: str | None = None, since: str | None = None, until: str | None = None,
                      limit: int = 50, before_seq: int | None = None) -> list[dict[str, Any]]:
        return [self._as_on_disk(r) for r in self.journal.query(camera, since, until, limit, before_seq)]

    def query_inspections(self, f: ResultFilter) -> tuple[list[dict[str, Any]], int | None]:
        rows, cursor = self.verdicts.reviews.query(f)
        return [self._as_on_disk(r) for r in rows], cursor

    def iterate_inspections(self, f: ResultFilter) -> Iterator[dict[str, Any]]:
        return (self._as_on_disk(r) for r in self.verdicts.reviews.iterate(f))

    def _as_on_disk(self, row: dict[str, Any]) -> dict[str, Any]:
        """A listed or exported result whose linked image is not on disk now says so as a read of the result
        does (`uri: null`, `removed: {at, why: missing}`): one stat per row with a link, and nothing written. A
        page holds up to 1000 rows and an export the whole journal, and marking takes SQLite's write lock (up to
        1 s each): the mark is left to a read of that result, its image route, or retention."""
        evidence = row.get("evidence")
        store = self.verdicts.evidence
        if store is None or not (isinstance(evidence, dict) and evidence.get("uri")) or not store.link_broken(evidence):
            return row
        return {**row, "evidence": {**evidence, "uri": None, "removed": {"at": utc_now(), "why": "missing"}}}

    def evidence_file(self, result_id: str, thumbnail: bool = False) -> EvidenceFile | None:
        return self.verdicts.evidence_file(result_id, thumbnail)

    def verdict_error(self, verdict: dict[str, Any]) -> tuple[str, str] | None:
        errors = sorted(self.model().validator.iter_errors(verdict), key=str)
        return (errors[0].message, "".join(f".{p}" for p in errors[0].absolute_path)) if errors else None

    def review_result(self, result: dict[str, Any], action: str, correction: dict[str, Any] | None,
                      note: str | None) -> dict[str, Any]:
        return self.verdicts.reviews.write(result, action, correction, note)
