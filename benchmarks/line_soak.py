"""Line I/O soak: a real daemon process on the demo bundle with one on_demand station served over Modbus
TCP, a PLC (pymodbus's client) running the handshake at `--rate-hz` for `--minutes`, and every `--cut-s`
seconds one more connection that asks once and then goes silent without closing (a cut cable).

    python benchmarks/line_soak.py --minutes 10 --rate-hz 2 --out soak-line.json

Counts the PLC's jobs, acks, refusals and connection errors against the journal's line_jobs rows, the
Modbus server's counters (evictions, idle closes), how many of the cut connections the server closed,
and samples the daemon's RSS, open files and threads every `--sample-s` seconds (slopes as in
benchmarks/soak.py, after `--warmup-min`). The PLC keeps one connection; the table holds max_clients 4,
so the cut connections must be evicted or timed out for the PLC to get back in when it "reboots" (every
50 jobs it leaves its connection open and silent and connects anew).
"""

from __future__ import annotations

import argparse
import json
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests
from pymodbus.client import ModbusTcpClient
from pymodbus.exceptions import ModbusException
from soak import free_port, proc_sample, slope_per_hour, stop_daemon, wait_ready

from edge_runtime.core.samples import write_sample_video
from edge_runtime.lineio import modbus_map as rm


