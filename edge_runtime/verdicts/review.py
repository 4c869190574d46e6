"""Review: corrections stored beside the results, the filtered result query, and dataset export.

A review is a row in `reviews` (history) and the `review` field of the journaled result (so every
reader of the result sees it). Confirm keeps the model's verdict as the label; correct stores the
technician's verdict, validated against the bundle's schema. `export_dataset` writes what fine-tuning
tools read: Hugging Face's `imagefolder` layout (`train/<file>.jpg` + `train/metadata.jsonl`).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edge_runtime.core.errors import StorageFull
from edge_runtime.core.result import utc_now
from edge_runtime.core.result_filter import ResultFilter, ReviewError
from edge_runtime.verdicts.database import is_full, open_db
from edge_runtime.verdicts.messages import MAX_PAYLOAD, MessageQueue
from edge_runtime.verdicts.result_query import select_results

_SCHEMA = """
CREATE TABLE IF NOT EXISTS reviews (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    result_id  TEXT NOT NULL,
    state      TEXT NOT NULL,              -- pending | confirmed | corrected
    correction TEXT,                       -- the corrected verdict (JSON), when corrected
    note       TEXT,
    reason     TEXT,                       -- pending: why it was queued (rule name, low confidence)
    ts         TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS reviews_result ON reviews (result_id, seq);
"""
class ReviewStore:
    """Writes reviews and answers result queries, on its own connection to the journal's file."""

    def __init__(self, db_path: Path, messages: MessageQueue | None = None) -> None:
        self.messages = messages
        self._lock = threading.Lock()
        self._db = open_db(db_path, _SCHEMA)
        # Queries scan the journal (a filter on a verdict field reads every row): on a connection of their
        # own, so the writes and the status counts above never wait behind one (WAL: readers don't block).
        self._read_lock = threading.Lock()
        self._reader = open_db(db_path)
        self.written = 0

    # ---- writes ------------------------------------------------------------------------------------

    def mark_pending(self, result_id: str, reason: str, patch: bool = True) -> None:
        """Queue a journaled result for review (a rule's `review` action); `patch=False` when the
        journaled body already says so."""
        review = {"state": "pending", "reason": reason, "ts": utc_now()}
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self.stage_pending(self._db, result_id, reason, review["ts"])
            if patch:
                self._patch(result_id, review)

    @staticmethod
    def stage_pending(db: sqlite3.Connection, result_id: str, reason: str, ts: str) -> None:
        """The review-queue row of a result, inserted on `db` (the caller's transaction, e.g. the
        journal's, whose result body already says `review.state: pending`)."""
        db.execute("INSERT INTO reviews (result_id, state, reason, ts) VALUES (?, 'pending', ?, ?)",
                   (result_id, reason[:200], ts))

    def write(self, result: dict[str, Any], action: str, correction: dict[str, Any] | None = None,
              note: str | None = None, reviewer: str | None = None) -> dict[str, Any]:
        """Confirm or correct a result; returns its new `review` object and queues the MQTT message."""
        if action not in ("confirm", "correct"):
            raise ReviewError("action must be 'confirm' or 'correct'", "action")
        if action == "correct" and not isinstance(correction, dict):
            raise ReviewError("a correction needs 'verdict': the corrected verdict object", "verdict")
        if note is not None and (not isinstance(note, str) or len(note) > 500):
            raise ReviewError("note must be a string of at most 500 characters", "note")
        state = "confirmed" if action == "confirm" else "corrected"
        review: dict[str, Any] = {"state": state, "ts": utc_now(),
                                  "correction": correction if state == "corrected" else None}
        if note:
            review["note"] = note
        if reviewer:
            review["reviewer"] = reviewer
        message = json.dumps({"id": result["id"], "device": result.get("device"), "camera": result["camera"],
                              "ts": review["ts"], "verdict": result.get("verdict"), "review": review},
                             separators=(",", ":"), ensure_ascii=False)
        if len(message) > MAX_PAYLOAD:  # checked before anything is written: a 4xx, not half a review
            raise ReviewError(f"the review message would be over {MAX_PAYLOAD} bytes", "verdict")
        try:
            with self._lock, self._db:
                self._db.execute("BEGIN")
                self._db.execute("INSERT INTO reviews (result_id, state, correction, note, ts) VALUES (?, ?, ?, ?, ?)",
                                 (result["id"], state, json.dumps(correction) if correction else None, note,
                                  review["ts"]))
                self._patch(result["id"], review)
                if self.messages is not None:  # in the same transaction: a crash cannot keep one without the other
                    self.messages.stage(self._db, f"{result['camera']}/review", message)
        except sqlite3.OperationalError as exc:
            if not is_full(exc):
                raise
            # Rolled back whole; a fault of the device that heals when space returns (the API's 503).
            raise StorageFull(f"disk full: the review cannot be stored ({exc}); free space on the device") from None
        self.written += 1
        if self.messages is not None:
            self.messages.notify()
        return review

    def _patch(self, result_id: str, review: dict[str, Any]) -> None:
        self._db.execute("UPDATE results SET body = json_set(body, '$.review', json(?)) WHERE id = ?",
                         (json.dumps(review), result_id))

    # ---- reads -------------------------------------------------------------------------------------

    def query(self, f: ResultFilter) -> tuple[list[dict[str, Any]], int | None]:
        """Newest first; returns the rows and the cursor of the next page (None on the last)."""
        f.check()
        with self._read_lock:
            return select_results(self._reader, f)

    def iterate(self, f: ResultFilter, page: int = 500) -> Iterator[dict[str, Any]]:
        """Every matching row, page by page (exports stream this; memory stays one page)."""
        f.limit = page
        while True:
            rows, cursor = self.query(f)
            yield from rows
            if cursor is None:
                return
            f.before = cursor

    def history(self, result_id: str) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT state, correction, note, reason, ts FROM reviews WHERE result_id = ? "
                                    "ORDER BY seq", (result_id,)).fetchall()
        return [{"state": s, "correction": json.loads(c) if c else None, "note": n, "reason": r, "ts": t}
                for s, c, n, r, t in rows]

    def counts(self) -> dict[str, int]:
        """Results per review state (their latest review), from the small reviews table: status and
        metrics call this every few seconds, so it must not scan the journal."""
        with self._lock:
            rows = self._db.execute(
                "SELECT state, COUNT(*) FROM reviews r WHERE seq = (SELECT MAX(seq) FROM reviews "
                "WHERE result_id = r.result_id) GROUP BY state").fetchall()
        return {str(s): int(n) for s, n in rows}

    def apply_retention(self) -> None:
        """Reviews of results the journal's retention deleted go too."""
        with self._lock:
            self._db.execute("DELETE FROM reviews WHERE result_id NOT IN (SELECT id FROM results)")

    def close(self) -> None:
        with self._lock:
            self._db.close()
        with self._read_lock:
            self._reader.close()


