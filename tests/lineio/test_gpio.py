"""The GPIO cell against a real Station, on the libgpiod v2 emulation (this kernel has no GPIO chip)."""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_runtime.config.line_protocols import GpioConfig
from edge_runtime.lineio.gpio import GpioService
from edge_runtime.lineio.signals import JobRequest
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
        until(lambda: line.station.health().counters["acks"] == 2)  # the ack after the pulse is durable
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


# ---- pulse mode: results close together stay distinct pulses ----------------------------------------

def rises(chip: FakeChip) -> list[tuple[int, int, int]]:
    """(rise_ns, fall_ns, line) of every pulse on OK and NOK, in time order."""
    return sorted((r, f, off) for off in (OK, NOK) for r, f in pulses(chip, off))


def assert_distinct(chip: FakeChip, pulse_ms: int, gap_ms: int) -> list[tuple[int, int, int]]:
    """Each pulse is high at least pulse_ms; between any two (on either line) every output is low gap_ms."""
    seen = rises(chip)
    for rise, fall, off in seen:
        assert fall - rise >= pulse_ms * 1_000_000, f"pulse on line {off} cut short: {(fall - rise) / 1e6:.1f} ms"
    for (_r0, f0, _o0), (r1, _f1, _o1) in itertools.pairwise(seen):
        assert r1 - f0 >= gap_ms * 1_000_000, f"gap of {(r1 - f0) / 1e6:.1f} ms < {gap_ms} ms"
    return seen


def held_parts(line: Line, chip: FakeChip, n: int) -> list[int]:
    """Trigger n parts and hold their verdicts back (the model is still working on them). Each press
    waits for the part before it to be taken: a press while the station still takes the last frame is
    refused as busy (a loaded CI machine took longer than the 60 ms between presses)."""
    for taken in range(1, n + 1):
        press(chip)
        until(functools.partial(lambda want: len(line.pending) == want, taken))
    return sorted(line.pending)


@pytest.fixture
def manual(tmp_path: Path) -> Iterator[Line]:
    ln = Line(tmp_path, fifo_depth=4).start()  # the test gives each verdict
    yield ln
    ln.stop()


@pytest.mark.parametrize("n", [2, 3])
def test_ok_verdicts_back_to_back_give_that_many_pulses(manual: Line, n: int) -> None:
    chip = FakeChip()
    service = cell(manual, chip, pulse_ms=80)
    try:
        seqs = held_parts(manual, chip, n)
        for seq in seqs:  # all verdicts 0 ms apart: the reviewer's case
            manual.verdict(seq, False)
        until(lambda: manual.station.health().counters["acks"] == n)
        until(lambda: chip.physical(OK) == 0)
        seen = assert_distinct(chip, 80, 80)
        assert [off for _r, _f, off in seen] == [OK] * n, "one OK pulse per OK part"
        counters = manual.station.health().counters
        assert counters["results_ok"] == n and counters["fifo"] == 0
        assert service.health().counters["st1.outputs"] == n
    finally:
        service.stop()


def test_a_result_is_acknowledged_only_after_its_pulse(manual: Line) -> None:
    chip = FakeChip()
    service = cell(manual, chip, pulse_ms=150, gap_ms=50)
    try:
        seqs = held_parts(manual, chip, 2)
        for seq in seqs:
            manual.verdict(seq, False)
        until(lambda: chip.physical(OK) == 1)
        until(lambda: manual.station.signals().buffer_count == 2, timeout=0.1)  # the second outcome's write
        s = manual.station.signals()
        assert chip.physical(OK) == 1
        assert s.result_valid and s.inspection_seq == seqs[0] and s.buffer_count == 2, \
            "while the first pulse is high both results are still in the FIFO"
        until(lambda: manual.station.health().counters["acks"] == 2)
        until(lambda: chip.physical(OK) == 0)
        assert_distinct(chip, 150, 50)
        assert len(pulses(chip, OK)) == 2
    finally:
        service.stop()


