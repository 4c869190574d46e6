"""The station handshake on its own: a real job store (SQLite), a capture side the test drives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from edge_runtime.config.line_io import StationConfig
from edge_runtime.core.errors import QueueFull, StorageFull
from edge_runtime.core.result import FrameInfo, Result
from edge_runtime.lineio.recipes import tagged
from edge_runtime.lineio.signals import (
    DEFECT_INSPECTION_FAILED,
    DEFECT_INTERRUPTED,
    DEFECT_NO_FRAME,
    DEFECT_NO_VERDICT,
    DEFECT_NOK,
    DEFECT_TIMEOUT,
    JobRequest,
    LineOutcome,
    LineRefused,
    Signals,
)
from edge_runtime.lineio.station import Station
from edge_runtime.verdicts.journal import Journal
from edge_runtime.verdicts.line_jobs import LineJobs


def station_config(**over: Any) -> StationConfig:
    data: dict[str, Any] = {"name": "s1", "camera": "cam", "heartbeat_ms": 50, "result_deadline_ms": 5000,
                            "nok_when": [{"field": "verdict.defect", "equals": True}]}
    data.update(over)
    return StationConfig.model_validate(data)


class Line:
    """The capture side: records each job, takes the frame when told, resolves verdicts by hand."""

    def __init__(self, acquire_at_once: bool = True, fail: bool = False) -> None:
        self.jobs: dict[int, tuple[JobRequest, Future[Result], Callable[[], None]]] = {}
        self.acquire_at_once = acquire_at_once
        self.fail = fail
        self.started = threading.Event()

    def start(self, job: JobRequest, on_acquired: Callable[[], None]) -> Future[Result]:
        if self.fail:
            raise RuntimeError("camera is down")
        future: Future[Result] = Future()
        self.jobs[job.seq] = (job, future, on_acquired)
        if self.acquire_at_once:
            on_acquired()
        self.started.set()
        return future

    def verdict(self, seq: int, verdict: dict[str, Any]) -> Result:
        job, future, _ = self.jobs[seq]
        result = tagged(Result(device="d", camera="cam", frame=FrameInfo(seq, 8, 8), verdict=verdict,
                                   text="", model="m", timings_ms={}, prompt=""), job)
        future.set_result(result)
        return result


def wait_for(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[LineJobs]:
    store = LineJobs(tmp_path / "journal.sqlite3")
    yield store
    store.close()


def running(cfg: StationConfig, jobs: LineJobs, line: Line, **kw: Any) -> Station:
    station = Station(cfg, jobs, line.start, **kw)
    station.start()
    return station


def test_ok_handshake_trigger_acquisition_result_ack(jobs: LineJobs) -> None:
    line = Line(acquire_at_once=False)
    station = running(station_config(), jobs, line)
    seen: list[Signals] = []
    station.watch(seen.append)
    try:
        assert station.signals().ready
        seq = station.trigger("PART-0001")
        s = station.signals()
        assert (s.trigger_ack, s.busy, s.acquisition_done, s.result_valid) == (True, True, False, False)
        assert s.inspection_seq == seq and s.part_id == "PART-0001" and not s.ready  # acquiring
        wait_for(lambda: seq in line.jobs)
        line.jobs[seq][2]()  # the frame is taken
        s = station.signals()
        assert s.acquisition_done and s.busy and not s.result_valid and s.ready
        station.release_trigger()
        line.verdict(seq, {"defect": False})
        wait_for(lambda: station.signals().result_valid)
        s = station.signals()
        assert (s.result, s.defect_code, s.buffer_count, s.busy) == (LineOutcome.OK, 0, 1, False)
        assert not s.trigger_ack
        assert station.ack_result(seq + 1) is False  # another job's ack does not clear this one
        assert station.ack_result(seq) is True
        s = station.signals()
        assert not s.result_valid and s.buffer_count == 0 and s.result == LineOutcome.NONE
        assert [x.acquisition_done for x in seen].index(True) < [x.result_valid for x in seen].index(True)
        row = jobs.job("s1", seq)
        assert row is not None and row["result"] == 1 and row["acked"] is not None
        assert row["part_id"] == "PART-0001"
    finally:
        station.stop()


def test_nok_by_the_station_rule_with_its_defect_code(jobs: LineJobs) -> None:
    line = Line()
    station = running(station_config(defect_code_field="verdict.code"), jobs, line)
    try:
        seq = station.trigger("P2")
        wait_for(lambda: seq in line.jobs)
        line.verdict(seq, {"defect": True, "code": 17})
        wait_for(lambda: station.signals().result_valid)
        assert (station.signals().result, station.signals().defect_code) == (LineOutcome.NOK, 17)
        assert station.health().counters["results_nok"] == 1
    finally:
        station.stop()


def test_recipe_selects_prompt_and_nok_rule(jobs: LineJobs) -> None:
    schema = {"type": "object", "properties": {"present": {"type": "boolean"}}, "required": ["present"]}
    cfg = station_config(recipes={"bolt": {"prompt": "Is the bolt there?", "schema": schema,
                                           "nok_when": [{"field": "verdict.present", "equals": False}]}})
    line = Line()
    station = running(cfg, jobs, line, camera_prompt="camera default")
    try:
        seq = station.trigger("P", "bolt")
        wait_for(lambda: seq in line.jobs)
        assert line.jobs[seq][0].prompt == "Is the bolt there?" and line.jobs[seq][0].recipe == "bolt"
        assert line.jobs[seq][0].schema == schema  # the inspection is asked for the recipe's verdict
        line.verdict(seq, {"present": False, "defect": False})
        wait_for(lambda: station.signals().result_valid)
        assert station.signals().result == LineOutcome.NOK and station.signals().recipe == "bolt"
        with pytest.raises(LineRefused) as refused:
            station.trigger("P", "nut")
        assert refused.value.reason == "bad_recipe"
    finally:
        station.stop()


def test_results_leave_in_trigger_order(jobs: LineJobs) -> None:
    line = Line()
    station = running(station_config(), jobs, line)
    try:
        first = station.trigger("A")
        wait_for(lambda: first in line.jobs)
        second = station.trigger("B")
        wait_for(lambda: second in line.jobs)
        line.verdict(second, {"defect": True})
        time.sleep(0.05)
        assert not station.signals().result_valid  # B is ready, but A is first on the belt
        line.verdict(first, {"defect": False})
        wait_for(lambda: station.signals().result_valid)
        s = station.signals()
        assert (s.inspection_seq, s.part_id, s.result, s.buffer_count) == (first, "A", LineOutcome.OK, 2)
        assert station.ack_result()
        s = station.signals()
        assert (s.inspection_seq, s.part_id, s.result) == (second, "B", LineOutcome.NOK)
    finally:
        station.stop()


def test_fifo_overrun_refuses_and_flags_until_an_ack(jobs: LineJobs) -> None:
    line = Line()
    station = running(station_config(fifo_depth=2), jobs, line)
    try:
        for part in ("A", "B"):
            seq = station.trigger(part)
            wait_for(lambda s=seq: s in line.jobs)  # type: ignore[misc]
            line.verdict(seq, {"defect": False})
        wait_for(lambda: station.signals().buffer_count == 2)  # each outcome shows once it is durable
        with pytest.raises(LineRefused) as refused:
            station.trigger("C")
        assert refused.value.reason == "overrun"
        s = station.signals()
        assert s.overrun and s.buffer_count == 2 and not s.ready
        assert station.health().counters["overruns"] == 1
        assert station.ack_result()
        assert not station.signals().overrun and station.signals().ready
        station.trigger("C")
    finally:
        station.stop()


def test_a_verdict_past_the_deadline_is_nok_timeout_never_ok(jobs: LineJobs) -> None:
    line = Line()
    station = running(station_config(result_deadline_ms=100), jobs, line)
    try:
        seq = station.trigger("SLOW")
        wait_for(lambda: station.signals().result_valid, timeout=2)
        s = station.signals()
        assert (s.result, s.defect_code, s.inspection_seq) == (LineOutcome.NOK, DEFECT_TIMEOUT, seq)
        line.verdict(seq, {"defect": False})  # the late OK changes nothing
        time.sleep(0.05)
        assert station.signals().result == LineOutcome.NOK
        assert station.health().counters["timeouts"] == 1
        assert station.health().counters["late_verdicts"] == 1
    finally:
        station.stop()


def test_no_frame_and_empty_verdicts_are_errors(jobs: LineJobs) -> None:
    station = running(station_config(), jobs, Line(fail=True))
    try:
        station.trigger("X")
        wait_for(lambda: station.signals().result_valid)
        assert (station.signals().result, station.signals().defect_code) == (LineOutcome.ERROR, DEFECT_NO_FRAME)
        s = station.signals()
        assert s.ready  # the failed acquisition does not hold the station busy
        # What a PLC waiting for the frame sees instead of AcquisitionDone (docs/line-io.md's samples)
        assert not s.acquisition_done and not s.busy
    finally:
        station.stop()
    line = Line()
    station = running(station_config(name="s2"), jobs, line)
    try:
        seq = station.trigger("Y")
        wait_for(lambda: seq in line.jobs)
        line.verdict(seq, {})
        wait_for(lambda: station.signals().result_valid)
        assert (station.signals().result, station.signals().defect_code) == (LineOutcome.ERROR, DEFECT_NO_VERDICT)
    finally:
        station.stop()


@pytest.mark.parametrize("taken", [True, False])
def test_an_inspection_refused_after_its_trigger_is_error_903_not_no_frame(jobs: LineJobs, taken: bool) -> None:
    """The model's queue full once the frame is taken (another station, a camera or the API filled it), or
    the journal's disk full before it is: the inspection failed (903), the camera did not (901)."""
    def start(job: JobRequest, on_acquired: Callable[[], None]) -> Future[Result]:
        if not taken:
            raise StorageFull("disk full: the journal cannot store results")
        on_acquired()
        raise QueueFull("the inspection queue is full (4 waiting)")
    station = Station(station_config(), jobs, start)
    station.start()
    try:
        station.trigger("X")
        wait_for(lambda: station.signals().result_valid)
        s = station.signals()
        assert (s.result, s.defect_code) == (LineOutcome.ERROR, DEFECT_INSPECTION_FAILED)
        assert s.acquisition_done is taken and s.ready
    finally:
        station.stop()


