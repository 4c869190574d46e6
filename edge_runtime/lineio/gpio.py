"""GPIO for simple cells: a debounced trigger input and OK/NOK outputs (pulse or level), libgpiod v2.

Through a backend with the shape of libgpiod v2's `gpiod.request_lines` (the real one is `gpiod`
itself): values are logical (`Value.ACTIVE` / `INACTIVE`, active_low applied by the kernel), edge
events carry CLOCK_MONOTONIC timestamps. A trigger edge counts once the level has held for
`debounce_ms` (measured from the last edge's timestamp), so bounce and spikes shorter than that are
ignored. The outputs tell the PLC the verdict; the PLC times any reject, this device never does.
Untested on hardware: this machine has no GPIO character device; tests/support/fake_gpiod.py
emulates the v2 behaviour. Wiring with 24 V opto-isolated I/O: docs/line-io.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from functools import partial
from typing import Any, Protocol

import gpiod
from gpiod.line import Bias, Direction, Edge, Value

from edge_runtime.config.line_protocols import GpioCellConfig, GpioConfig
from edge_runtime.core.sink import SinkHealth
from edge_runtime.core.supervise import RateLimitedLog, SupervisedThread
from edge_runtime.lineio.signals import LineOutcome, LineRefused, Signals
from edge_runtime.lineio.station import Station

log = logging.getLogger(__name__)

BIAS = {"as_is": Bias.AS_IS, "pull_up": Bias.PULL_UP, "pull_down": Bias.PULL_DOWN, "disabled": Bias.DISABLED}
MAX_EVENTS = 64  # read per wake-up; the kernel's buffer holds the rest (it drops the oldest when full)


class LineRequest(Protocol):
    """What we use of `gpiod.LineRequest`."""

    def get_value(self, line: int) -> Value: ...

    def set_value(self, line: int, value: Value) -> None: ...

    def wait_edge_events(self, timeout: float | None = None) -> bool: ...

    def read_edge_events(self, max_events: int | None = None) -> list[Any]: ...

    def release(self) -> None: ...


class GpioBackend(Protocol):
    def request_lines(self, path: str, config: dict[int, gpiod.LineSettings], consumer: str) -> LineRequest: ...


class GpiodBackend:
    """The real chip through libgpiod v2's Python bindings."""

    def request_lines(self, path: str, config: dict[int, gpiod.LineSettings], consumer: str) -> LineRequest:
        wanted: dict[Iterable[int | str] | int | str, gpiod.LineSettings | None] = dict(config.items())
        request: LineRequest = gpiod.request_lines(path, config=wanted, consumer=consumer)
        return request


