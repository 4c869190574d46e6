"""`Station`: the handshake state machine of one station (the package docstring says how it works)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

from edge_runtime.config.line_io import PART_ID_MAX, TEXT_ID, StationConfig
from edge_runtime.core.errors import StorageFull
from edge_runtime.core.result import Result
from edge_runtime.core.sink import SinkHealth
from edge_runtime.core.supervise import RateLimitedLog, SupervisedThread
from edge_runtime.lineio import recipes
from edge_runtime.lineio.signals import (
    DEFECT_INSPECTION_FAILED,
    DEFECT_NO_FRAME,
    DEFECT_TIMEOUT,
    HEARTBEAT_MOD,
    JobStore,
    LineOutcome,
    LineRefused,
    Signals,
    StartJob,
)
from edge_runtime.lineio.station.job import Job
from edge_runtime.lineio.station.restore import restored_jobs
from edge_runtime.lineio.station.watchers import Watchers

log = logging.getLogger(__name__)

class Station:
    """The handshake state machine of one station. Thread-safe; `watch` callbacks run one at a time,
    in order, on the thread that changed the state (for a durable change: the job store's writer) or
    on the one delivering an earlier change at that moment, and must not block; one that triggers or
    acks waits safely (the store commits inline on its own thread, and the writer never waits for a
    delivery)."""

    def __init__(self, cfg: StationConfig, jobs: JobStore, start: StartJob,
                 warm: Callable[[], bool] = lambda: True, fault: Callable[[], str | None] = lambda: None,
                 camera_prompt: str | None = None) -> None:
        self.name = cfg.name
        self.cfg = cfg
        self._jobs = jobs
        self._start = start
        self._warm, self._fault = warm, fault
        self._camera_prompt = camera_prompt
        self._lock = threading.RLock()
        self._fifo: deque[Job] = deque()  # in-flight and decided jobs, in trigger order
        self._acked: deque[int] = deque(maxlen=64)  # the last jobs whose ack cleared them (a retried ack)
        self._captures: queue.Queue[Job] = queue.Queue()
        self._enabled = cfg.enabled_at_start
        self._trigger_ack = False
        self._trigger_held = False  # the line's Trigger is up (TriggerAck shows only while it is)
        self._busy_until_acked = False  # GPIO auto-ack: a decided result is busy until signalled
        self._acquiring: Job | None = None
        self._last: Job | None = None
        self._overrun = False
        self._heartbeat = 0
        self._ready_now = False
        self._fault_now: str | None = None
        self._stop = threading.Event()
        self._bad_log = RateLimitedLog(log)
        self.counters: dict[str, int] = {"triggers": 0, "refused": 0, "results_ok": 0, "results_nok": 0,
                                         "results_error": 0, "timeouts": 0, "overruns": 0, "acks": 0,
                                         "late_verdicts": 0, "watcher_errors": 0}
        self.refusals: dict[str, int] = {}
        self._watchers = Watchers(self.name, self.signals, self.counters, self._bad_log)
        # Jobs decided NOK by their deadline whose verdict has not come yet: the one late verdict each
        # may still count (whichever path brings it first, the sink or the inspection's future).
        self._timed_out: dict[int, None] = {}
        self._seq = jobs.last_seq(self.name)
        for job in restored_jobs(cfg, jobs):
            self._fifo.append(job)
            self._last = job
        if len(self._fifo) >= cfg.fifo_depth:
            self._overrun = True
        self._threads = [SupervisedThread(f"station-{self.name}-capture", self._capture_loop, self._stop, log),
                         SupervisedThread(f"station-{self.name}-clock", self._clock_loop, self._stop, log)]

    # ---- the line's side ----------------------------------------------------------------------

    def set_trigger_enable(self, on: bool) -> None:
        with self._lock:
            self._enabled = bool(on)
        self._watchers.changed()

    def trigger(self, part_id: str = "", recipe: str | None = None) -> int:
        """A rising edge of Trigger: returns the InspectionSeq (job id) once the trigger is durable and
        shown (TriggerAck), or raises LineRefused. Waits for the job store's write (a method call
        returns the job id); the level protocols use `request_trigger`, which does not."""
        return int(self._jobs.wait(self.request_trigger(part_id, recipe)))

    def request_trigger(self, part_id: str = "", recipe: str | None = None) -> Future[int]:
        """A rising edge of Trigger that does not wait for the disk: a refusal raises LineRefused at once;
        the job shows (TriggerAck, InspectionSeq, Busy) once its trigger is durable. The Future holds the
        job id, or LineRefused("not_ready") when the trigger could not be stored."""
        try:
            job = self._reserve(part_id, recipe)
        except LineRefused as exc:
            self._count_refusal(exc.reason)
            raise
        shown: Future[int] = Future()
        self._watchers.changed()  # Ready is low while the trigger is written
        written = self._jobs.triggered(self.name, job.seq, job.part_id, job.recipe)
        written.add_done_callback(lambda f: self._trigger_written(job, f, shown))
        return shown

    def _count_refusal(self, reason: str) -> None:
        with self._lock:
            self.counters["refused"] += 1
            self.refusals[reason] = self.refusals.get(reason, 0) + 1
        self._watchers.changed()

    def _reserve(self, part_id: str, recipe: str | None) -> Job:
        if not isinstance(part_id, str) or len(part_id) > PART_ID_MAX or not TEXT_ID.fullmatch(part_id):
            raise LineRefused("bad_part_id", f"PartId must be at most {PART_ID_MAX} printable ASCII characters")
        recipe_id = recipes.recipe_id(self.cfg, recipe)
        with self._lock:
            if not self._ready_now or self._fault_now is not None:
                raise LineRefused("not_ready", f"station {self.name} is not ready"
                                  + (f" ({self._fault_now})" if self._fault_now else " (model not warm)"))
            if not self._enabled:
                raise LineRefused("disabled", f"TriggerEnable of station {self.name} is off")
            if self._acquiring is not None:
                raise LineRefused("busy", f"station {self.name} is still taking the frame of job "
                                  f"{self._acquiring.seq}")
            if len(self._fifo) >= self.cfg.fifo_depth:
                if not self._overrun:
                    self.counters["overruns"] += 1
                self._overrun = True
                raise LineRefused("overrun", f"the result FIFO of station {self.name} is full "
                                  f"({self.cfg.fifo_depth}); acknowledge results first")
            # The number is taken now (a restart must not hand it out again once it is written); the
            # job holds the station (`busy` for the next trigger) until it is written and its frame taken.
            self._seq += 1
            job = Job(self._seq, part_id, recipe_id, time.monotonic() + self.cfg.result_deadline_ms / 1000)
            self._acquiring = job
            self._trigger_held = True
            return job

    def _trigger_written(self, job: Job, written: Future[None], shown: Future[int]) -> None:
        """The trigger is durable (or failed): only now does the line see the job."""
        error = written.exception()
        with self._lock:
            if error is None:
                self._fifo.append(job)
                self._last = job
                self._trigger_ack = self._trigger_held  # not when the line dropped Trigger meanwhile
                self.counters["triggers"] += 1
                self._captures.put(job)
            else:
                if self._acquiring is job:
                    self._acquiring = None
                self.counters["refused"] += 1
                self.refusals["not_ready"] = self.refusals.get("not_ready", 0) + 1
        self._watchers.changed()
        if error is None:
            shown.set_result(job.seq)
            return
        self._bad_log.log(logging.ERROR, "station %s: trigger %d could not be stored: %s", self.name, job.seq, error)
        shown.set_exception(LineRefused("not_ready", f"station {self.name}: the trigger could not be stored "
                                        f"({error})"))

    def release_trigger(self) -> None:
        """The line dropped Trigger (level protocols): TriggerAck follows it down."""
        with self._lock:
            self._trigger_ack = False
            self._trigger_held = False
        self._watchers.changed()

    def ack_result(self, seq: int | None = None) -> bool:
        """ResultAck: clears the FIFO head when it holds a result (and `seq` matches, when given).
        Returns once the ack is durable and the next result (if any) is shown. A job acknowledged
        already answers True again: a PLC whose response was lost retries the call."""
        shown = self.request_ack(seq)
        if shown is None:
            with self._lock:
                return seq is not None and seq in self._acked
        return bool(self._jobs.wait(shown))

    def acknowledged(self, seq: int) -> bool:
        """Job `seq` is acknowledged (one of the last 64 since the start) or its ack is being written: an
        ack of it again is the same ack (a retried call, a redelivered command), not another."""
        with self._lock:
            head = self._fifo[0] if self._fifo else None
            return seq in self._acked or (head is not None and head.seq == seq and head.acking)

    def request_ack(self, seq: int | None = None) -> Future[bool] | None:
        """ResultAck that does not wait for the disk. None when there is nothing to clear (no decided
        head, another job's id, or the head's ack already on its way: the line still sees that head, so
        a second edge means the same result); the head leaves the FIFO once the ack is durable."""
        with self._lock:
            head = self._fifo[0] if self._fifo else None
            if (head is None or head.result == LineOutcome.NONE or head.acking
                    or (seq is not None and seq != head.seq)):
                return None
            head.acking = True
        shown: Future[bool] = Future()
        written = self._jobs.acked(self.name, head.seq)
        written.add_done_callback(lambda f: self._ack_written(head, f, shown))
        return shown

    def _ack_written(self, head: Job, written: Future[None], shown: Future[bool]) -> None:
        error = written.exception()
        with self._lock:
            head.acking = False
            cleared = error is None and bool(self._fifo) and self._fifo[0] is head
            if cleared:
                self._fifo.popleft()
                self._acked.append(head.seq)
                self.counters["acks"] += 1
                if len(self._fifo) < self.cfg.fifo_depth:
                    self._overrun = False
        if error is not None:
            self._bad_log.log(logging.ERROR, "station %s: the ack of job %d could not be stored: %s",
                              self.name, head.seq, error)
        self._watchers.changed()
        shown.set_result(cleared)

    def hold_busy_until_acked(self) -> None:
        """Busy stays high while the FIFO holds a decided result too (GPIO with auto_ack: a result not
        yet pulsed out is still work in progress for the cell)."""
        with self._lock:
            self._busy_until_acked = True
        self._watchers.changed()

    def signals(self) -> Signals:
        with self._lock:
            head = self._fifo[0] if self._fifo else None
            valid = head is not None and head.result != LineOutcome.NONE
            shown = head if valid else self._last
            decided = sum(1 for j in self._fifo if j.result != LineOutcome.NONE)
            ready = (self._ready_now and self._fault_now is None and self._enabled and self._acquiring is None
                     and len(self._fifo) < self.cfg.fifo_depth)
            return Signals(
                trigger_enable=self._enabled, ready=ready, trigger_ack=self._trigger_ack,
                busy=any(j.result == LineOutcome.NONE for j in self._fifo)
                or (self._busy_until_acked and bool(self._fifo)),
                acquisition_done=self._last is not None and self._last.acquired,
                result_valid=valid, inspection_seq=shown.seq if shown else 0,
                part_id=shown.part_id if shown else "", recipe=shown.recipe if shown else "",
                result=shown.result if (shown is not None and valid) else LineOutcome.NONE,
                defect_code=shown.defect_code if (shown is not None and valid) else 0,
                heartbeat=self._heartbeat, fault=self._fault_now is not None,
                buffer_count=decided, overrun=self._overrun)

    def watch(self, callback: Callable[[Signals], None]) -> Callable[[], None]:
        """Call `callback(signals)` on every change; returns the unsubscribe function."""
        return self._watchers.watch(callback)

    def fault_reason(self) -> str | None:
        return self._fault_now

    # ---- Sink ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._poll_health()
        for t in self._threads:
            t.start()
        self._watchers.changed()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(2.0)

    def notify(self, result: Result) -> None:
        """A journaled verdict; only this station's are taken. Returns at once, never raises."""
        if result.station != self.name or result.inspection_seq is None:
            return
        try:
            self._verdict(result.inspection_seq, result)
        except Exception:  # noqa: BLE001 - the delivery thread must not die for one station
            self._bad_log.log(logging.ERROR, "station %s: could not take verdict %s", self.name, result.id,
                              exc_info=True)

    def health(self) -> SinkHealth:
        with self._lock:
            counters = {**self.counters, "refusals": dict(self.refusals), "fifo": len(self._fifo),
                        "seq": self._seq}
            fault = self._fault_now
        return SinkHealth(ok=fault is None, detail=fault or "", counters=counters)

    def threads(self) -> list[SupervisedThread]:
        return list(self._threads)

    # ---- outcomes -----------------------------------------------------------------------------

    def _find(self, seq: int) -> Job | None:
        return next((j for j in self._fifo if j.seq == seq), None)

    def _verdict(self, seq: int, result: Result) -> None:
        outcome, code = recipes.judge(self.cfg, result)
        self._decide(seq, outcome, code, result.id)

    def _decide(self, seq: int, outcome: LineOutcome, code: int, result_id: str | None) -> bool:
        """Record a job's outcome; the line sees it once it is durable. False: decided already."""
        with self._lock:
            job = self._find(seq)
            if job is None or job.result != LineOutcome.NONE or job.deciding:
                # Already decided: a verdict for a job its deadline turned NOK is late (counted once);
                # the same on-time verdict coming a second way (sink, then the future) is not.
                if result_id is not None and seq in self._timed_out:
                    del self._timed_out[seq]
                    self.counters["late_verdicts"] += 1
                return False
            job.deciding = True
            if code == DEFECT_TIMEOUT:
                self._timed_out[seq] = None
                while len(self._timed_out) > 4 * self.cfg.fifo_depth + 64:  # verdicts that never came
                    del self._timed_out[next(iter(self._timed_out))]
        written = self._jobs.decided(self.name, seq, int(outcome), code, result_id)
        written.add_done_callback(lambda f: self._decision_written(job, outcome, code, result_id, f))
        return True

    def _decision_written(self, job: Job, outcome: LineOutcome, code: int, result_id: str | None,
                          written: Future[None]) -> None:
        error = written.exception()
        with self._lock:
            job.deciding = False
            if error is not None:  # not shown; the deadline (or a verdict still to come) decides again
                self._timed_out.pop(job.seq, None)
            else:
                job.result, job.defect_code, job.result_id = outcome, code, result_id
                if not job.acquired and outcome != LineOutcome.OK and self._acquiring is job:
                    self._acquiring = None  # it will never be taken; let the next part come
                counter = {LineOutcome.OK: "results_ok", LineOutcome.NOK: "results_nok"}.get(outcome, "results_error")
                self.counters[counter] += 1
                if code == DEFECT_TIMEOUT:
                    self.counters["timeouts"] += 1
        if error is not None:
            self._bad_log.log(logging.ERROR, "station %s: the outcome of job %d could not be stored: %s",
                              self.name, job.seq, error)
            return
        self._watchers.changed()

    def _acquired(self, job: Job) -> None:
        with self._lock:
            job.acquired = True
            if self._acquiring is job:
                self._acquiring = None
        self._watchers.changed()

    def _done(self, seq: int, future: Future[Result]) -> None:
        """The inspection's future resolved. In the daemon the sink (`notify`) has usually decided the
        job already; this decides only a job still open (or a failed inspection) and takes a late
        verdict the sink has not brought yet."""
        exc = future.exception()
        if exc is not None:
            log.warning("station %s: inspection of job %d failed: %s", self.name, seq, exc)
            self._decide(seq, LineOutcome.ERROR, DEFECT_INSPECTION_FAILED, None)
            return
        self._verdict(seq, future.result())  # decided already (by notify): _decide knows, late or not

    # ---- threads --------------------------------------------------------------------------------

    def _capture_loop(self) -> None:
        while not self._stop.is_set():
            try:
                job = self._captures.get(timeout=0.2)
            except queue.Empty:
                continue
            if job.result != LineOutcome.NONE:
                continue
            deadline = min(job.deadline, time.monotonic() + self.cfg.acquisition_timeout_ms / 1000)
            request = recipes.job_request(self.cfg, job.seq, job.part_id, job.recipe, deadline, self._camera_prompt)
            try:
                future = self._start(request, lambda j=job: self._acquired(j))  # type: ignore[misc]
            except Exception as exc:  # noqa: BLE001 - any capture failure is this part's ERROR, not the thread's
                # No frame (901) only when the camera gave none; a frame whose inspection was refused (the
                # model's queue full) or a journal that cannot store the verdict is a failed inspection (903).
                no_frame = not job.acquired and not isinstance(exc, StorageFull)
                log.warning("station %s: %s for job %d: %s", self.name, "no frame" if no_frame else
                            "inspection refused", job.seq, exc)
                self._decide(job.seq, LineOutcome.ERROR, DEFECT_NO_FRAME if no_frame else DEFECT_INSPECTION_FAILED,
                             None)
                continue
            future.add_done_callback(lambda f, s=job.seq: self._done(s, f))  # type: ignore[misc]

    def _clock_loop(self) -> None:
        period = self.cfg.heartbeat_ms / 1000
        next_beat = time.monotonic() + period
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                due = [j.seq for j in self._fifo
                       if j.result == LineOutcome.NONE and not j.deciding and j.deadline <= now]
                pending = [j.deadline for j in self._fifo if j.result == LineOutcome.NONE and not j.deciding]
            for seq in due:
                self._decide(seq, LineOutcome.NOK, DEFECT_TIMEOUT, None)  # never a default OK
            if now >= next_beat:
                next_beat = max(next_beat + period, now)
                with self._lock:
                    self._heartbeat = (self._heartbeat + 1) % HEARTBEAT_MOD
                self._poll_health()
                self._watchers.changed()
            wake = min([next_beat, *pending])
            self._stop.wait(max(0.001, min(wake - time.monotonic(), period)))

    def _poll_health(self) -> None:
        try:
            ready, fault = bool(self._warm()), self._fault()
        except Exception as exc:  # noqa: BLE001 - a failing probe is a fault, not a dead clock
            ready, fault = False, f"health probe failed: {exc}"
        with self._lock:
            self._ready_now, self._fault_now = ready, fault
