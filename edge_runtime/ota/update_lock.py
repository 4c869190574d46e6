"""The update lock: a swap stops the daemon (camera, port and line connection go with it), so it waits
until no line station has a job in flight and a configured quiet window is open.

The daemon holds a *shared* `flock` on `ota.lock_file` while any station has a job in flight
(`lineio/ota_lock.py`); the agent takes an *exclusive* one, non-blocking, and keeps it until the old
container is stopped. A lock dies with its process, so a daemon killed mid-job never wedges updates.
The wait is bounded (`ota.lock_max_wait_s`): then the update fails, or goes ahead if configured so.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

log = logging.getLogger(__name__)

LINE_BUSY = "a line station has a job in flight"


@dataclass(frozen=True)
class LockVerdict:
    ok: bool
    phase: str = ""  # when not ok: "failed" (waited too long) or "canceled"
    reason: str = ""


def window_open(windows: list[str], now: datetime) -> bool:
    """Whether `now` (local time) falls in one of the 'HH:MM-HH:MM' windows; none configured: always."""
    if not windows:
        return True
    minute = now.hour * 60 + now.minute
    for window in windows:
        start_s, end_s = window.split("-")
        start = int(start_s[:2]) * 60 + int(start_s[3:])
        end = int(end_s[:2]) * 60 + int(end_s[3:])
        inside = start <= minute < end if start < end else (minute >= start or minute < end)
        if start == end or inside:  # start > end: the window crosses midnight
            return True
    return False


class UpdateLock:
    """Held by the agent from the end of the wait until the old container is stopped."""

    def __init__(self, lock_file: Path | None, windows: list[str], max_wait_s: float, on_timeout: str = "fail",
                 now: Callable[[], datetime] = datetime.now, sleep: Callable[[float], None] = time.sleep) -> None:
        self.lock_file = lock_file
        self.windows = list(windows)
        self.max_wait_s = max_wait_s
        self.on_timeout = on_timeout
        self._now = now
        self._sleep = sleep
        self._fd: int | None = None

    def blocker(self) -> str | None:
        """Why a swap cannot start now, or None (then the lock is held until `release`)."""
        if not window_open(self.windows, self._now()):
            return f"outside the maintenance window ({', '.join(self.windows)})"
        if self.lock_file is None or self._fd is not None:
            return None
        try:
            fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            return f"cannot open the lock file {self.lock_file}: {exc.strerror or exc}"
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # BlockingIOError: the daemon holds its shared lock
            os.close(fd)
            return LINE_BUSY
        self._fd = fd
        return None

    def acquire(self, report: Callable[[str], None], cancelled: Callable[[], str | None]) -> LockVerdict:
        """Wait until `blocker()` is None, reporting each new reason once; at most `max_wait_s`."""
        deadline = time.monotonic() + self.max_wait_s
        reported: str | None = None
        while True:
            why = self.blocker()
            if why is None:
                return LockVerdict(True)
            if why != reported:
                reported = why
                report(f"waiting for the line: {why}")
            stop = cancelled()
            if stop:
                return LockVerdict(False, "canceled", stop)
            left = deadline - time.monotonic()
            if left <= 0:
                if self.on_timeout == "proceed":
                    log.warning("ota: swapping after %.0f s of waiting although %s", self.max_wait_s, why)
                    return LockVerdict(True)
                return LockVerdict(False, "failed", f"waited {self.max_wait_s:.0f} s for the line: {why}")
            self._sleep(min(1.0, left))

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