class GpioCell:
    """One station's lines: the trigger input thread and the result output thread."""

    def __init__(self, station: Station, cfg: GpioCellConfig, chip: str, backend: GpioBackend) -> None:
        self.station = station
        self.cfg = cfg
        self.chip = chip
        self.backend = backend
        self.error: str | None = None
        self.counters = {"edges": 0, "bounces": 0, "triggers": 0, "refused": 0, "outputs": 0, "acks": 0,
                         "dropped": 0}
        self._results: deque[tuple[int, LineOutcome]] = deque(maxlen=64)
        self._cond = threading.Condition()
        self._last_out = -1  # the last InspectionSeq put on the outputs
        self._unacked: int | None = None  # an auto-ack whose write failed, to ask again
        self._retry_at = 0.0
        self._triggered = threading.Event()  # level mode: a new trigger clears the outputs
        self._unwatch: Any = None
        self._log = RateLimitedLog(log)

    # ---- input ---------------------------------------------------------------------------------

    def input_loop(self, stop: threading.Event) -> None:
        settings = gpiod.LineSettings(direction=Direction.INPUT, edge_detection=Edge.BOTH,
                                      bias=BIAS[self.cfg.bias], active_low=self.cfg.trigger_active_low)
        req = self._request({self.cfg.trigger_line: settings}, "input")
        try:
            debounce_ns = int(self.cfg.debounce_ms * 1_000_000)
            stable = bool(req.get_value(self.cfg.trigger_line))
            settle_at: int | None = None  # monotonic ns when the level will have held long enough
            while not stop.is_set():
                now = time.monotonic_ns()
                wait_s = 0.2 if settle_at is None else max(0.0, (settle_at - now) / 1e9)
                if req.wait_edge_events(wait_s):
                    events = req.read_edge_events(MAX_EVENTS)
                    if events:
                        self.counters["edges"] += len(events)
                        settle_at = events[-1].timestamp_ns + debounce_ns
                    continue
                if settle_at is None or time.monotonic_ns() < settle_at:
                    continue
                settle_at = None
                level = bool(req.get_value(self.cfg.trigger_line))
                if level == stable:
                    self.counters["bounces"] += 1  # it went back before it settled
                    continue
                stable = level
                self._edge(level)
        finally:
            req.release()

    def _edge(self, active: bool) -> None:
        if not active:
            self.station.release_trigger()
            return
        self.counters["triggers"] += 1
        self._triggered.set()
        with self._cond:
            self._cond.notify_all()
        try:
            # A bare wire carries no part id: InspectionSeq numbers the part. No wait for the disk here.
            self.station.request_trigger("", None)
        except LineRefused as exc:
            self.counters["refused"] += 1
            self._log.log(logging.WARNING, "gpio: trigger of station %s refused: %s", self.station.name, exc)

    # ---- output --------------------------------------------------------------------------------

    def watch(self) -> None:
        self._unwatch = self.station.watch(self._seen)

    def unwatch(self) -> None:
        if self._unwatch is not None:
            self._unwatch()

    def _seen(self, s: Signals) -> None:
        """Watch callback (the station's thread): queue a new result, never block."""
        if not s.result_valid or s.result == LineOutcome.NONE:
            return
        with self._cond:
            if s.inspection_seq <= self._last_out or (self._results and self._results[-1][0] == s.inspection_seq):
                return
            if len(self._results) == self._results.maxlen:
                self.counters["dropped"] += 1
            self._results.append((s.inspection_seq, s.result))
            self._cond.notify_all()

    def output_loop(self, stop: threading.Event) -> None:
        lines = [x for x in (self.cfg.ok_line, self.cfg.nok_line) if x is not None]
        if not lines:
            stop.wait()
            return
        settings = gpiod.LineSettings(direction=Direction.OUTPUT, active_low=self.cfg.output_active_low,
                                      output_value=Value.INACTIVE)
        req = self._request(dict.fromkeys(lines, settings), "output")
        try:
            self._outputs(req, stop)
        finally:
            for line in lines:
                req.set_value(line, Value.INACTIVE)
            req.release()

    def _outputs(self, req: LineRequest, stop: threading.Event) -> None:
        if self.cfg.output_mode == "pulse":
            self._pulses(req, stop)
        else:
            self._levels(req, stop)

    def _next(self, timeout: float, ready: bool) -> tuple[int, LineOutcome] | None:
        """The next queued result, or None after `timeout` s; with `ready` false only waits."""
        with self._cond:
            if (not ready or not self._results) and not self._triggered.is_set():
                self._cond.wait(timeout)
            return self._results.popleft() if ready and self._results else None

    def _line_for(self, item: tuple[int, LineOutcome] | None) -> tuple[int, int | None] | None:
        """(seq, output line) of a result not yet on the outputs; ERROR counts as NOK."""
        if item is None or item[0] <= self._last_out:
            return None
        seq, result = item
        self._last_out = seq
        return seq, self.cfg.ok_line if result == LineOutcome.OK else self.cfg.nok_line

    def _ack(self, seq: int) -> None:
        if not self.cfg.auto_ack:
            return
        shown = self.station.request_ack(seq)
        if shown is None:
            return
        self.counters["acks"] += 1
        shown.add_done_callback(lambda f, s=seq: self._ack_done(s, f))  # type: ignore[misc]

    def _ack_done(self, seq: int, shown: Future[bool]) -> None:
        """An auto-ack that did not clear the result (its write failed: a disk error) is asked again
        from the output loop; no edge of the line would ever ask again, and the FIFO would fill."""
        if shown.exception() is None and shown.result():
            return
        with self._cond:
            self._unacked = seq
            self._cond.notify_all()

    def _retry_ack(self) -> None:
        """The output loop's turn: ask again for an auto-ack that failed, at most once a second."""
        with self._cond:
            seq = self._unacked
            if seq is None or time.monotonic() < self._retry_at:
                return
            self._unacked, self._retry_at = None, time.monotonic() + 1.0
        self._ack(seq)

    def _levels(self, req: LineRequest, stop: threading.Event) -> None:
        """Level mode: a result holds its line until the next trigger; acknowledged once it is set."""
        active: int | None = None
        while not stop.is_set():
            self._retry_ack()
            item = self._next(0.2, True)
            if self._triggered.is_set() and active is not None:
                req.set_value(active, Value.INACTIVE)
                active = None
            self._triggered.clear()
            out = self._line_for(item)
            if out is None:
                continue
            seq, line = out
            if active is not None and active != line:
                req.set_value(active, Value.INACTIVE)
                active = None
            if line is not None:
                req.set_value(line, Value.ACTIVE)
                active = line
                self.counters["outputs"] += 1
            self._ack(seq)

    def _pulses(self, req: LineRequest, stop: threading.Event) -> None:
        """Pulse mode: one pulse at a time, each pulse_ms high, then at least gap_ms low on every output
        before the next result is taken; a result is acknowledged only once its pulse has ended, so
        results that come close together queue in the station's FIFO (Busy, BufferCount, Overrun)
        instead of merging into one pulse or cutting one short."""
        pulse_ns = self.cfg.pulse_ms * 1_000_000
        gap_ns = (self.cfg.gap_ms if self.cfg.gap_ms is not None else self.cfg.pulse_ms) * 1_000_000
        active: tuple[int, int, int] | None = None  # (seq, line, ns when it goes low) of the pulse on
        ready_at = 0  # monotonic ns from which the next pulse may start
        while not stop.is_set():
            self._retry_ack()
            now = time.monotonic_ns()
            if active is not None:
                wait_ns = active[2] - now
            else:
                wait_ns = ready_at - now if ready_at > now else 200_000_000
            item = self._next(max(0, wait_ns) / 1e9, active is None and now >= ready_at)
            self._triggered.clear()
            if active is not None and time.monotonic_ns() >= active[2]:
                done, high, _ = active
                req.set_value(high, Value.INACTIVE)
                ready_at = time.monotonic_ns() + gap_ns
                active = None
                self._ack(done)  # the pulse is out: the FIFO may move on (outside _cond: it calls _seen)
            out = self._line_for(item)
            if out is None:
                continue
            seq, line = out
            if line is None:
                self._ack(seq)  # no line for this result: nothing to signal
                continue
            req.set_value(line, Value.ACTIVE)
            self.counters["outputs"] += 1
            active = (seq, line, time.monotonic_ns() + pulse_ns)

    def _request(self, config: dict[int, gpiod.LineSettings], what: str) -> LineRequest:
        try:
            req = self.backend.request_lines(self.chip, config, f"edge-runtime-{self.station.name}")
        except OSError as exc:
            self.error = f"cannot request {what} lines {sorted(config)} on {self.chip}: {exc}"
            raise
        self.error = None
        return req