def test_not_ready_until_warm_and_on_fault_and_when_disabled(jobs: LineJobs) -> None:
    warm = threading.Event()
    fault: list[str | None] = [None]
    station = running(station_config(), jobs, Line(), warm=warm.is_set, fault=lambda: fault[0])
    try:
        assert not station.signals().ready
        with pytest.raises(LineRefused) as refused:
            station.trigger("A")
        assert refused.value.reason == "not_ready"
        warm.set()
        wait_for(lambda: station.signals().ready, timeout=2)
        fault[0] = "camera cam is down"
        wait_for(lambda: station.signals().fault, timeout=2)
        assert not station.signals().ready and not station.health().ok
        fault[0] = None
        wait_for(lambda: station.signals().ready, timeout=2)
        station.set_trigger_enable(False)
        assert not station.signals().ready
        with pytest.raises(LineRefused) as refused:
            station.trigger("A")
        assert refused.value.reason == "disabled"
    finally:
        station.stop()


@pytest.mark.parametrize("part", ["x" * 33, "tab\there", "é", "\x00"])
def test_bad_part_ids_are_refused(jobs: LineJobs, part: str) -> None:
    station = running(station_config(), jobs, Line())
    try:
        with pytest.raises(LineRefused) as refused:
            station.trigger(part)
        assert refused.value.reason == "bad_part_id"
        assert jobs.last_seq("s1") == 0
    finally:
        station.stop()


