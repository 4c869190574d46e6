"""A circuit breaker per endpoint: closed -> open after N failures -> one half-open probe after T seconds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


class CircuitBreaker:
    """Thread-safe. `allow()` before a request, then exactly one of `success()` / `failure()`."""

    def __init__(self, failures: int, open_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = failures
        self.open_s = open_s
        self.clock = clock
        self._lock = threading.Lock()
        self._state = CLOSED
        self._failures = 0  # consecutive
        self._opened_at = 0.0
        self._probing = False
        self.opened = 0  # transitions to open, for status and metrics
        self.closed = 0  # recoveries (half-open probe succeeded)
        self.last_change: float | None = None  # wall-clock time of the last transition

    @property
    def state(self) -> str:
        with self._lock:
            if self._state == OPEN and self.clock() - self._opened_at >= self.open_s:
                return HALF_OPEN  # a probe is due; allow() lets exactly one through
            return self._state

    def allow(self) -> bool:
        with self._lock:
            if self._state == CLOSED:
                return True
            if self._state == OPEN:
                if self.clock() - self._opened_at < self.open_s:
                    return False
                self._set(HALF_OPEN)
            if self._probing:
                return False  # one probe at a time: the rest of the traffic goes elsewhere
            self._probing = True
            return True

    def success(self) -> None:
        with self._lock:
            self._failures = 0
            self._probing = False
            if self._state != CLOSED:
                self.closed += 1
                self._set(CLOSED)

    def failure(self) -> None:
        with self._lock:
            self._failures += 1
            self._probing = False
            if self._state == HALF_OPEN or (self._state == CLOSED and self._failures >= self.threshold):
                self.opened += 1
                self._opened_at = self.clock()
                self._set(OPEN)

    def release(self) -> None:
        """The allowed request was never sent (shutdown): let the next caller probe."""
        with self._lock:
            self._probing = False

    def _set(self, state: str) -> None:
        self._state = state
        self.last_change = time.time()

    def snapshot(self) -> dict[str, Any]:
        state = self.state
        with self._lock:
            return {"state": state, "consecutive_failures": self._failures, "opened": self.opened,
                    "closed": self.closed, "last_change": self.last_change}
