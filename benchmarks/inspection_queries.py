"""How fast the inspection queries are on a large journal: 100 000 results, 2 % defects, 100 pending
reviews, four cameras.

    python benchmarks/inspection_queries.py [--results 100000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_runtime.verdicts.journal import Journal
from edge_runtime.verdicts.review import ResultFilter, ReviewStore


def fill(path: Path, n: int) -> ReviewStore:
    journal = Journal(path)
    rows = []
    for i in range(n):
        ts = f"2026-11-30T{(i // 3600) % 24:02d}:{(i // 60) % 60:02d}:{i % 60:02d}.000Z"
        body = {"id": f"r{i}", "camera": f"cam{i % 4}", "ts": ts, "text": "t" * 120, "model": "m",
                "verdict": {"defect": i % 50 == 0, "category": "scratch" if i % 50 == 0 else "none",
                            "confidence": (i % 100) / 100, "notes": "x" * 40},
                "timings_ms": {"total": 80.0}, "prompt": "p", "evidence": None, "rules": None,
                "review": {"state": "pending"} if i % 1000 == 0 else None}
        rows.append((f"r{i}", ts, time.time(), body["camera"], json.dumps(body)))
    with journal._db:  # one transaction: the journal's own add() fsyncs every row
        journal._db.execute("BEGIN")
        journal._db.executemany("INSERT INTO results (id, ts, created, camera, body) VALUES (?, ?, ?, ?, ?)", rows)
    journal.close()
    store = ReviewStore(path)
    for i in range(0, n, 1000):
        store.mark_pending(f"r{i}", "rule", patch=False)
    return store


def timed(name: str, fn: Callable[[], Any], n: int = 5) -> None:
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t0) * 1000)
    print(f"{name}: {statistics.median(xs):.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", type=int, default=100_000, help="journal size (the figures are for 100 000)")
    n = ap.parse_args().results
    with tempfile.TemporaryDirectory() as tmp:
        s = fill(Path(tmp) / "j.sqlite3", n)
        timed("newest 50, no filter", lambda: s.query(ResultFilter()))
        timed("defect=true, 50", lambda: s.query(ResultFilter(defect=True)))
        timed("camera=cam1 defect=true (no match: scan)", lambda: s.query(ResultFilter(camera="cam1", defect=True)))
        timed("review=pending, 50 (100 matches in 100k)", lambda: s.query(ResultFilter(review="pending")))
        timed("review=pending after=newest (the page's poll)", lambda: s.query(ResultFilter(review="pending",
                                                                                          after=n - 10)))
        timed("review counts (status)", s.counts)
        timed("export all defects (2000 rows)", lambda: sum(1 for _ in s.iterate(ResultFilter(defect=True))), n=2)
        s.close()


if __name__ == "__main__":
    main()
