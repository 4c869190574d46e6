"""The daemon's half of the update lock (`ota.lock_file`): a *shared* `flock` held while any station
has a job in flight (triggered and not yet acknowledged by the line), so the update agent, a separate
process that takes an *exclusive* lock before it stops this daemon, waits for the line.

It is driven by the stations' `watch` callbacks, which must not block: every lock call is
non-blocking. If the agent already holds its lock (a swap is starting), the job goes on and the change
is logged; the daemon is about to be stopped, and its interrupted jobs come back as ERROR 902 after the
restart (`lineio/station/`). The kernel drops the lock with the process, so a killed daemon never
blocks updates.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from pathlib import Path

from edge_runtime.lineio.signals import Signals

log = logging.getLogger(__name__)


class LineJobsLock:
    """One per daemon; `changed(station, signals)` is every station's watch callback."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._busy: set[str] = set()
        self._mutex = threading.Lock()
        self._fd: int | None = None
        self.held = False
        self.missed = 0  # jobs that started while the agent held the lock (a swap was starting)

    def changed(self, station: str, signals: Signals) -> None:
        in_flight = signals.busy or signals.buffer_count > 0
        with self._mutex:
            if in_flight:
                self._busy.add(station)
            else:
                self._busy.discard(station)
            want = bool(self._busy)
            if want and not self.held:
                self._take()
            elif not want and self.held:
                self._drop()

    def _take(self) -> None:
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            fcntl.flock(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            self.held = True
        except BlockingIOError:
            self.missed += 1
            log.warning("line I/O: a job started while the update agent holds %s (a swap is starting)", self.path)
        except OSError as exc:
            self.missed += 1
            log.warning("line I/O: cannot take the update lock %s: %s", self.path, exc.strerror or exc)

    def _drop(self) -> None:
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            except OSError as exc:  # pragma: no cover - unlocking an open descriptor does not fail
                log.warning("line I/O: releasing the update lock failed: %s", exc)
        self.held = False

    def close(self) -> None:
        with self._mutex:
            self._busy.clear()
            fd, self._fd, self.held = self._fd, None, False
        if fd is not None:
            os.close(fd)  # closing drops the lock
