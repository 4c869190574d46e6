"""`--from-journal`: the reviewed results of a device's journal as a dataset, without an export.

The label is the technician's correction (or the model's verdict when it was confirmed); the image is
the kept evidence. The daemon may be running: SQLite WAL readers do not block it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from edge_runtime.config.schema import Config
from edge_runtime.core.errors import EdgeRuntimeError
from edge_runtime.core.result_filter import ResultFilter
from edge_runtime.evaluation.dataset import MAX_RECORDS, Dataset, LabelChecker, Record, records_from_rows
from edge_runtime.verdicts.evidence import EvidenceStore
from edge_runtime.verdicts.review import ReviewStore


def journal_dataset(config: Config, schema: dict[str, Any], camera: str | None = None,
                    limit: int | None = None) -> Dataset:
    db_path = config.journal_path()
    if not db_path.is_file():
        raise EdgeRuntimeError(f"{db_path}: no journal here yet (check data_dir / journal.path)")
    store = ReviewStore(db_path)
    evidence = EvidenceStore(config.evidence, config.evidence.path or config.data_dir / "evidence", db_path)
    cap = min(limit, MAX_RECORDS) if limit else MAX_RECORDS
    try:
        def rows() -> Iterator[tuple[str, Record]]:
            for row in store.iterate(ResultFilter(camera=camera, review="reviewed")):
                review = row.get("review") or {}
                label = review.get("correction") if review.get("state") == "corrected" else row.get("verdict")
                found = evidence.lookup(row["id"])
                where = f"journal result {row['id']}"
                if found is None:
                    yield where, ("missing_image", "no evidence image kept (see evidence.keep_passes)")
                    continue
                yield where, {"id": row["id"], "image": str(found.path), "label": label}

        return records_from_rows(rows(), LabelChecker(schema), cap, "journal")
    finally:
        evidence.close()
        store.close()
