"""The GPIO cell against a real Station, on the libgpiod v2 emulation (this kernel has no GPIO chip)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_runtime.config.line_io import GpioConfig
from edge_runtime.lineio.gpio import GpioService
from edge_runtime.lineio.station import JobRequest
from tests.support.fake_gpiod import FakeChip
from tests.support.line_station import Line

TRIG, OK, NOK = 3, 5, 6


def even_parts_are_nok(job: JobRequest) -> bool:
    return job.seq % 2 == 0


def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.005)


@pytest.fixture
def line(tmp_path: Path) -> Iterator[Line]:
    ln = Line(tmp_path, auto=even_parts_are_nok).start()
    yield ln
    ln.stop()


def cell(line: Line, chip: FakeChip, **over: Any) -> GpioService:
    data: dict[str, Any] = {"station": "st1", "trigger_line": TRIG, "ok_line": OK, "nok_line": NOK,
                            "debounce_ms": 5, "pulse_ms": 40, **over}
    service = GpioService([line.station], GpioConfig(enabled=True, chip="/dev/gpiochip0", cells=[data]),
                          backend=chip)
    service.start()
    return service


def pulses(chip: FakeChip, offset: int) -> list[tuple[int, int]]:
    """(rise_ns, fall_ns) of each active pulse of an active-high output."""
    out, start = [], None
    for ts, off, level in chip.history:
        if off != offset:
            continue
        if level and start is None:
            start = ts
        elif not level and start is not None:
            out.append((start, ts))
            start = None
    return out


def press(chip: FakeChip, hold_s: float = 0.03) -> None:
    chip.drive(TRIG, 1)
    time.sleep(hold_s)
    chip.drive(TRIG, 0)
    time.sleep(hold_s)


def test_ok_then_nok_are_pulsed_and_acknowledged(line: Line) -> None:
    chip = FakeChip()
    service = cell(line, chip)
    try:
        press(chip)
        until(lambda: len(pulses(chip, OK)) == 1)
        press(chip)
        until(lambda: len(pulses(chip, NOK)) == 1)
        (rise, fall), = pulses(chip, OK)
        assert 35e6 <= fall - rise <= 200e6, "a pulse lasts pulse_ms"
        counters = line.station.health().counters
        assert counters["results_ok"] == 1 and counters["results_nok"] == 1 and counters["acks"] == 2
        assert counters["fifo"] == 0
        assert service.health().ok
    finally:
        service.stop()
    assert chip.physical(OK) == 0 and chip.physical(NOK) == 0


def test_bounce_and_spikes_shorter_than_debounce_are_ignored(line: Line) -> None:
    chip = FakeChip()
    service = cell(line, chip, debounce_ms=20)
    try:
        for _ in range(5):  # contact bounce: the level chatters, then settles high
            chip.drive(TRIG, 1)
            chip.drive(TRIG, 0)
        chip.drive(TRIG, 1)
        time.sleep(0.1)
        chip.drive(TRIG, 0)
        time.sleep(0.1)
        chip.drive(TRIG, 1)  # a 2 ms spike
        time.sleep(0.002)
        chip.drive(TRIG, 0)
        time.sleep(0.1)
        assert line.station.health().counters["triggers"] == 1
        assert service.health().counters["st1.bounces"] >= 1
    finally:
        service.stop()


def test_active_low_input_with_pull_up_and_active_low_outputs(line: Line) -> None:
    chip = FakeChip()
    service = cell(line, chip, trigger_active_low=True, bias="pull_up", output_active_low=True)
    try:
        until(lambda: chip.physical(OK) == 1)  # idle: inactive outputs sit high
        assert chip.physical(TRIG) == 1 and line.station.health().counters["triggers"] == 0  # pulled up: idle
        chip.drive(TRIG, 0)  # the opto pulls the line down: active
        until(lambda: any(off == OK and lvl == 0 for _t, off, lvl in chip.history))
        assert line.station.health().counters["triggers"] == 1
        until(lambda: chip.physical(OK) == 1)  # the pulse ended
    finally:
        service.stop()


def test_level_mode_holds_the_result_until_the_next_trigger(line: Line) -> None:
    chip = FakeChip()
    service = cell(line, chip, output_mode="level")
    try:
        press(chip)
        until(lambda: chip.physical(OK) == 1)
        time.sleep(0.15)
        assert chip.physical(OK) == 1, "level mode holds"
        press(chip)
        until(lambda: chip.physical(NOK) == 1)
        assert chip.physical(OK) == 0
    finally:
        service.stop()


def test_without_auto_ack_the_fifo_fills_and_the_line_sees_overrun(tmp_path: Path) -> None:
    ln = Line(tmp_path, auto=even_parts_are_nok, fifo_depth=2).start()
    chip = FakeChip()
    service = cell(ln, chip, auto_ack=False)
    try:
        for _ in range(3):
            press(chip)
        until(lambda: ln.station.signals().overrun)
        assert service.health().counters["st1.refused"] == 1
    finally:
        service.stop()
        ln.stop()


def test_an_edge_flood_is_held_in_bounded_memory(line: Line) -> None:
    chip = FakeChip()
    service = cell(line, chip, debounce_ms=1)
    try:
        for k in range(20_000):
            chip.drive(TRIG, k % 2)
        for req in {ln.request for ln in chip.lines if ln.request is not None}:
            assert len(req.events) <= 16, "the kernel's event buffer is bounded"
        time.sleep(0.05)
        assert service.health().ok
    finally:
        service.stop()


def test_the_real_backend_reports_a_missing_chip_without_dying(line: Line) -> None:
    service = GpioService([line.station], GpioConfig(enabled=True, chip="/dev/gpiochip9",
                                                     cells=[{"station": "st1", "trigger_line": TRIG}]))
    service.start()
    try:
        until(lambda: bool(service.health().detail))
        health = service.health()
        assert not health.ok and "/dev/gpiochip9" in health.detail
        assert all(t.is_alive() for t in service.threads()), "the thread retries; it does not die"
    finally:
        service.stop()
