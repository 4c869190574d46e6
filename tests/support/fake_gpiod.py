"""A GPIO chip that behaves as libgpiod v2 with the kernel's GPIO character device (uAPI v2) does.

This kernel has no GPIO character device and no gpio-sim, so the GPIO cell is tested against this
instead. What it copies from the v2 API and gpiolib-cdev: values are logical (active_low inverts
both reads and writes); edge events are logical too (with active_low a physical falling edge is a
RISING_EDGE event) and carry CLOCK_MONOTONIC `timestamp_ns`, `line_offset`, `global_seqno` and
`line_seqno`; only the edges asked for (`Edge.RISING`/`FALLING`/`BOTH`) are reported; the event buffer
is bounded and drops its oldest event when full; bias decides the level of an undriven input; a line
requested twice is EBUSY; a released request raises `gpiod.RequestReleasedError`.
"""

from __future__ import annotations

import errno
import threading
import time
from collections import deque
from dataclasses import dataclass

import gpiod
from gpiod.edge_event import EdgeEvent
from gpiod.line import Bias, Direction, Edge, Value


@dataclass
class _Line:
    physical: int = 0  # what the wire is at (driven by the outside for inputs, by us for outputs)
    driven: bool = False  # an outside driver holds the level (else bias decides)
    settings: gpiod.LineSettings | None = None
    request: FakeRequest | None = None
    seqno: int = 0


class FakeChip:
    """One chip of `num_lines` lines; `drive()` is the world outside, `history` what our outputs did."""

    def __init__(self, num_lines: int = 32) -> None:
        self.lines = [_Line() for _ in range(num_lines)]
        self.lock = threading.Condition()
        self.global_seqno = 0
        self.history: list[tuple[int, int, int]] = []  # (timestamp_ns, offset, physical) of output writes

    # -- the outside world --
    def drive(self, offset: int, physical: int) -> None:
        """An external circuit sets the wire of input `offset` to `physical` (0 or 1)."""
        with self.lock:
            line = self.lines[offset]
            line.driven = True
            self._set_physical(offset, physical)

    def undrive(self, offset: int) -> None:
        with self.lock:
            line = self.lines[offset]
            line.driven = False
            if line.settings is not None:
                self._apply_bias(offset)

    def physical(self, offset: int) -> int:
        with self.lock:
            return self.lines[offset].physical

    # -- behaviour --
    def _logical(self, offset: int) -> int:
        line = self.lines[offset]
        low = bool(line.settings and line.settings.active_low)
        return line.physical ^ int(low)

    def _apply_bias(self, offset: int) -> None:
        line = self.lines[offset]
        bias = line.settings.bias if line.settings else Bias.AS_IS
        if not line.driven and bias in (Bias.PULL_UP, Bias.PULL_DOWN):
            self._set_physical(offset, 1 if bias == Bias.PULL_UP else 0)

    def _set_physical(self, offset: int, physical: int) -> None:
        line = self.lines[offset]
        before = self._logical(offset)
        line.physical = 1 if physical else 0
        after = self._logical(offset)
        req, st = line.request, line.settings
        if req is None or st is None or before == after or st.direction != Direction.INPUT:
            return
        rising = after == 1
        wanted = st.edge_detection == Edge.BOTH or st.edge_detection == (Edge.RISING if rising else Edge.FALLING)
        if not wanted:
            return
        self.global_seqno += 1
        line.seqno += 1
        kind = EdgeEvent.Type.RISING_EDGE if rising else EdgeEvent.Type.FALLING_EDGE
        req.events.append(EdgeEvent(kind.value, time.monotonic_ns(), offset, self.global_seqno, line.seqno))
        self.lock.notify_all()

    def request_lines(self, path: str, config: dict[int, gpiod.LineSettings], consumer: str) -> FakeRequest:
        with self.lock:
            for offset in config:
                if not 0 <= offset < len(self.lines):
                    raise OSError(errno.EINVAL, f"line offset {offset} out of range on {path}")
                if self.lines[offset].request is not None:
                    raise OSError(errno.EBUSY, "Device or resource busy")
            req = FakeRequest(self, list(config), consumer)
            for offset, settings in config.items():
                line = self.lines[offset]
                line.settings, line.request = settings, req
                if settings.direction == Direction.OUTPUT:
                    req.set_value(offset, settings.output_value)
                else:
                    self._apply_bias(offset)
            return req


class FakeRequest:
    def __init__(self, chip: FakeChip, offsets: list[int], consumer: str, buffer_size: int = 16) -> None:
        self.chip = chip
        self.offsets = offsets
        self.consumer = consumer
        # The kernel's default event buffer is 16 events per line; full, it drops the oldest.
        self.events: deque[EdgeEvent] = deque(maxlen=buffer_size * len(offsets))
        self.released = False

    def _check(self, offset: int) -> None:
        if self.released:
            raise gpiod.RequestReleasedError()
        if offset not in self.offsets:
            raise ValueError(f"line {offset} is not in this request")

    def get_value(self, line: int) -> Value:
        with self.chip.lock:
            self._check(line)
            return Value.ACTIVE if self.chip._logical(line) else Value.INACTIVE

    def set_value(self, line: int, value: Value) -> None:
        with self.chip.lock:
            self._check(line)
            st = self.chip.lines[line].settings
            if st is None or st.direction != Direction.OUTPUT:
                raise PermissionError(errno.EPERM, "line is not an output")
            physical = int(value == Value.ACTIVE) ^ int(st.active_low)
            self.chip.lines[line].physical = physical
            self.chip.history.append((time.monotonic_ns(), line, physical))
            self.chip.lock.notify_all()

    def wait_edge_events(self, timeout: float | None = None) -> bool:
        with self.chip.lock:
            if self.released:
                raise gpiod.RequestReleasedError()
            if not self.events and timeout != 0:
                self.chip.lock.wait(timeout)
            return bool(self.events)

    def read_edge_events(self, max_events: int | None = None) -> list[EdgeEvent]:
        with self.chip.lock:
            if self.released:
                raise gpiod.RequestReleasedError()
            n = len(self.events) if max_events is None else min(max_events, len(self.events))
            return [self.events.popleft() for _ in range(n)]

    def release(self) -> None:
        with self.chip.lock:
            if self.released:
                return
            self.released = True
            for offset in self.offsets:
                line = self.chip.lines[offset]
                line.request, line.settings = None, None