def test_busy_stays_high_while_decided_results_wait_for_their_pulse(manual: Line) -> None:
    """With auto_ack a decided result stays in the FIFO until its pulse is out: the cell is still busy
    with that part (Busy is what a PLC or the status page reads), and only the last pulse's end clears it."""
    chip = FakeChip()
    service = cell(manual, chip, pulse_ms=150, gap_ms=50)
    seen: list[bool] = []
    manual.station.watch(lambda s: seen.append(s.busy))
    try:
        seqs = held_parts(manual, chip, 2)
        assert manual.station.signals().busy  # verdicts not decided yet
        for seq in seqs:
            manual.verdict(seq, False)
        until(lambda: manual.station.signals().buffer_count == 2)
        s = manual.station.signals()
        assert s.busy and s.result_valid, "two decided results not yet pulsed out: the cell is busy"
        until(lambda: chip.physical(OK) == 1)
        until(lambda: manual.station.health().counters["acks"] == 1)
        assert manual.station.signals().busy, "the second result still waits for its pulse"
        until(lambda: manual.station.health().counters["acks"] == 2)
        assert not manual.station.signals().busy and manual.station.signals().buffer_count == 0
        assert len(pulses(chip, OK)) == 2
        assert seen[-1] is False and True in seen
    finally:
        service.stop()


def test_without_auto_ack_busy_means_only_undecided(manual: Line) -> None:
    """No auto_ack: the PLC acknowledges over another protocol, so a decided result is its to read
    (ResultValid), not the cell's work; Busy is the station's usual 'a verdict is pending'."""
    chip = FakeChip()
    service = cell(manual, chip, pulse_ms=40, auto_ack=False)
    try:
        (seq,) = held_parts(manual, chip, 1)
        assert manual.station.signals().busy
        manual.verdict(seq, False)
        until(lambda: manual.station.signals().result_valid)
        assert not manual.station.signals().busy
        assert manual.station.ack_result(seq)
    finally:
        service.stop()


def test_ok_then_nok_back_to_back_neither_cut_short(manual: Line) -> None:
    chip = FakeChip()
    service = cell(manual, chip, pulse_ms=80, gap_ms=30)
    try:
        first, second = held_parts(manual, chip, 2)
        manual.verdict(first, False)
        manual.verdict(second, True)
        until(lambda: manual.station.health().counters["acks"] == 2)
        until(lambda: chip.physical(NOK) == 0)
        seen = assert_distinct(chip, 80, 30)
        assert [off for _r, _f, off in seen] == [OK, NOK]
    finally:
        service.stop()


def test_a_burst_beyond_the_fifo_sets_overrun_and_every_taken_part_is_pulsed(tmp_path: Path) -> None:
    ln = Line(tmp_path, auto=even_parts_are_nok, fifo_depth=2).start()
    chip = FakeChip()
    service = cell(ln, chip, pulse_ms=300)
    presses = 5
    try:
        for _ in range(presses):  # 5 parts within ~300 ms: the first pulse is still high
            press(chip)
        # Every press is taken or refused; a taken one counts once its trigger is durable.
        until(lambda: ln.station.health().counters["triggers"] + service.health().counters["st1.refused"] == presses)
        counters = ln.station.health().counters
        assert counters["overruns"] >= 1, "the line is told the FIFO is full"
        assert service.health().counters["st1.refused"] >= 1
        taken = counters["triggers"]
        until(lambda: ln.station.health().counters["acks"] == taken, timeout=10)
        until(lambda: chip.physical(OK) == 0 and chip.physical(NOK) == 0)
        seen = assert_distinct(chip, 300, 300)
        assert len(seen) == taken, "every part taken gets its own pulse; none is dropped silently"
        assert service.health().counters["st1.dropped"] == 0
        assert not ln.station.signals().overrun
    finally:
        service.stop()
        ln.stop()


def test_an_auto_ack_whose_write_failed_is_asked_again(line: Line) -> None:
    """The disk refuses the ack of a pulsed result: no edge of the line will ever ask again, so the cell
    does (the result stayed in the FIFO for good and the FIFO filled to Overrun)."""
    broken = [True]
    transaction = line.jobs._transaction

    def failing_acks(batch: list[Any]) -> None:
        if broken[0] and any(w.sql.startswith("UPDATE line_jobs SET acked") for w in batch):
            raise OSError("disk I/O error")
        transaction(batch)
    line.jobs._transaction = failing_acks  # type: ignore[method-assign]
    chip = FakeChip()
    service = cell(line, chip)
    try:
        press(chip)
        until(lambda: len(pulses(chip, OK)) == 1)
        time.sleep(0.3)  # the pulse ended and its ack failed
        counters = line.station.health().counters
        assert counters["fifo"] == 1 and counters["acks"] == 0
        broken[0] = False
        until(lambda: line.station.health().counters["acks"] == 1, timeout=5)
        assert line.station.health().counters["fifo"] == 0 and len(pulses(chip, OK)) == 1  # not pulsed twice
    finally:
        service.stop()
