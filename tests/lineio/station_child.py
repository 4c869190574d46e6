"""A station in a process of its own whose disk stalls, for the kill -9 ordering test:
python station_child.py JOURNAL.

Job A: OK, shown, acknowledged. Job B: NOK, shown, not acknowledged. Job C: triggered (durable), its
frame taken; then the job store's disk stalls (every commit blocks for good), C's verdict arrives on
the delivery path and the line acknowledges B. One JSON line tells what the line could see then; the
process waits to be killed with the stalled writes still in memory.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

from edge_runtime.config.line_io import StationConfig
from edge_runtime.core.result import FrameInfo, Result
from edge_runtime.lineio.recipes import tagged
from edge_runtime.lineio.signals import JobRequest
from edge_runtime.lineio.station import Station
from edge_runtime.verdicts.line_jobs import LineJobs

jobs = LineJobs(Path(sys.argv[1]))
cfg = StationConfig.model_validate({"name": "s1", "camera": "cam", "heartbeat_ms": 50, "result_deadline_ms": 60_000,
                                    "nok_when": [{"field": "verdict.defect", "equals": True}]})
requests: dict[int, JobRequest] = {}


def start(job: JobRequest, on_acquired: object) -> Future[Result]:
    requests[job.seq] = job
    on_acquired()  # type: ignore[operator]
    return Future()


def verdict(seq: int, defect: bool) -> Result:
    return tagged(Result(device="d", camera="cam", frame=FrameInfo(seq, 8, 8), verdict={"defect": defect},
                             text="", model="m", timings_ms={}, prompt=""), requests[seq])


def until(pred: object) -> None:
    end = time.monotonic() + 10
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < end
        time.sleep(0.002)


station = Station(cfg, jobs, start)
station.start()
until(lambda: station.signals().ready)
a = station.trigger("A")
until(lambda: a in requests)
station.notify(verdict(a, False))
until(lambda: station.signals().result_valid)
assert station.ack_result(a)
b = station.trigger("B")
until(lambda: b in requests)
station.notify(verdict(b, True))
until(lambda: station.signals().result_valid)
c = station.trigger("C")
until(lambda: c in requests and station.signals().acquisition_done)

stalled = threading.Event()


def hung_disk() -> None:
    stalled.set()
    threading.Event().wait()


jobs._commit = hung_disk  # type: ignore[method-assign]
t0 = time.perf_counter()
station.notify(verdict(c, False))  # the delivery thread
notify_ms = (time.perf_counter() - t0) * 1000
acked = station.request_ack(b)
assert stalled.wait(5)
t0 = time.perf_counter()
shown = station.signals()
signals_ms = (time.perf_counter() - t0) * 1000
time.sleep(0.2)  # long enough for any change that was not waiting for the disk to show
shown = station.signals()
print(json.dumps({"a": a, "b": b, "c": c, "notify_ms": notify_ms, "signals_ms": signals_ms,
                  "ack_pending": acked is not None and not acked.done(),
                  "seen": {"result_valid": shown.result_valid, "inspection_seq": shown.inspection_seq,
                           "result": int(shown.result), "buffer_count": shown.buffer_count, "busy": shown.busy}}),
      flush=True)
while True:
    time.sleep(1)
