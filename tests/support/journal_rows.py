"""A journal filled with many delivered results in one transaction, for tests that need a large journal
(query floods, exports, slow readers) without inspecting that many frames."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

from edge_runtime.core.result import FrameInfo, Result


def fill_journal(path: Path, rows: int, verdict: dict[str, Any] | None = None) -> None:
    """Insert `rows` sent results of camera `belt` (one a second, the last one now) into the journal at `path`."""
    template = Result(device="d", camera="belt", frame=FrameInfo(0, 10, 10), verdict=verdict or {"defect": False},
                      text="{}", model="m@1", timings_ms={"total": 1.0}, prompt="p").to_dict()
    values = []
    for i in range(rows):
        body = dict(template, id=uuid.uuid4().hex)
        values.append((body["id"], body["ts"], time.time() - rows + i, "belt", json.dumps(body), 1))
    with sqlite3.connect(path, timeout=30) as db:
        db.executemany("INSERT INTO results (id, ts, created, camera, body, sent) VALUES (?, ?, ?, ?, ?, ?)", values)