class Plc:
    """The handshake of docs/line-io.md (Modbus, PLC side) from one connection, reconnecting on errors."""

    def __init__(self, port: int) -> None:
        self.client = ModbusTcpClient("127.0.0.1", port=port, timeout=5, retries=0)
        self.port = port
        self.counts = {"jobs": 0, "acks": 0, "refused": 0, "errors": 0, "connects": 0, "reboots": 0}
        self.valid_ms: list[float] = []
        self.abandoned: list[ModbusTcpClient] = []

    def reboot(self) -> None:
        """The PLC restarts: its old connection is left open and silent (no FIN), a new one comes."""
        self.abandoned.append(self.client)
        self.client = ModbusTcpClient("127.0.0.1", port=self.port, timeout=5, retries=0)
        self.counts["reboots"] += 1

    def status(self) -> list[int]:
        answer = self.client.read_holding_registers(rm.STATUS, count=rm.STATUS_END - rm.STATUS)
        if answer.isError():
            raise ConnectionError(str(answer))
        return list(answer.registers)

    def until(self, pred: Any, timeout: float = 30.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while True:
            regs = self.status()
            if pred(regs):
                return regs
            if time.monotonic() > deadline:
                raise TimeoutError("the station did not answer in time")
            time.sleep(0.005)

    def write(self, address: int, values: list[int]) -> None:
        if self.client.write_registers(address, values).isError():
            raise ConnectionError("write refused")

    def job(self, part: str) -> None:
        try:
            if not self.client.connected:
                self.counts["connects"] += 1
                self.client.connect()
            self.until(lambda r: r[0] & rm.READY)
            t0 = time.perf_counter()
            self.write(rm.CONTROL, [rm.TRIGGER_ENABLE | rm.TRIGGER, *rm.encode_text(part, rm.PART_ID_REGS)])
            regs = self.until(lambda r: r[0] & rm.TRIGGER_ACK or r[rm.LAST_REFUSAL - rm.STATUS])
            self.write(rm.CONTROL, [rm.TRIGGER_ENABLE])
            if not regs[0] & rm.TRIGGER_ACK:
                self.counts["refused"] += 1
                return
            self.counts["jobs"] += 1
            seq = (regs[1] << 16) | regs[2]
            self.until(lambda r: r[0] & rm.RESULT_VALID and (r[1] << 16 | r[2]) == seq)
            self.valid_ms.append((time.perf_counter() - t0) * 1000)
            self.write(rm.CONTROL, [rm.TRIGGER_ENABLE | rm.RESULT_ACK])
            self.until(lambda r: not (r[0] & rm.RESULT_VALID and (r[1] << 16 | r[2]) == seq))
            self.write(rm.CONTROL, [rm.TRIGGER_ENABLE])
            self.counts["acks"] += 1
        except (ConnectionError, TimeoutError, OSError, ModbusException) as exc:
            self.counts["errors"] += 1
            print(f"plc: {type(exc).__name__}: {str(exc)[:160]}", file=sys.stderr)
            self.client.close()
            time.sleep(1.0)  # a PLC's retry interval


def cut_cable(port: int) -> socket.socket | None:
    """A connection that asks once, then goes silent and never closes (None: the server closed it)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        sock.sendall(bytes.fromhex("000100000006010300320001"))  # read the StatusWord
        if sock.recv(64):
            return sock
    except OSError:
        pass
    sock.close()
    return None


def closed_by_server(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(64) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def journal_counts(data_dir: Path) -> dict[str, int]:
    for path in sorted(data_dir.rglob("*.sqlite3")) + sorted(data_dir.rglob("*.db")):
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'line_jobs'").fetchone():
                rows, acked = db.execute("SELECT COUNT(*), COUNT(acked) FROM line_jobs").fetchone()
                return {"line_jobs": rows, "acked": acked}
    return {}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--rate-hz", type=float, default=2)
    ap.add_argument("--cut-s", type=float, default=20, help="one more silent connection every this many seconds")
    ap.add_argument("--sample-s", type=float, default=10)
    ap.add_argument("--warmup-min", type=float, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    seconds = args.minutes * 60
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        video = write_sample_video(tmp / "line.avi", frames=90)
        api_port, modbus_port = free_port(), free_port()
        (tmp / "line.yaml").write_text(
            f"device_id: line-soak\ndata_dir: {tmp / 'data'}\nmodel:\n  threads: 2\n"
            f"api:\n  host: 127.0.0.1\n  port: {api_port}\nmqtt:\n  enabled: false\ngovernor:\n  enabled: false\n"
            f"cameras:\n  - name: cam\n    source: {video}\n    fps: 30\n    trigger: {{mode: on_demand}}\n"
            "line_io:\n  stations:\n    - {name: st1, camera: cam, result_deadline_ms: 10000,\n"
            "       nok_when: [{field: verdict.defect, equals: true}]}\n"
            f"  modbus: {{enabled: true, host: 127.0.0.1, port: {modbus_port}}}\n")
        log = open(tmp / "daemon.log", "wb")  # closed after the daemon stops
        daemon = subprocess.Popen([sys.executable, "-m", "edge_runtime", "--config", str(tmp / "line.yaml"),
                                   "--log-level", "warning", "run"], stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{api_port}"
        cut: list[socket.socket] = []
        cut_refused = 0
        plc = Plc(modbus_port)
        try:
            wait_ready(daemon, base, tmp / "daemon.log")
            t_start = time.monotonic()
            next_sample = next_cut = t_start
            samples: list[dict[str, float]] = []
            i = 0
            while (now := time.monotonic()) - t_start < seconds:
                if daemon.poll() is not None:
                    raise SystemExit(f"daemon died with {daemon.returncode}")
                if now >= next_sample:
                    samples.append({"t": round(now - t_start, 1), **proc_sample(daemon.pid)})
                    next_sample += args.sample_s
                if now >= next_cut:
                    sock = cut_cable(modbus_port)
                    if sock is None:
                        cut_refused += 1
                    else:
                        cut.append(sock)
                    next_cut += args.cut_s
                if i % 50 == 25:
                    plc.reboot()  # its old connection stays half open: the new one must get in at once
                plc.job(f"SOAK-{i}")
                i += 1
                time.sleep(max(0.0, t_start + i / args.rate_hz - time.monotonic()))
            status = requests.get(base + "/api/v1/status", timeout=10).json()
        finally:
            plc.client.close()
            closed = sum(closed_by_server(s) for s in cut)
            for old in plc.abandoned:
                old.close()
            for s in cut:
                s.close()
            stop_daemon(daemon)
            log.close()
        journal = journal_counts(tmp / "data")
    steady = [s for s in samples if s["t"] >= args.warmup_min * 60] or samples
    line = status.get("line_io", {})
    valid = sorted(plc.valid_ms)
    report = {
        "minutes": args.minutes, "rate_hz": args.rate_hz, "daemon_exit_code": daemon.returncode,
        "plc": plc.counts, "journal": journal,
        "cut_connections": {"opened": len(cut), "refused": cut_refused, "closed_by_server": closed},
        "modbus": line.get("adapters", {}).get("modbus", {}).get("counters"),
        "station": {k: v for k, v in (line.get("stations") or [{}])[0].get("counters", {}).items()
                    if k in ("triggers", "acks", "refused", "results_ok", "results_nok", "results_error")},
        "trigger_to_result_valid_ms": {"p50": round(statistics.median(valid), 1) if valid else None,
                                       "p99": round(valid[min(len(valid) - 1, int(0.99 * len(valid)))], 1)
                                       if valid else None},
        "rss_mb": {"start": round(samples[0]["rss_mb"], 1), "end": round(samples[-1]["rss_mb"], 1),
                   "peak": round(max(s["rss_mb"] for s in samples), 1),
                   "slope_mb_per_h": round(slope_per_hour([(s["t"], s["rss_mb"]) for s in steady]), 2)},
        "fds": {"start": samples[0]["fds"], "end": samples[-1]["fds"]},
        "threads": {"start": samples[0]["threads"], "end": samples[-1]["threads"]},
        "samples": samples,
    }
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}))


if __name__ == "__main__":
    main()