class GpioService:
    """Every configured cell, each on two supervised threads (service: start/stop/health)."""

    name = "gpio"

    def __init__(self, stations: list[Station], cfg: GpioConfig, backend: GpioBackend | None = None) -> None:
        by_name = {s.name: s for s in stations}
        self.backend = backend or GpiodBackend()
        self.cells = [GpioCell(by_name[c.station], c, cfg.chip, self.backend) for c in cfg.cells]
        for cell in self.cells:
            if cell.cfg.auto_ack:  # the FIFO holds results not yet signalled: the cell is still busy
                cell.station.hold_busy_until_acked()
        self._stop = threading.Event()
        self._threads: list[SupervisedThread] = []
        for cell in self.cells:
            name = cell.station.name
            self._threads.append(SupervisedThread(f"lineio-gpio-{name}-in", partial(cell.input_loop, self._stop),
                                                  self._stop, log))
            self._threads.append(SupervisedThread(f"lineio-gpio-{name}-out", partial(cell.output_loop, self._stop),
                                                  self._stop, log))

    def start(self) -> None:
        for cell in self.cells:
            cell.watch()
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for cell in self.cells:
            cell.unwatch()
            with cell._cond:
                cell._cond.notify_all()
        for t in self._threads:
            t.join(3)

    def threads(self) -> list[SupervisedThread]:
        return list(self._threads)

    def health(self) -> SinkHealth:
        errors = [c.error for c in self.cells if c.error]
        # Flat "<station>.<counter>" numbers: /metrics exports each as edge_line_server_events{protocol="gpio"}.
        counters: dict[str, Any] = {f"{c.station.name}.{k}": v for c in self.cells for k, v in c.counters.items()}
        counters["restarts"] = sum(t.restarts for t in self._threads)
        return SinkHealth(ok=not errors and all(t.is_alive() for t in self._threads), detail="; ".join(errors),
                          counters=counters)

