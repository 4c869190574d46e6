"""The evidence store: the JPEG each verdict was made from, kept beside the journal.

Files are named by their content hash (`<dir>/<aa>/<sha256>.jpg` plus a `.thumb.jpg`), written to a
temporary name and renamed, so a reader never sees half an image and identical frames share a file.
Retention holds a disk budget and an age limit: passing verdicts go before defects, oldest first, and
never a file whose result the MQTT outbox has not delivered yet. A full disk turns into the
`evidence disk full` fault (the device reports degraded) and heals on the next write that fits.

An image deleted by retention, or found removed by something else, is marked in its results' journal
rows: `evidence.uri` becomes null and `evidence.removed` says when and why (`retention` or `missing`),
so every later read (REST, the exports, the MQTT outbox's unsent rows) says so instead of handing out a
link that answers 404.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import cv2
import numpy as np

from edge_runtime.config import EvidenceConfig  # lives with the other sections
from edge_runtime.core.result import utc_now
from edge_runtime.verdicts.database import open_db

log = logging.getLogger(__name__)
FAULT = "evidence disk full"
MARK_TIMEOUT_S = 1.0  # how long a read waits for SQLite's write lock to mark an image found missing
# An image's name (`paths`): the store names its files so; a journal row's `evidence.sha256` that is not such a name
# ("/etc/passwd", a NUL) links nothing in the folder, and is never made a path.
_SHA256 = re.compile(r"[0-9a-f]{64}")


_SCHEMA = """
CREATE TABLE IF NOT EXISTS evidence_files (
    sha256   TEXT PRIMARY KEY,
    bytes    INTEGER NOT NULL,          -- image + thumbnail on disk
    created  REAL NOT NULL,
    defect   INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS evidence_files_order ON evidence_files (defect, created);
CREATE TABLE IF NOT EXISTS evidence (
    result_id TEXT PRIMARY KEY,
    sha256    TEXT NOT NULL,
    width     INTEGER NOT NULL,
    height    INTEGER NOT NULL,
    bytes     INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS evidence_sha ON evidence (sha256);
"""


@dataclass(frozen=True)
class StoredImage:
    sha256: str
    path: Path
    thumbnail: Path


def is_defect(verdict: dict[str, Any], field: str) -> bool:
    return verdict.get(field) is True


class EvidenceStore:
    """Thread-safe; one SQLite connection of its own in the journal's file."""

    def __init__(self, cfg: EvidenceConfig, root: Path, db_path: Path, faults: set[str] | None = None,
                 keep_undelivered: bool = True) -> None:
        self.cfg = cfg
        self.root = root
        self.faults = faults if faults is not None else set()
        # With an MQTT outbox, a result's evidence stays until the broker acknowledged the result.
        self.keep_undelivered = keep_undelivered
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = open_db(db_path, _SCHEMA)
        self._db_path = db_path
        self._marks: sqlite3.Connection | None = None  # a read path's marks (_mark_missing), made when first needed
        self._marking = threading.Lock()
        # WAL + NORMAL cannot corrupt; a power cut may lose the newest rows, which costs at most a few
        # unlinked files, while FULL would add an fsync (~4 ms here) to every inspection.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._credit = 1 - cfg.keep_passes  # so the first pass is kept
        self._logged = 0.0
        self._checked = float("-inf")  # when _make_room last looked for files removed under us
        self.saved = 0
        self.skipped_sampled = 0
        self.skipped_full = 0
        self.deleted = 0

    # ---- writing -----------------------------------------------------------------------------------

    def save(self, image: np.ndarray, result_id: str, verdict: dict[str, Any]) -> dict[str, Any] | None:
        """Keep `image` as the evidence of a result; returns the result's `evidence` object or None.

        Never raises for a disk problem: it becomes the `evidence disk full` fault and None."""
        defect = is_defect(verdict, self.cfg.defect_field)
        if not defect and not self._sample_pass():
            self.skipped_sampled += 1
            return None
        ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, self.cfg.jpeg_quality])
        if not ok:
            return None
        data = buf.tobytes()
        sha = hashlib.sha256(data).hexdigest()
        height, width = image.shape[:2]
        with self._lock:
            try:
                self._store(sha, data, image, defect)
                self._db.execute("INSERT OR REPLACE INTO evidence (result_id, sha256, width, height, bytes) "
                                 "VALUES (?, ?, ?, ?, ?)", (result_id, sha, width, height, len(data)))
            except (OSError, sqlite3.OperationalError) as exc:
                # SQLite says "database or disk is full" (or a disk I/O error) as OperationalError.
                self._full(exc)
                return None
            if self.faults and FAULT in self.faults:
                log.info("evidence: writing again (space is back)")
            self.faults.discard(FAULT)
            self.saved += 1
        return {"uri": f"/api/v1/results/{result_id}/image.jpg", "sha256": sha, "bytes": len(data),
                "width": int(width), "height": int(height)}

    def _sample_pass(self) -> bool:
        """Deterministic sampling: keep_passes=0.1 keeps the 1st, 11th, 21st … pass."""
        frac = self.cfg.keep_passes
        if frac <= 0:
            return False
        self._credit += frac
        if self._credit >= 1 - 1e-9:
            self._credit -= 1
            return True
        return False

    def _store(self, sha: str, data: bytes, image: np.ndarray, defect: bool) -> None:
        paths = self.paths(sha)
        row = self._db.execute("SELECT bytes FROM evidence_files WHERE sha256 = ?", (sha,)).fetchone()
        if row is not None and paths.path.exists():
            if defect:  # a defect shares the file: it now follows the defect policy
                self._db.execute("UPDATE evidence_files SET defect = 1 WHERE sha256 = ?", (sha,))
            return
        thumb = self._thumbnail(image)
        size = len(data) + len(thumb)
        # The folder may have been removed under us (an `rm -rf` to free space): the free-space check
        # below stat()s it, and a missing folder was an ENOENT counted as a full disk until a restart.
        # The files that went with it must stop counting against the budget too: with the broker down
        # none of them may be chosen for deletion, and their rows kept the budget full for good.
        if not self.root.is_dir():
            self.root.mkdir(parents=True, exist_ok=True)
            self._forget_missing()
        self._make_room(size)
        paths.path.parent.mkdir(parents=True, exist_ok=True)
        # Only the evidence itself is fsync'd; a thumbnail lost to a power cut is made again on request.
        _atomic_write(paths.thumbnail, thumb, durable=False)
        _atomic_write(paths.path, data)
        self._db.execute("INSERT OR REPLACE INTO evidence_files (sha256, bytes, created, defect) VALUES "
                         "(?, ?, ?, ?)", (sha, size, time.time(), int(defect)))

    def _thumbnail(self, image: np.ndarray) -> bytes:
        h, w = image.shape[:2]
        scale = self.cfg.thumbnail_px / max(h, w)
        small = cv2.resize(image, (max(1, round(w * scale)), max(1, round(h * scale))),
                           interpolation=cv2.INTER_AREA) if scale < 1 else image
        ok, buf = cv2.imencode(".jpg", small, [cv2.IMWRITE_JPEG_QUALITY, 75])
        if not ok:
            raise OSError(errno.EIO, "thumbnail encoding failed")
        return bytes(buf.tobytes())

    def _full(self, exc: OSError | sqlite3.OperationalError) -> None:
        self.skipped_full += 1
        if FAULT not in self.faults or time.monotonic() - self._logged > 60:
            self._logged = time.monotonic()
            log.error("evidence: cannot write to %s (%s); verdicts go on without images", self.root,
                      getattr(exc, "strerror", None) or exc)
        self.faults.add(FAULT)

    # ---- retention ---------------------------------------------------------------------------------

    def used_bytes(self) -> int:
        with self._lock:
            return self._used()

    def _used(self) -> int:
        return int(self._db.execute("SELECT COALESCE(SUM(bytes), 0) FROM evidence_files").fetchone()[0])

    def _make_room(self, size: int) -> None:
        """Delete until `size` more bytes fit the budget and the free-space watermark.

        Raises ENOSPC when only undelivered evidence is left to delete."""
        budget = int(self.cfg.max_mb * 1024 * 1024)
        min_free = int(self.cfg.min_free_mb * 1024 * 1024)
        used = self._used()
        need = max(used + size - budget, min_free + size - shutil.disk_usage(self.root).free, 0)
        if need > 0:
            need -= self._delete(self._victims(), need)
        if need > 0 and time.monotonic() - self._checked > 60:
            # Before calling the disk full: were files removed under us (`rm -rf <dir>/*`)? Their rows
            # count against the budget and, undelivered, are never chosen. At most once a minute: it
            # stat()s every file the store knows.
            self._checked = time.monotonic()
            need -= self._forget_missing()
        if need > 0:
            raise OSError(errno.ENOSPC, "evidence budget or disk full (only undelivered evidence is left)")

    def _victims(self, older_than: float | None = None) -> list[tuple[str, int]]:
        undelivered = ""
        if self.keep_undelivered and self._has_journal():
            undelivered = ("AND NOT EXISTS (SELECT 1 FROM evidence e JOIN results r ON r.id = e.result_id "
                           "WHERE e.sha256 = f.sha256 AND r.sent = 0)")
        age = "AND f.created < ?" if older_than is not None else ""
        args: tuple[Any, ...] = (older_than,) if older_than is not None else ()
        return self._db.execute(f"SELECT f.sha256, f.bytes FROM evidence_files f WHERE 1 {age} {undelivered} "
                                "ORDER BY f.defect, f.created LIMIT 500", args).fetchall()

    def _has_journal(self) -> bool:
        return self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'results'").fetchone() is not None

    def _delete(self, victims: list[tuple[str, int]], need: int | None = None) -> int:
        freed = 0
        missing = False
        for sha, size in victims:
            if need is not None and freed >= need:
                break
            paths = self.paths(sha)
            missing |= not paths.path.exists()
            for p in (paths.path, paths.thumbnail):
                p.unlink(missing_ok=True)
            self._forget(sha, "retention")
            freed += size
            self.deleted += 1
        if missing:  # removed under us: others may have gone with it, and still count
            freed += self._forget_missing()
        return freed

    def _forget(self, sha: str, why: str, db: sqlite3.Connection | None = None) -> None:
        """Drop a file's rows: its own and the results' references to it (`lookup`, dataset export);
        the results that showed it say it was removed (see the module)."""
        db = db or self._db
        _mark_removed(db, "id IN (SELECT result_id FROM evidence WHERE sha256 = ?)", sha, why)
        db.execute("DELETE FROM evidence_files WHERE sha256 = ?", (sha,))
        db.execute("DELETE FROM evidence WHERE sha256 = ?", (sha,))

    def still_kept(self, result_id: str) -> bool:
        """Whether a result's image is on disk (see `found_missing`)."""
        return self._check(result_id)[0]

    def found_missing(self, result_id: str) -> dict[str, str] | None:
        """The removal (`{at, why: missing}`) of a result's image that its row or its journal link
        names and that is not on disk now (removed by something else); None when it is there, or the
        result has none to lose. The removal is marked in the journal when it can be written."""
        return self._check(result_id)[1]

    def _check(self, result_id: str) -> tuple[bool, dict[str, str] | None]:
        """(on disk, removal found now). A read: only the reads hold the store's lock; the marking of an
        image found gone is a write of its own, outside it (`_mark_missing`), so a read never makes
        `save` wait behind SQLite's write lock."""
        with self._lock:
            row = self._db.execute("SELECT sha256 FROM evidence WHERE result_id = ?", (result_id,)).fetchone()
            link = None
            if row is None and self._has_journal():  # a link left by rows dropped before removals were marked
                link = self._db.execute(
                    "SELECT json_extract(body, '$.evidence.sha256') FROM results WHERE id = ? "
                    "AND json_extract(body, '$.evidence.uri') IS NOT NULL", (result_id,)).fetchone()
        if row is not None:
            if self.paths(row[0]).path.exists():
                return True, None
            return False, self._mark_missing(result_id, row[0])
        if link is None or (is_sha256(link[0]) and self.paths(link[0]).path.exists()):
            return False, None  # nothing linked, or its file is there (not ours to call removed)
        return False, self._mark_missing(result_id, None)

    def _mark_missing(self, result_id: str, sha: str | None) -> dict[str, str] | None:
        """Forget an image found missing (`sha`; None: only the result's own link) and mark its results,
        on a connection of its own with a short busy timeout; one marking at a time, a read that finds
        another under way leaves it to that one. A mark that cannot be written (the journal busy for
        longer, a full disk) is logged and tried again by the next read: the caller answers from what
        it found."""
        removal: dict[str, str] | None = {"at": utc_now(), "why": "missing"}
        if not self._marking.acquire(blocking=False):
            return removal
        try:
            if self._marks is None:
                self._marks = sqlite3.connect(str(self._db_path), check_same_thread=False, isolation_level=None,
                                              timeout=MARK_TIMEOUT_S)
            db = self._marks
            db.execute("BEGIN IMMEDIATE")
            try:
                if sha is not None and self.paths(sha).path.exists():  # saved again meanwhile (the same frame)
                    removal = None
                elif sha is not None:  # still gone, with the write lock held
                    self.paths(sha).thumbnail.unlink(missing_ok=True)
                    self._forget(sha, "missing", db)
                    log.warning("evidence: the image of result %s (%s) was removed from %s by something else",
                                result_id, sha, self.root)
                else:
                    _mark_removed(db, "id = ?", result_id, "missing")
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            log.warning("evidence: could not mark the image of result %s as removed (%s); the next read "
                        "tries again", result_id, exc)
        finally:
            self._marking.release()
        return removal

    def _forget_missing(self) -> int:
        """Drop the rows of files no longer on disk (removed under us); returns the bytes they counted."""
        gone = [(sha, size) for sha, size in self._db.execute("SELECT sha256, bytes FROM evidence_files")
                if not self.paths(sha).path.exists()]
        for sha, _ in gone:
            self.paths(sha).thumbnail.unlink(missing_ok=True)
            self._forget(sha, "missing")
        if gone:
            log.warning("evidence: %d image(s) were removed from %s by something else; their results have no "
                        "image now", len(gone), self.root)
        return sum(size for _, size in gone)

    def apply_retention(self) -> None:
        """Age limit and budget; the daemon calls this now and then (writes also make room)."""
        with self._lock:
            self._delete(self._victims(time.time() - self.cfg.max_age_days * 86400))
            # Results the journal's own retention deleted leave their rows behind: drop those too.
            if self._has_journal():
                self._db.execute("DELETE FROM evidence WHERE result_id NOT IN (SELECT id FROM results)")
            orphans = self._db.execute("SELECT sha256, bytes FROM evidence_files f WHERE NOT EXISTS "
                                       "(SELECT 1 FROM evidence e WHERE e.sha256 = f.sha256)").fetchall()
            self._delete(orphans)
            try:
                self._make_room(0)
            except OSError:
                pass

    # ---- reading -----------------------------------------------------------------------------------

    def paths(self, sha: str) -> StoredImage:
        """An image's files in the folder; ValueError for a name that is not a sha256 (`is_sha256`), which could
        name a file outside it."""
        if not is_sha256(sha):
            raise ValueError(f"not an image's sha256: {sha!r}")
        folder = self.root / sha[:2]
        return StoredImage(sha, folder / f"{sha}.jpg", folder / f"{sha}.thumb.jpg")

    def thumbnail(self, found: StoredImage) -> Path:
        """The thumbnail, made again from the image when a power cut lost it (it is not fsync'd)."""
        try:
            if found.thumbnail.stat().st_size > 0:
                return found.thumbnail
        except FileNotFoundError:
            pass
        image = cv2.imread(str(found.path), cv2.IMREAD_COLOR)
        if image is None:
            raise FileNotFoundError(found.path)
        _atomic_write(found.thumbnail, self._thumbnail(image), durable=False)
        return found.thumbnail

    def link_broken(self, evidence: dict[str, Any]) -> bool:
        """Whether a result's evidence link (its `sha256`) names an image that is not on disk now: one stat, no
        lock, nothing written (lists and exports; `found_missing` marks one result). An image that is there but
        cannot be stat'd (EACCES) is not called removed: its route answers that (503)."""
        sha = evidence.get("sha256")
        if not is_sha256(sha):
            return True  # nothing in the folder can be its image (as `_check` reads such a link)
        try:
            os.stat(self.paths(sha).path)
        except (FileNotFoundError, NotADirectoryError):
            return True
        except OSError:
            return False
        return False

    def lookup(self, result_id: str) -> StoredImage | None:
        with self._lock:
            row = self._db.execute("SELECT sha256 FROM evidence WHERE result_id = ?", (result_id,)).fetchone()
        if row is None:
            return None
        found = self.paths(row[0])
        return found if found.path.exists() else None

    def status(self) -> dict[str, Any]:
        with self._lock:
            files = int(self._db.execute("SELECT COUNT(*) FROM evidence_files").fetchone()[0])
            used = self._used()
        return {"enabled": True, "files": files, "bytes": used, "budget_bytes": int(self.cfg.max_mb * 1024 * 1024),
                "saved": self.saved, "skipped_sampled": self.skipped_sampled, "skipped_full": self.skipped_full,
                "deleted": self.deleted, "disk_full": FAULT in self.faults}

    def close(self) -> None:
        with self._lock:
            self._db.close()
        with self._marking:
            if self._marks is not None:
                self._marks.close()


def is_sha256(sha: object) -> TypeGuard[str]:
    """Whether `sha` can name an image of the store (64 lowercase hex digits)."""
    return isinstance(sha, str) and _SHA256.fullmatch(sha) is not None


def _mark_removed(db: sqlite3.Connection, where: str, arg: str, why: str) -> None:
    """Mark the results `where` selects (one `?`, `arg`) whose journal row still links their image:
    `evidence.uri` null, `evidence.removed` {at, why}. Nothing without a journal in the file."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'results'").fetchone() is None:
        return
    db.execute("UPDATE results SET body = json_set(body, '$.evidence.uri', json('null'), '$.evidence.removed', "
               f"json(?)) WHERE {where} AND json_extract(body, '$.evidence.uri') IS NOT NULL",
               (json.dumps({"at": utc_now(), "why": why}), arg))


def _atomic_write(path: Path, data: bytes, durable: bool = True) -> None:
    """Write beside the target, fsync (when durable), rename: readers see the whole file or none."""
    tmp = path.parent / f".tmp-{uuid.uuid4().hex}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
