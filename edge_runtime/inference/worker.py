"""The inspection worker: two supervised stages (encode, then generate) behind the one queue, and the
anomaly gate's two threads (score, deliver gated OKs) between them.

Stage 1 decodes, preprocesses and encodes frame N+1 while stage 2 generates frame N; frames of
several cameras that are ready together are generated as one batch. A frame of a camera with an anomaly
gate goes from stage 1 to the gate's thread, which scores it while stage 1 encodes the next one; skip_ok's
gated OKs are delivered by a thread of their own, the rest go on to stage 2. Every Result is journaled
before any sink (MQTT, the event stream, line I/O) sees it: delivery is
`verdicts/pipeline.VerdictPipeline.deliver`, handed in as `deliver`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from edge_runtime.core.batch import BatchJob, ChatWork, Encoded
from edge_runtime.core.errors import (
    InferenceError,
    InputError,
    QueueFull,
    StorageFull,
    naming_answer,
    naming_prompt,
)
from edge_runtime.core.governor_gate import Gate
from edge_runtime.core.inspection_queue import Deliver, InspectionQueue, InspectionRequest, ScheduleStats
from edge_runtime.core.result import Result
from edge_runtime.core.sink import ResultJournal
from edge_runtime.core.supervise import RateLimitedLog, SupervisedThread

if TYPE_CHECKING:  # the worker runs whatever inspector the daemon hands it; typing needs no engines
    from edge_runtime.inference.anomaly.step import GateStep
    from edge_runtime.inference.inspector import Inspector, Work
    from edge_runtime.inference.llm.feed import Generation

    # What stage 1 hands to stage 2: the embeddings with the model and the inspection programs that made
    # them (a reload may replace either meanwhile), the encoder's failure, or None (not encoded ahead: jobs,
    # overlap off).
    Staged = tuple[Inspector, object, Encoded] | Exception | None

log = logging.getLogger(__name__)  # the result lines are counted by tests/app/test_lifecycle.py
# Requests a client sent (REST, OpenAI, an MQTT or REST trigger): a refused input is answered to it as a
# 4xx. Any other (a camera's schedule, a line's trigger, an escalation) asks what the config says.
CLIENT_TRIGGERS = frozenset({"api", "trigger"})

T = TypeVar("T")


def _drained(items: queue.Queue[T], stop: threading.Event) -> Iterator[T]:
    """Each item of the queue as it comes, until `stop` is set and none is left."""
    while True:
        try:
            yield items.get(timeout=0.5)
        except queue.Empty:
            if stop.is_set():
                return


class InspectionWorker:
    """Takes requests off the queue, runs the inspector, hands each Result to `deliver`."""

    def __init__(self, inspections: InspectionQueue, get_inspector: Callable[[], Inspector],
                 journal: ResultJournal, deliver: Deliver, gate: Gate,
                 stats_for: Callable[[str], ScheduleStats | None], overlap: bool = True, max_batch: int = 4,
                 gates: GateStep | None = None, energy: Callable[[float, float], float | None] | None = None) -> None:
        self.inspections = inspections
        self.get_inspector = get_inspector
        self.journal = journal
        self.gate = gate
        self.stats_for = stats_for
        self.deliver = deliver  # journal, then the sinks (verdicts/pipeline.py); raises StorageFull
        self.heartbeat = time.monotonic()
        self.errors = 0
        self.not_journaled = 0  # verdicts refused or lost to a full disk (none of them was published)
        self._full_log = RateLimitedLog(log)
        self._camera_logs: dict[tuple[str, str], RateLimitedLog] = {}  # per camera and kind of failure
        self.batches = 0  # generations that ran several frames or chats as parallel sequences
        self.peak_batch = 0  # the most sequences one of them ran at once
        self.energy = energy  # joules between two instants (the governor's sensor)
        self.last_energy_j: float | None = None
        self.overlap = overlap
        self.gates = gates  # the anomaly gate in front of the model (inference/anomaly/step.py)
        self.max_batch = max_batch if overlap else 1  # batching needs frames encoded ahead of generation
        self._stop = threading.Event()
        # Stage 1 (encoder) hands each request to stage 2 (language model) through a one-slot queue,
        # so frame N+1 is decoded, preprocessed and encoded while frame N is generated.
        self._handoff: queue.Queue[tuple[InspectionRequest, Staged]] = queue.Queue(maxsize=self.max_batch)
        self._encoder = SupervisedThread("encoder", self._encode_loop, self._stop, log)
        self._thread = SupervisedThread("inspector", self._run, self._stop, log)
        # The anomaly gate looks at each encoded frame of a gated camera on a thread of its own (`gate`: the
        # nearest-neighbour search, on the CPU), so stage 1 encodes the next frame meanwhile (on a GPU).
        self._sifting: queue.Queue[tuple[InspectionRequest, Staged]] = queue.Queue(maxsize=self.max_batch)
        self._sift_stop = threading.Event()  # set once stage 1 has stopped: the queue is drained, then it ends
        self._sift_thread = SupervisedThread("gate", self._sift_loop, self._sift_stop, log)
        # skip_ok's gated OKs, delivered (journal, evidence, sinks) beside the gate, which meanwhile looks
        # at the next frame. Each holds its frame: as many places as the hand-off, so a slow disk
        # holds the gate (then stage 1) back instead of holding frames.
        self._gated: queue.Queue[tuple[InspectionRequest, Result]] = queue.Queue(maxsize=self.max_batch)
        self._gated_stop = threading.Event()  # set once the gate has stopped: the queue is drained, then it ends
        self._gated_thread = SupervisedThread("gate-delivery", self._gated_loop, self._gated_stop, log)

    def threads(self) -> list[SupervisedThread]:
        gated = [self._sift_thread, self._gated_thread] if self.gates is not None else []
        return [self._encoder, self._thread, *gated]

    def start(self) -> None:
        self._encoder.start()
        self._thread.start()
        if self.gates is not None:
            self._sift_thread.start()
            self._gated_thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the inspection in progress (its result is journaled), then stop."""
        self._stop.set()
        self.inspections.wake()
        self._encoder.join(timeout)
        self._sift_stop.set()  # stage 1 hands the gate no more frames: it looks at those queued, then ends
        self._sift_thread.join(timeout)
        self._gated_stop.set()  # the gate queues no more gated OKs: deliver those queued, then end
        for thread in (self._gated_thread, self._thread):
            thread.join(timeout)
        self._refuse_leftovers()

    def _refuse_leftovers(self) -> None:
        """Answer every request that never started, so no caller waits forever. The threads have stopped:
        a request handed on after the next thread's last look is still in its queue."""
        leftovers: list[InspectionRequest] = []
        for staged in (self._handoff, self._sifting, self._gated):
            while True:
                try:
                    leftovers.append(staged.get_nowait()[0])
                except queue.Empty:
                    break
        while self.inspections.depth:
            request = self.inspections.get(timeout=0)
            if request is not None:  # None: the wake-up marker
                leftovers.append(request)
        for request in leftovers:
            if not request.future.done():
                request.future.set_exception(QueueFull("the daemon is shutting down"))

    def stalled(self, max_busy_s: float) -> str | None:
        """Why the pipeline does not turn: a stage's thread ended, one has been on a single piece of work
        (a frame's encode, the gate's look, a batch, a delivery) for `max_busy_s`, or stage 2's loop
        stopped turning. None while all is well."""
        for thread in self.threads():
            if not thread.is_alive():
                return f"the {thread.name} thread has ended"
            busy = thread.busy_s()
            if busy is not None and busy >= max_busy_s:
                return f"the {thread.name} thread has been on one piece of work for {busy:.0f} s"
        if self._thread.busy_s() is None and time.monotonic() - self.heartbeat >= 5.0:
            return "the inspector thread has not turned for 5 s"
        return None

    def alive(self, max_busy_s: float) -> bool:
        """True while every stage turns and none has hung on one piece of work."""
        return self.stalled(max_busy_s) is None

    def idle(self) -> bool:
        """No stage is working on anything now (the queues may still hold work)."""
        return all(thread.busy_s() is None for thread in self.threads())

    def _encode_loop(self) -> None:
        while not self._stop.is_set():
            request = self.inspections.get(timeout=1.0)
            if request is None or not request.future.set_running_or_notify_cancel():
                continue
            if request.journal and self.journal.refusing():
                # The disk is full: refuse before the model spends anything on a verdict nobody gets.
                self._storage_full(request, StorageFull("disk full: the journal cannot store results"))
                continue
            encoded: Staged = None
            if self.overlap and request.job is None and request.image is not None:
                with self._encoder.busy():
                    encoded = self._encode(request)
            request.encoded.set()
            gated = self.gates is not None and isinstance(encoded, tuple) and self.gates.gate_for(request) is not None
            self._hand_on(self._sifting if gated else self._handoff, request, encoded)

    def _encode(self, request: InspectionRequest) -> Staged:
        """Stage 1's encode of a frame: the embeddings with the model and programs they were made under,
        or the exception for stage 2 to report."""
        assert request.image is not None
        inspector = None
        try:
            inspector = self.get_inspector()
            programs = inspector.programs_loaded  # before the encode: a reload during it shows as a change
            return inspector, programs, inspector.encode_frame(request.camera, request.image, request.clip,
                                                               request.program)
        except Exception as exc:  # noqa: BLE001 - handed on and reported by stage 2
            # A reload closed the model meanwhile (its encoder refuses): stage 2 encodes it again
            # with the new one, as it does a frame encoded under replaced programs (_usable).
            if inspector is not None and inspector is not self.get_inspector():
                return None
            return request.chat.image_refused(exc, 0) if request.chat and isinstance(exc, InputError) else exc

    def _hand_on(self, to: queue.Queue[tuple[InspectionRequest, Staged]], request: InspectionRequest,
                 encoded: Staged) -> None:
        """Into the gate's queue or stage 2's hand-off, waiting while it is full (not past stop)."""
        while not self._stop.is_set():
            try:
                to.put((request, encoded), timeout=0.5)
                return
            except queue.Full:
                continue
        request.future.set_exception(QueueFull("the daemon is shutting down"))

    def _sift_loop(self) -> None:
        """The gate's look at each frame stage 1 encoded for a gated camera, in the order encoded: skip_ok's
        gated OKs go to the delivery thread, every other frame to stage 2. Until stopped with none left."""
        for request, encoded in _drained(self._sifting, self._sift_stop):
            assert self.gates is not None and isinstance(encoded, tuple)
            if self._usable(encoded) is None:
                # A reload replaced the model or the programs since the encode: the gates now in place were
                # loaded for the new encoder. Stage 2 encodes the frame again and the gate looks there.
                self._hand_on(self._handoff, request, encoded)
                continue
            try:
                with self._sift_thread.busy():  # the wait for room among the gated OKs counts: a stuck delivery
                    rest = self.gates.sift([(request, encoded[2])], encoded[0], self.gate.decision().state,
                                           self._deliver, self._failed, answer=self._queue_gated)
            except Exception as exc:  # noqa: BLE001 - one frame's failure; the gate goes on with the next
                self._failed(request, exc)
                continue
            if rest:
                self._hand_on(self._handoff, request, encoded)

    def _queue_gated(self, request: InspectionRequest, result: Result) -> None:
        """A gated OK to the delivery thread (the gate waits while its queue is full)."""
        while not self._gated_stop.is_set():
            try:
                self._gated.put((request, result), timeout=0.5)
            except queue.Full:
                continue
            if self._gated_stop.is_set() and not self._gated_thread.is_alive():
                self._refuse_leftovers()  # the gate outlived stop's wait: nobody else will answer it
            return
        request.future.set_exception(QueueFull("the daemon is shutting down"))

    def _gated_loop(self) -> None:
        """Deliver the gated OKs in the order the gate queued them, until stopped with none left."""
        for request, result in _drained(self._gated, self._gated_stop):
            try:
                with self._gated_thread.busy():
                    delivered = self._deliver(request, result)
            except Exception as exc:  # noqa: BLE001 - e.g. a full disk: that caller hears it
                self._failed(request, exc)
            else:
                request.future.set_result(delivered)

    def _run(self) -> None:
        while not self._stop.is_set() or not self._handoff.empty():
            self.heartbeat = time.monotonic()
            try:
                ready = [self._handoff.get(timeout=1.0)]
            except queue.Empty:
                continue
            while len(ready) < self.max_batch:  # other cameras' frames that are ready now join the batch
                try:
                    ready.append(self._handoff.get_nowait())
                except queue.Empty:
                    break
            with self._thread.busy():
                try:
                    self._generate(ready)
                finally:  # before busy ends, so the watch never sees it idle with the beat of before the batch
                    self.heartbeat = time.monotonic()
        # Refuse whatever is still queued so no caller waits forever.
        while (leftover := self.inspections.get(timeout=0)) is not None:
            leftover.future.set_exception(QueueFull("the daemon is shutting down"))

    def _generate(self, ready: list[tuple[InspectionRequest, Staged]]) -> None:
        """Stage 2's turn: the frames (and chats, jobs) handed on together, generated as one batch where
        they can be."""
        work = [(request, self._usable(encoded)) for request, encoded in ready
                if not self._dropped_after_switch(request, encoded)]
        if self.gates is not None:  # skip_ok's gated frames are answered here, without the model
            work = self.gates.sift(work, self.get_inspector(), self.gate.decision().state,
                                   self._deliver, self._failed)
        if any(request.chat is not None for request, _ in work):
            self._serve(work)
            return
        batchable = [(r, e) for r, e in work
                     if r.job is None and e is not None and not isinstance(e, Exception)]
        batched = {id(r) for r, _ in batchable} if len(batchable) > 1 else set()
        if batched:
            self._inspect_batch(batchable)
        for request, encoded in work:
            if id(request) not in batched:
                self._finish(request, encoded)

    def _usable(self, encoded: Staged) -> Encoded | Exception | None:
        """The embeddings, unless a reload replaced the model that computed them or the inspection programs
        they were encoded under (then: encode again, so each frame is asked under the program it was cut by)."""
        if encoded is None or isinstance(encoded, Exception):
            return encoded
        inspector, programs, enc = encoded
        return enc if inspector is self.get_inspector() and programs is inspector.programs_loaded else None

    def _dropped_after_switch(self, request: InspectionRequest, encoded: Staged) -> bool:
        """A camera's own frame encoded under programs a reload replaced, its camera now asking about a clip:
        one frame cannot be asked that (clips come from the camera's trigger, which now takes them), so it is
        dropped quietly instead of being encoded again and failing as a misconfigured question."""
        if not isinstance(encoded, tuple) or self._usable(encoded) is not None or request.clip is not None \
                or request.trigger in CLIENT_TRIGGERS or request.line is not None or request.image is None:
            return False
        try:
            program = self.get_inspector().program_of(request.camera, request.program)
        except Exception:  # noqa: BLE001 - no model, or the name is gone: encoded again, failing as before
            return False
        if program is None or program.config is None or program.config.clip is None:
            return False
        log.debug("inspection of %s: frame %d encoded before the switch to program %s (a clip) dropped",
                  request.camera, request.seq, program.name)
        if self.gates is not None:
            self.gates.forget(request)
        request.future.set_exception(InferenceError(
            f"frame {request.seq} of camera {request.camera} dropped: encoded before a reload switched it to a clip"))
        return True

    def _finish(self, request: InspectionRequest, encoded: Encoded | Exception | None) -> None:
        try:
            if isinstance(encoded, Exception):
                raise encoded
            result = self._inspect(request, encoded)
        except Exception as exc:  # noqa: BLE001 - reported to the caller; the loop goes on
            self._failed(request, exc)
        else:
            request.future.set_result(result)

    def _failed(self, request: InspectionRequest, exc: Exception) -> None:
        if self.gates is not None:
            self.gates.forget(request)
        if isinstance(exc, StorageFull):
            self._storage_full(request, exc)
            return
        if isinstance(exc, InputError) and request.trigger in CLIENT_TRIGGERS:
            # the client's mistake, answered with a 4xx: not our error
            if request.chat is None:  # the model layer names the chat's fields: a frame's client sets `prompt`
                exc = naming_prompt(exc)
            else:  # the answer's room by the field the chat's client sent, or its messages if it sent none
                exc = naming_answer(exc, request.chat.max_tokens_field)
            log.info("inspection of %s refused: %s", request.camera, exc)
            request.future.set_exception(exc)
            return
        self.errors += 1
        stats = self.stats_for(request.camera)
        if stats:
            stats.errors += 1
            stats.failing += 1
        # A camera's failure repeats every frame (its question cannot be asked; a region off a frame that
        # changed size; a model that fails): counted, and said once a minute per camera and kind, not
        # 30 lines a second at 30 fps.
        kind = "config" if isinstance(exc, InputError) else type(exc).__name__
        if (request.camera, kind) not in self._camera_logs and len(self._camera_logs) >= 256:
            self._camera_logs.clear()  # cameras are bounded by the config; keep the map bounded anyway
        limited = self._camera_logs.setdefault((request.camera, kind), RateLimitedLog(log))
        if isinstance(exc, InputError):  # the camera's own question (its config's prompt or program): no 4xx
            limited.log(logging.ERROR, "inspection of %s failed: its configured question cannot be asked: %s",
                        request.camera, exc)
        else:
            limited.log(logging.ERROR, "inspection of %s failed: %s", request.camera, exc)
        request.future.set_exception(exc)

    def _storage_full(self, request: InspectionRequest, exc: StorageFull) -> None:
        """Counted, and logged once a minute (a camera at 10 fps made 10 error lines a second)."""
        self.not_journaled += 1
        self._full_log.log(logging.ERROR, "inspection: %s; verdicts are neither journaled nor published "
                           "until space returns", exc)
        request.future.set_exception(exc)

    def _inspect_batch(self, work: list[tuple[InspectionRequest, Encoded]]) -> None:
        gate = self.gate.decision()
        t0 = time.monotonic()
        jobs = [BatchJob(enc, r.camera, r.prompt, r.seq, r.capture_ms, gate.state, r.schema, r.program)
                for r, enc in work]
        try:
            outcomes = self.get_inspector().inspect_batch(jobs)
            self.batches += 1
        except Exception as exc:  # noqa: BLE001 - the whole batch failed: every caller hears it
            for request, _ in work:
                self._failed(request, exc)
            return
        energy = self.energy(t0, time.monotonic()) if self.energy is not None else None
        for (request, _), outcome in zip(work, outcomes, strict=True):
            if isinstance(outcome, Exception):
                self._failed(request, outcome)
                continue
            if energy is not None:
                outcome.energy_j = self.last_energy_j = round(energy / len(work), 4)
            try:
                delivered = self._deliver(request, outcome)
            except Exception as exc:  # noqa: BLE001 - e.g. a full disk: that caller hears it, the rest go on
                self._failed(request, exc)
            else:
                request.future.set_result(delivered)

    def _serve(self, work: list[tuple[InspectionRequest, Encoded | Exception | None]]) -> None:
        """Chat completions and camera frames as parallel sequences; what becomes ready while they run
        joins them (up to max_batch at once). A request that cannot join (a plain job, a frame not
        encoded ahead, a failed encoding) runs after, in the order it came."""
        inspector = self.get_inspector()
        requests: dict[int, InspectionRequest] = {}
        started: dict[int, float] = {}
        later: list[tuple[InspectionRequest, Encoded | Exception | None]] = []

        def joinable(batch: list[tuple[InspectionRequest, Encoded | Exception | None]]) -> list[Work]:
            out: list[Work] = []
            for request, encoded in batch:
                w = None if later else self._work(request, encoded)
                if w is None:
                    later.append((request, encoded))  # after the batch, so nothing overtakes it
                    continue
                requests[id(w)] = request
                started[id(w)] = time.monotonic()
                out.append(w)
            return out

        def admit(n: int) -> list[Work]:
            if self._stop.is_set() or later or self.get_inspector() is not inspector:
                return []  # stopping, a request waits its turn, or a reload: let the batch drain
            taken: list[tuple[InspectionRequest, Encoded | Exception | None]] = []
            while len(taken) < min(n, self.max_batch - len(requests)):
                try:
                    request, staged = self._handoff.get_nowait()
                except queue.Empty:
                    break
                taken.append((request, self._usable(staged)))
            return joinable(taken)

        def finished(w: Work, outcome: Result | Generation | Exception) -> None:
            request, t0 = requests.pop(id(w)), started.pop(id(w))
            self.heartbeat = time.monotonic()
            self._thread.progress()  # a long stream of joiners is no hang
            if isinstance(outcome, Exception):
                self._failed(request, outcome)
            elif isinstance(w, ChatWork):
                request.future.set_result(outcome)
            else:
                assert isinstance(outcome, Result)
                self._delivered(request, outcome, t0, len(requests) + 1)

        first = joinable(work)
        if first:
            try:
                peak = inspector.serve(first, finished, admit if self.max_batch > 1 else None)
            except Exception as exc:  # noqa: BLE001 - the whole batch failed: every caller still waiting hears it
                for request in list(requests.values()):
                    self._failed(request, exc)
                requests.clear()
            else:
                self.batches += peak > 1
                self.peak_batch = max(self.peak_batch, peak)
            for request in list(requests.values()):  # taken, never answered (a failed admit): nobody waits forever
                self._failed(request, InferenceError("the batch ended before this request was generated"))
            requests.clear()
        for request, encoded in later:
            self._finish(request, encoded)

    def _work(self, request: InspectionRequest, encoded: Encoded | Exception | None) -> Work | None:
        """The request as a sequence of a served batch; None when it cannot be one."""
        if isinstance(encoded, Exception) or request.job is not None:
            return None
        if request.chat is not None:
            return ChatWork(request.chat, encoded)
        if encoded is None:
            return None
        return BatchJob(encoded, request.camera, request.prompt, request.seq, request.capture_ms,
                        self.gate.decision().state, request.schema, request.program)

    def _delivered(self, request: InspectionRequest, result: Result, t0: float, sharing: int) -> None:
        """Journal a verdict from a served batch and answer. Energy: what the device took since the
        verdict started (t0), split among the `sharing` sequences that ran at its end (an estimate:
        sequences join and leave)."""
        if self.energy is not None:
            energy = self.energy(t0, time.monotonic())
            if energy is not None:
                result.energy_j = self.last_energy_j = round(energy / max(1, sharing), 4)
        try:
            delivered = self._deliver(request, result)
        except Exception as exc:  # noqa: BLE001 - e.g. a full disk: that caller hears it, the rest go on
            self._failed(request, exc)
        else:
            request.future.set_result(delivered)

    def _inspect(self, request: InspectionRequest, encoded: Encoded | None = None) -> Any:  # a job's own value
        inspector = self.get_inspector()
        if request.job is not None:
            return request.job(inspector)
        if request.chat is not None:  # a chat that waited its turn behind a request that could not join
            outcome: list[Result | Generation | Exception] = []
            inspector.serve([ChatWork(request.chat, encoded)], lambda _work, out: outcome.append(out))
            if isinstance(outcome[0], Exception):
                raise outcome[0]
            return outcome[0]
        if request.image is None:
            raise ValueError("an inspection request carries either a job or an image")
        if encoded is None and request.clip is not None:  # not encoded ahead: the clip's frames, not the newest alone
            encoded = inspector.encode_frame(request.camera, request.image, request.clip, request.program)
        gate = self.gate.decision()
        t0 = time.monotonic()
        result: Result = inspector.inspect(request.image, camera=request.camera, prompt=request.prompt,
                                           seq=request.seq, capture_ms=request.capture_ms,
                                           governor=gate.state, encoded=encoded, schema=request.schema,
                                           program=request.program)
        if self.energy is not None:
            result.energy_j = self.last_energy_j = self.energy(t0, time.monotonic())
        return self._deliver(request, result)

    def _deliver(self, request: InspectionRequest, result: Result) -> Result:
        if self.gates is not None:
            result = self.gates.annotate(request, result)
        delivered = self.deliver(request, result)
        self._full_log.reset()  # the journal took a row again: the next full disk is logged at once
        return delivered
