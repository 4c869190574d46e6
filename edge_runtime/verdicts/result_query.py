"""The one query over the journal's results, behind `/api/v1/results`, `/api/v1/inspections`, the
exports and the review queue: a `ResultFilter` becomes one parameterised SELECT, newest first."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from edge_runtime.core.result_filter import ResultFilter


def select_results(db: sqlite3.Connection, f: ResultFilter) -> tuple[list[dict[str, Any]], int | None]:
    """The matching rows (each with its `journal_seq`) and the cursor of the next page (None on the
    last). The caller holds the connection's lock and has bounded `f` (`ResultFilter.check`)."""
    where, args = _where(f)
    sql = "SELECT seq, body FROM results"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY seq DESC LIMIT ?"
    rows = db.execute(sql, [*args, f.limit]).fetchall()
    out = [{**json.loads(body), "journal_seq": seq} for seq, body in rows]
    return out, (rows[-1][0] if len(rows) == f.limit else None)


def _where(f: ResultFilter) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    args: list[Any] = []
    if f.camera:
        where.append("camera = ?")
        args.append(f.camera)
    if f.defect is not None:
        where.append(f"json_extract(body, '$.verdict.{f.defect_field}') IS {'1' if f.defect else 'NOT 1'}")
    if f.category:
        where.append("json_extract(body, '$.verdict.category') = ?")
        args.append(f.category)
    if f.since:
        where.append("ts >= ?")
        args.append(f.since)
    if f.until:
        where.append("ts < ?")
        args.append(f.until)
    if f.below is not None:
        where.append("json_extract(body, '$.verdict.confidence') < ?")
        args.append(f.below)
    if f.review == "none":
        where.append("json_extract(body, '$.review.state') IS NULL")
    elif f.review == "reviewed":
        where.append("json_extract(body, '$.review.state') IN ('confirmed', 'corrected')")
    elif f.review:
        where.append("json_extract(body, '$.review.state') = ?")
        args.append(f.review)
    if f.before is not None:
        where.append("seq < ?")
        args.append(f.before)
    if f.after is not None:
        where.append("seq > ?")
        args.append(f.after)
    return where, args