# ---- dataset export ---------------------------------------------------------------------------------

MARKER = ".edge-runtime-export"  # the file that says a folder is one of our exports (may be replaced)


class ExportPathError(ValueError):
    """The output folder cannot be used (holds a link, is someone else's non-empty folder, ...)."""


def _check_target(out_dir: Path) -> bool:
    """Refuse a target that is or holds a symbolic link, or is a non-empty folder we did not write.
    Returns whether it exists (an earlier export, to be replaced) or not."""
    try:
        st = os.lstat(out_dir)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise ExportPathError(f"{out_dir}: is a symbolic link; give a real folder")
    if not stat.S_ISDIR(st.st_mode):
        raise ExportPathError(f"{out_dir}: exists and is not a folder")
    entries = os.listdir(out_dir)
    for root, dirs, files in os.walk(out_dir, followlinks=False):
        for name in dirs + files:
            if os.path.islink(os.path.join(root, name)):
                raise ExportPathError(f"{os.path.join(root, name)}: a symbolic link inside the output folder; "
                                      "refusing to export there")
    if entries and MARKER not in entries:
        raise ExportPathError(f"{out_dir}: not empty and not an earlier dataset export; give a new or empty folder")
    return True


def _copy_new(src: Path, dst_dir_fd: int, name: str) -> None:
    """Copy `src` into a file the export creates itself (O_EXCL|O_NOFOLLOW, relative to its folder's fd)."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                 dir_fd=dst_dir_fd)
    with open(src, "rb") as inp, os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(inp, out, 1 << 20)


def export_dataset(store: ReviewStore, image_for: Any, out_dir: Path, include_unreviewed: bool = False,
                   camera: str | None = None) -> dict[str, int]:
    """Write `out_dir/train/<id>.jpg` + `metadata.jsonl` (verdict, label, review) for reviewed results
    with evidence. `image_for(result_id)` returns the image path or None.

    Everything is written into a fresh folder made by mkdtemp next to `out_dir`, with files created
    O_EXCL|O_NOFOLLOW, then renamed into place, so no link planted in the output can redirect a write
    and no file the export did not write is kept. `out_dir` must not exist, be empty, or be an earlier
    export (it holds the `.edge-runtime-export` marker): an earlier export is replaced whole (renamed
    aside, the new one renamed in, the old one removed). A target that is or holds a link is refused.
    On any error the temporary folder is removed."""
    out_dir = Path(os.path.abspath(out_dir))
    exists = _check_target(out_dir)
    parent = out_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.export-", dir=parent))
    old: Path | None = None
    try:
        os.mkdir(work / "train", 0o755)
        f = ResultFilter(camera=camera, review=None if include_unreviewed else "reviewed")
        written = skipped = 0
        dfd = os.open(work / "train", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            mfd = os.open("metadata.jsonl", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                          0o644, dir_fd=dfd)
            with os.fdopen(mfd, "w", encoding="utf-8") as meta:
                for row in store.iterate(f):
                    src = image_for(row["id"])
                    if src is None:
                        skipped += 1
                        continue
                    name = f"{row['id']}.jpg"
                    if "/" in name or name.startswith("."):
                        skipped += 1
                        continue
                    _copy_new(Path(src), dfd, name)
                    review = row.get("review") or {}
                    label = review.get("correction") if review.get("state") == "corrected" else row.get("verdict")
                    meta.write(json.dumps({
                        "file_name": name, "id": row["id"], "camera": row["camera"], "ts": row["ts"],
                        "model": row.get("model"), "prompt": row.get("prompt"), "verdict": row.get("verdict"),
                        "label": label, "review_state": review.get("state"), "note": review.get("note"),
                    }, ensure_ascii=False) + "\n")
                    written += 1
                meta.flush()
                os.fsync(meta.fileno())
        finally:
            os.close(dfd)
        (work / MARKER).write_text("written by edge-runtime dataset export; this folder is replaced by the next one\n")
        if exists:
            _check_target(out_dir)  # again, just before the swap
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=parent))
            os.rename(out_dir, old / "x")
        os.chmod(work, 0o755)  # mkdtemp made it 0700; a dataset is meant to be read
        os.rename(work, out_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        if old is not None and (old / "x").exists() and not os.path.lexists(out_dir):
            os.rename(old / "x", out_dir)  # put the earlier export back
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return {"images": written, "skipped_without_image": skipped}


def export_from_config(config: Any, out_dir: Path, include_unreviewed: bool = False,
                       camera: str | None = None) -> dict[str, int]:
    """`edge-runtime dataset export DIR`: reads the journal and the evidence store of a config
    (the daemon may be running: SQLite WAL readers do not block it)."""
    from edge_runtime.core.errors import EdgeRuntimeError
    from edge_runtime.verdicts.evidence import EvidenceStore

    db_path = config.journal_path()
    if not db_path.is_file():
        raise EdgeRuntimeError(f"{db_path}: no journal here yet (check data_dir / journal.path)")
    store = ReviewStore(db_path)
    evidence = EvidenceStore(config.evidence, config.evidence.path or config.data_dir / "evidence", db_path)
    try:
        def image_for(result_id: str) -> Path | None:
            found = evidence.lookup(result_id)
            return found.path if found else None

        return export_dataset(store, image_for, out_dir, include_unreviewed, camera)
    except ExportPathError as exc:
        raise EdgeRuntimeError(str(exc)) from None
    except OSError as exc:  # disk full, a link loop, /proc, permissions: one line naming the cause
        where = f"{exc.filename}: " if exc.filename else ""
        raise EdgeRuntimeError(f"dataset export to {out_dir} failed: {where}{exc.strerror or exc}") from None
    finally:
        evidence.close()
        store.close()
