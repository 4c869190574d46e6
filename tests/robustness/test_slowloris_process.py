"""Slowloris against a real `edge-runtime run --demo` process with the default limits
(`make test-robustness`, ~40 s): 600 connections from ten addresses (60 each, under the per-client
cap) send a request head one byte every 2 s. The 100 beyond the 500-connection table are refused at
once, the 500 admitted are cut at the 15 s request deadline, and `/healthz` from 127.0.0.1 answers
throughout. Before the guard, every probe timed out and no dribbler was ever closed."""

from __future__ import annotations

import os
import resource
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the shared test helpers

from tests.support.waiting import wait_for

pytestmark = pytest.mark.robustness

DEADLINE_S = 15  # api.request_deadline_s default
SOURCES = [f"127.0.0.{i}" for i in range(2, 12)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_six_hundred_dribblers_cannot_starve_healthz_of_a_real_daemon(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 4096), hard), hard))
    port = free_port()
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(f"device_id: slowloris\ndata_dir: {tmp_path / 'data'}\napi:\n  host: 127.0.0.1\n"
                   f"  port: {port}\nmqtt:\n  enabled: false\nmodel:\n  threads: 2\n")
    base = f"http://127.0.0.1:{port}"
    with (tmp_path / "log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "edge_runtime", "--config", str(cfg), "run", "--demo"],
                                stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "EDGE_RUNTIME_DATA": str(tmp_path / "data")})
    socks: list[socket.socket] = []
    try:
        def ready() -> bool:
            try:
                return requests.get(f"{base}/readyz", timeout=1).status_code == 200
            except requests.RequestException:
                return False
        wait_for(ready, 120, "the demo daemon to be ready")
        for source in SOURCES:
            for _ in range(60):
                sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
                sock.setblocking(False)
                sock.send(b"GET /healthz HTTP/1.1\r\nHost: device\r\nX-Slow: ")
                socks.append(sock)
        started = time.monotonic()
        closed: dict[socket.socket, float] = {}
        latencies: list[float] = []
        next_tick = 0.0
        while time.monotonic() - started < DEADLINE_S + 8:
            live = [s for s in socks if s not in closed]
            readable, _, _ = select.select(live, [], [], 0.2) if live else ([], [], [])
            for sock in readable:
                try:
                    sock.recv(4096)
                except OSError:
                    pass
                closed[sock] = time.monotonic() - started
            if time.monotonic() - started >= next_tick:
                next_tick += 2
                for sock in live:
                    if sock not in closed:
                        try:
                            sock.send(b"x")
                        except OSError:
                            closed[sock] = time.monotonic() - started
                probe = time.perf_counter()
                assert requests.get(f"{base}/healthz", timeout=2).status_code == 200
                latencies.append(time.perf_counter() - probe)
        at = sorted(closed.values())
        refused = [t for t in at if t < DEADLINE_S - 1]
        cut = [t for t in at if t >= DEADLINE_S - 1]
        latencies.sort()
        print(f"\n600 dribblers on a real daemon: {len(refused)} refused at once, {len(cut)} cut after "
              f"{cut[0] if cut else 0:.1f}-{cut[-1] if cut else 0:.1f} s; /healthz {len(latencies)} probes, "
              f"p50 {latencies[len(latencies) // 2] * 1000:.1f} ms, max {latencies[-1] * 1000:.1f} ms")
        assert len(refused) == 100 and len(cut) == 500, at
        assert cut[0] >= DEADLINE_S - 1 and cut[-1] < DEADLINE_S + 4
        assert latencies[-1] < 1.0 and proc.poll() is None
    finally:
        for sock in socks:
            sock.close()
        proc.terminate()
        proc.wait(timeout=20)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