def test_heartbeat_increments(jobs: LineJobs) -> None:
    station = running(station_config(heartbeat_ms=50), jobs, Line())
    try:
        first = station.signals().heartbeat
        wait_for(lambda: station.signals().heartbeat >= first + 3, timeout=2)
    finally:
        station.stop()


def test_a_failing_watcher_does_not_stop_the_others(jobs: LineJobs) -> None:
    station = running(station_config(), jobs, Line())
    got: list[Signals] = []

    def broken(_: Signals) -> None:
        raise RuntimeError("boom")
    station.watch(broken)
    unsubscribe = station.watch(got.append)
    try:
        station.trigger("A")
        assert got and got[-1].trigger_ack
        assert station.health().counters["watcher_errors"] >= 1
        unsubscribe()
        n = len(got)
        station.release_trigger()
        assert len(got) == n
    finally:
        station.stop()


def test_restart_restores_the_fifo_without_duplicating_a_part(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    journal = Journal(path)
    jobs = LineJobs(path)
    line = Line()
    station = running(station_config(), jobs, line)
    decided = station.trigger("DECIDED")
    wait_for(lambda: decided in line.jobs)
    line.verdict(decided, {"defect": True})
    wait_for(lambda: station.signals().result_valid)
    journaled = station.trigger("JOURNALED")
    wait_for(lambda: journaled in line.jobs)
    cut = station.trigger("CUT")
    station.stop()
    # The verdict of JOURNALED reached the journal, but the daemon died before the station saw it.
    journal.add(line.verdict(journaled, {"defect": False}))
    jobs.close()

    again = LineJobs(path)
    line2 = Line()
    station = running(station_config(), again, line2)
    try:
        s = station.signals()
        assert s.result_valid and (s.inspection_seq, s.part_id, s.result) == (decided, "DECIDED", LineOutcome.NOK)
        assert s.buffer_count == 3
        assert station.ack_result()
        s = station.signals()
        assert (s.inspection_seq, s.part_id, s.result) == (journaled, "JOURNALED", LineOutcome.OK)
        assert station.ack_result()
        s = station.signals()
        assert (s.inspection_seq, s.result, s.defect_code) == (cut, LineOutcome.ERROR, DEFECT_INTERRUPTED)
        assert station.ack_result()
        assert station.trigger("NEXT") == cut + 1  # numbering continues: no job id is reused
    finally:
        station.stop()
        again.close()
        journal.close()


def test_a_trigger_flood_is_held_in_bounded_memory(jobs: LineJobs) -> None:
    line = Line()
    station = running(station_config(fifo_depth=8), jobs, line)
    try:
        station.trigger("warm-up")
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        refused = 0
        for i in range(5_000):
            try:
                station.trigger(f"P{i}")
            except LineRefused:
                refused += 1
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
        assert refused >= 5_000 - 8
        assert station.health().counters["fifo"] <= 8
        assert grown < 512 * 1024, f"memory grew {grown} bytes under a trigger flood"
    finally:
        station.stop()


def test_late_verdicts_counts_only_a_verdict_after_the_deadline_in_the_daemons_order(jobs: LineJobs) -> None:
    """The daemon decides a job by the sink (notify) and then the inspection's future resolves too: the
    second arrival of an on-time verdict is not late; a verdict after the deadline's NOK is, once."""
    line = Line()
    station = running(station_config(result_deadline_ms=300), jobs, line)
    try:
        seq = station.trigger("ON-TIME")
        wait_for(lambda: seq in line.jobs)
        job, future, _ = line.jobs[seq]
        result = tagged(Result(device="d", camera="cam", frame=FrameInfo(seq, 8, 8), verdict={"defect": True},
                                   text="", model="m", timings_ms={}, prompt=""), job)
        station.notify(result)  # the journal's delivery first ...
        future.set_result(result)  # ... then the future's done callback
        wait_for(lambda: station.signals().result_valid)
        s = station.signals()
        assert (s.result_valid, s.result, s.inspection_seq) == (True, LineOutcome.NOK, seq)
        assert station.health().counters["late_verdicts"] == 0
        assert station.health().counters["results_nok"] == 1
        assert station.ack_result(seq)

        late = station.trigger("LATE")
        wait_for(lambda: late in line.jobs)
        wait_for(lambda: station.signals().result_valid, timeout=2)
        assert (station.signals().result, station.signals().defect_code) == (LineOutcome.NOK, DEFECT_TIMEOUT)
        job, future, _ = line.jobs[late]
        result = tagged(Result(device="d", camera="cam", frame=FrameInfo(late, 8, 8), verdict={"defect": False},
                                   text="", model="m", timings_ms={}, prompt=""), job)
        station.notify(result)
        future.set_result(result)
        wait_for(lambda: station.health().counters["late_verdicts"] == 1)
        counters = station.health().counters
        assert counters["late_verdicts"] == 1 and counters["timeouts"] == 1
        assert station.signals().result == LineOutcome.NOK  # the late OK changes nothing
    finally:
        station.stop()


def test_kill_9_with_the_disk_stalled_loses_nothing_the_line_saw(tmp_path: Path) -> None:
    """Writes happen outside the station's lock, and a change is shown only once it is durable: with
    the job store's disk hung, the delivery path and the signals still answer at once, the line keeps
    seeing the last durable state (B valid, C undecided), and after kill -9 the station comes back
    exactly there: B again (its ack never reached the disk), C never shown, so ERROR 902, not OK."""
    path = tmp_path / "journal.sqlite3"
    child = subprocess.Popen([sys.executable, str(Path(__file__).with_name("station_child.py")), str(path)],
                             cwd=Path(__file__).parents[2], env={**os.environ, "PYTHONPATH": "."},
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line_out = child.stdout.readline()
        assert line_out, "the child station gave no report"
        report = json.loads(line_out)
        assert report["notify_ms"] < 500, "the delivery path waited for the stalled disk"
        assert report["signals_ms"] < 500, "reading the signals waited for the stalled disk"
        assert report["ack_pending"], "the ack of B cannot be durable on a hung disk"
        seen = report["seen"]
        expected = (True, report["b"], int(LineOutcome.NOK))
        assert (seen["result_valid"], seen["inspection_seq"], seen["result"]) == expected
        assert seen["buffer_count"] == 1 and seen["busy"], "C's verdict is not shown before it is durable"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        if child.stdout is not None:
            child.stdout.close()

    again = LineJobs(path)
    station = running(station_config(), again, Line())
    try:
        s = station.signals()
        assert (s.result_valid, s.inspection_seq, s.part_id, s.result) == (True, report["b"], "B", LineOutcome.NOK)
        assert s.buffer_count == 2
        assert station.ack_result(report["b"])
        s = station.signals()
        assert (s.inspection_seq, s.part_id, s.result, s.defect_code) == \
            (report["c"], "C", LineOutcome.ERROR, DEFECT_INTERRUPTED)
        assert station.ack_result(report["c"])
        assert station.trigger("D") == report["c"] + 1
    finally:
        station.stop()
        again.close()


def test_signals_answer_while_a_trigger_is_written_and_show_it_only_once_durable(tmp_path: Path) -> None:
    """A trigger being written on a slow disk: this station's signals and another station's on the same
    store answer at once meanwhile (no lock is held across the write); the trigger shows (TriggerAck,
    InspectionSeq) only when it is durable."""
    store = LineJobs(tmp_path / "journal.sqlite3")
    gate = threading.Event()
    commit = store._commit
    held = threading.Event()

    def slow_commit() -> None:
        if not gate.is_set():
            held.set()
            gate.wait(10)
        commit()
    store._commit = slow_commit  # type: ignore[method-assign]
    one = running(station_config(name="one"), store, Line())
    two = running(station_config(name="two"), store, Line())
    try:
        shown = one.request_trigger("SLOW")
        assert held.wait(5)
        t0 = time.perf_counter()
        s, other = one.signals(), two.signals()
        assert time.perf_counter() - t0 < 0.5, "reading the signals waited for the disk (held 10 s)"
        assert not s.trigger_ack and not s.ready and s.inspection_seq == 0, "not shown before it is durable"
        assert other.ready and not other.busy
        assert not shown.done()
        gate.set()
        assert shown.result(5) == 1
        s = one.signals()
        assert s.trigger_ack and s.inspection_seq == 1 and s.part_id == "SLOW"
        row = store.job("one", 1)
        assert row is not None and row["part_id"] == "SLOW"
    finally:
        gate.set()
        one.stop()
        two.stop()
        store.close()


def test_a_watcher_that_acknowledges_on_the_writers_thread_does_not_wait_for_itself(jobs: LineJobs) -> None:
    """A durable change is shown from the job store's writer thread; a watcher there that acks (and so
    waits for another write) must get it committed inline, not deadlock the writer."""
    line = Line()
    station = running(station_config(), jobs, line)
    acked: list[bool] = []

    def ack_when_valid(s: Signals) -> None:
        if s.result_valid and not acked:
            acked.append(station.ack_result(s.inspection_seq))
    station.watch(ack_when_valid)
    try:
        seq = station.trigger("SELF")
        wait_for(lambda: seq in line.jobs)
        line.verdict(seq, {"defect": False})
        wait_for(lambda: acked == [True], timeout=5)
        assert station.health().counters["acks"] == 1 and not station.signals().result_valid
        assert station.trigger("NEXT") == seq + 1  # the writer still commits
    finally:
        station.stop()


def test_a_watcher_that_acknowledges_off_the_writers_thread_does_not_deadlock_the_writer(tmp_path: Path) -> None:
    """A watcher called on the clock thread (a heartbeat) that acks waits for the writer while it holds
    the station's delivery; the writer, showing that ack, must not wait for the delivery in turn (it
    did: the clock and the writer, and so every station's durable writes, stopped for good)."""
    store = LineJobs(tmp_path / "journal.sqlite3")
    line = Line()
    station = running(station_config(), store, line)
    acked: list[bool] = []

    def ack_off_the_writer(s: Signals) -> None:
        if s.result_valid and not acked and threading.get_ident() != store._writer_ident:
            acked.append(station.ack_result(s.inspection_seq))
    station.watch(ack_off_the_writer)
    seq = station.trigger("CLOCK")
    wait_for(lambda: seq in line.jobs)
    line.verdict(seq, {"defect": False})
    wait_for(lambda: acked == [True], timeout=10)  # on deadlock: fails here (the store is left, not closed)
    assert station.trigger("NEXT") == seq + 1
    hb = station.signals().heartbeat
    wait_for(lambda: station.signals().heartbeat != hb)  # the clock turns again
    station.stop()
    store.close()


def test_a_retried_ack_of_a_job_already_acknowledged_says_true(jobs: LineJobs) -> None:
    """A PLC whose ResultAck(JobId) response was lost calls it again: that job is acknowledged, so the
    answer is True (it said False, which a PLC takes for a failed ack), and nothing else is cleared."""
    line = Line()
    station = running(station_config(), jobs, line)
    try:
        first = station.trigger("PART-1")
        station.release_trigger()
        wait_for(lambda: first in line.jobs)
        line.verdict(first, {"defect": False})
        wait_for(lambda: station.signals().ready)
        second = station.trigger("PART-2")
        station.release_trigger()
        wait_for(lambda: second in line.jobs)
        line.verdict(second, {"defect": True})
        wait_for(lambda: station.signals().buffer_count == 2 and station.signals().result_valid)
        assert station.ack_result(first) is True
        assert station.ack_result(first) is True  # the retry
        s = station.signals()
        assert s.buffer_count == 1 and s.inspection_seq == second and s.result_valid  # the second still waits
        assert station.ack_result(second + 1) is False  # a job that never was is still refused
        assert station.ack_result(second) is True
    finally:
        station.stop()


def test_a_nok_rule_whose_regex_does_not_finish_is_error_never_ok() -> None:
    """The rules engine counts a regex that times out as no match: for a NOK rule that was OK."""
    from edge_runtime.lineio import recipes
    from edge_runtime.lineio.signals import DEFECT_UNDECIDED

    cfg = station_config(nok_when=[{"field": "verdict.notes", "regex": "^(a|a)+$"}])  # exponential on a…!
    job = JobRequest("s1", 1, "P", "", "cam", None, 0.0)

    def judged(notes: str) -> tuple[LineOutcome, int]:
        return recipes.judge(cfg, tagged(Result(device="d", camera="cam", frame=FrameInfo(1, 8, 8),
                                                    verdict={"notes": notes}, text="", model="m",
                                                    timings_ms={}, prompt=""), job))
    assert judged("a" * 40 + "!") == (LineOutcome.ERROR, DEFECT_UNDECIDED)
    assert judged("aaaa") == (LineOutcome.NOK, DEFECT_NOK)
    assert judged("b") == (LineOutcome.OK, 0)
    long = station_config(nok_when=[{"field": "verdict.notes", "regex": "crack"}])
    verdict = {"notes": "x" * 12_000 + " crack"}  # past the 10,000 characters a rule reads
    assert recipes.judge(long, tagged(Result(device="d", camera="cam", frame=FrameInfo(1, 8, 8), verdict=verdict,
                                                 text="", model="m", timings_ms={}, prompt=""), job)) == \
        (LineOutcome.NOK, DEFECT_NOK)
