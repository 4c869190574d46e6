"""The station handshake over Modbus TCP on loopback while the job store's disk is slow.

A real `Station` on a real `LineJobs` (SQLite WAL, synchronous=FULL, in --dir), served by the real
Modbus server; a PLC (pymodbus's client) runs the handshake job after job: trigger (one FC16), poll
until TriggerAck, drop Trigger, poll until ResultValid, ResultAck, poll until the result is gone. The
model stands aside: the frame is taken at once and the verdict comes --inference-ms later from a
"delivery" thread calling `station.notify` as the daemon's delivery path does. Meanwhile a second
client (SCADA) reads the status block in a loop. --disk-ms adds that much to every durable write of
the job store (a slow or busy disk: the sleep sits where the fsync is). One JSON line:

    python benchmarks/lineio_durable.py --jobs 200 [--disk-ms 20] [--inference-ms 20] [--poll-ms 1]

Runs against the job store of the tree it is in: to compare with an older commit, extract it
(`git archive <commit> | tar -x -C DIR`) and run DIR/benchmarks/lineio_durable.py there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pymodbus.client import ModbusTcpClient  # noqa: E402

from edge_runtime.config.line_io import StationConfig  # noqa: E402
from edge_runtime.config.line_protocols import ModbusConfig  # noqa: E402
from edge_runtime.core.result import FrameInfo, Result  # noqa: E402
from edge_runtime.lineio import modbus_map as rm  # noqa: E402
from edge_runtime.lineio.modbus import ModbusServer  # noqa: E402
from edge_runtime.lineio.recipes import tagged  # noqa: E402
from edge_runtime.lineio.signals import JobRequest  # noqa: E402
from edge_runtime.lineio.station import Station  # noqa: E402
from edge_runtime.verdicts.line_jobs import LineJobs  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2) if ordered else 0.0


def stats(values: list[float]) -> dict[str, float]:
    return {"p50": pct(values, 0.5), "p99": pct(values, 0.99), "max": round(max(values, default=0.0), 2),
            "mean": round(statistics.fmean(values), 2) if values else 0.0}


def slow_disk(jobs: LineJobs, disk_s: float) -> str:
    """Every durable write of this job store takes `disk_s` longer, where its fsync is."""
    if hasattr(jobs, "_commit"):  # group commit: one commit per batch of writes
        commit = jobs._commit

        def slow_commit() -> None:
            time.sleep(disk_s)
            commit()
        jobs._commit = slow_commit  # type: ignore[method-assign]
        return "group commit (writer thread)"
    for name in ("triggered", "decided", "acked"):  # one autocommit statement each, under the caller's lock
        write = getattr(jobs, name)

        def slow(*args: Any, _write: Callable[..., Any] = write) -> Any:
            time.sleep(disk_s)
            return _write(*args)
        setattr(jobs, name, slow)
    return "one commit per write"


class Delivery:
    """The capture side and the delivery path: the frame at once, the verdict `inference_s` later."""

    def __init__(self, inference_s: float) -> None:
        self.inference_s = inference_s
        self.station: Station | None = None
        self.notify_ms: list[float] = []

    def start(self, job: JobRequest, on_acquired: Callable[[], None]) -> Future[Result]:
        future: Future[Result] = Future()
        on_acquired()
        threading.Timer(self.inference_s, self._deliver, (job, future)).start()
        return future

    def _deliver(self, job: JobRequest, future: Future[Result]) -> None:
        result = tagged(Result(device="bench", camera=job.camera, frame=FrameInfo(job.seq, 64, 64),
                                   verdict={"defect": False}, text="", model="stand-in",
                                   timings_ms={"total": 1.0}, prompt=""), job)
        assert self.station is not None
        t0 = time.perf_counter()
        self.station.notify(result)  # the daemon's delivery thread (the inference worker) calls this
        self.notify_ms.append((time.perf_counter() - t0) * 1000)
        future.set_result(result)


def wait_status(client: ModbusTcpClient, pred: Callable[[int], bool], poll_s: float, timeout: float = 30.0) -> int:
    """Poll the status word as a PLC does, once per scan (`poll_s`; 0: as fast as the client can)."""
    end = time.monotonic() + timeout
    while True:
        rr = client.read_holding_registers(rm.STATUS, count=1)
        word = int(rr.registers[0])
        if pred(word):
            return word
        if time.monotonic() > end:
            raise TimeoutError(f"status word {word:#x} never matched")
        if poll_s:
            time.sleep(poll_s)


def poller(port: int, stop: threading.Event, out: list[float]) -> None:
    client = ModbusTcpClient("127.0.0.1", port=port)
    client.connect()
    try:
        while not stop.is_set():
            t0 = time.perf_counter()
            client.read_holding_registers(rm.STATUS, count=rm.STATUS_END - rm.STATUS)
            out.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.002)
    finally:
        client.close()


def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    jobs = LineJobs(folder / "journal.sqlite3")
    mode = slow_disk(jobs, args.disk_ms / 1000) if args.disk_ms > 0 else "real disk"
    delivery = Delivery(args.inference_ms / 1000)
    cfg = StationConfig.model_validate({"name": "st1", "camera": "cam", "heartbeat_ms": 100,
                                        "result_deadline_ms": 60_000,
                                        "nok_when": [{"field": "verdict.defect", "equals": True}]})
    station = Station(cfg, jobs, delivery.start)
    delivery.station = station
    station.start()
    server = ModbusServer([station], ModbusConfig(enabled=True, port=0))
    server.start()
    assert server.listening.wait(10), server.last_error
    assert server.port is not None
    stop = threading.Event()
    polls: list[float] = []
    scada = threading.Thread(target=poller, args=(server.port, stop, polls), daemon=True)
    scada.start()
    plc = ModbusTcpClient("127.0.0.1", port=server.port)
    plc.connect()
    poll = args.poll_ms / 1000
    ack_ms: list[float] = []
    trig_ms: list[float] = []
    valid_ms: list[float] = []
    try:
        wait_status(plc, lambda w: bool(w & rm.READY), poll)
        for i in range(args.jobs):
            wait_status(plc, lambda w: bool(w & rm.READY), poll)
            t0 = time.perf_counter()
            plc.write_registers(rm.CONTROL, [rm.TRIGGER_ENABLE | rm.TRIGGER, *rm.encode_text(f"P{i:05d}", 16)])
            wait_status(plc, lambda w: bool(w & rm.TRIGGER_ACK), poll)
            trig_ms.append((time.perf_counter() - t0) * 1000)
            plc.write_register(rm.CONTROL, rm.TRIGGER_ENABLE)
            wait_status(plc, lambda w: bool(w & rm.RESULT_VALID), poll)
            valid_ms.append((time.perf_counter() - t0) * 1000)
            t1 = time.perf_counter()
            plc.write_register(rm.CONTROL, rm.TRIGGER_ENABLE | rm.RESULT_ACK)
            wait_status(plc, lambda w: not w & rm.RESULT_VALID, poll)
            ack_ms.append((time.perf_counter() - t1) * 1000)
            plc.write_register(rm.CONTROL, rm.TRIGGER_ENABLE)
    finally:
        stop.set()
        scada.join(5)
        plc.close()
        server.stop()
        station.stop()
        jobs.close()
    return {"store": mode, "disk_ms": args.disk_ms, "inference_ms": args.inference_ms, "plc_poll_ms": args.poll_ms,
            "jobs": len(valid_ms),
            "trigger_to_trigger_ack_ms": stats(trig_ms), "trigger_to_result_valid_ms": stats(valid_ms),
            "ack_to_result_gone_ms": stats(ack_ms), "scada_status_read_ms": stats(polls),
            "scada_reads": len(polls), "delivery_notify_ms": stats(delivery.notify_ms)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--disk-ms", type=float, default=0.0, help="added to every durable write (0: the real disk)")
    ap.add_argument("--inference-ms", type=float, default=20.0)
    ap.add_argument("--poll-ms", type=float, default=1.0, help="the PLC scan: a status read per poll (0: busy-poll)")
    ap.add_argument("--dir", type=Path, default=None, help="where the journal file goes (default: a temp dir)")
    args = ap.parse_args()
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
        print(json.dumps(run(args, args.dir)))
        return
    with tempfile.TemporaryDirectory(dir=str(ROOT)) as tmp:  # on the checkout's disk, not a tmpfs
        print(json.dumps(run(args, Path(tmp))))


if __name__ == "__main__":
    main()
