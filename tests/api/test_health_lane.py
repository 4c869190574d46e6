"""`/healthz` and `/readyz` against the real waitress server while a crowd hammers the cheap reads
(`/api/v1/status`, `/metrics`): health shared the two spare server threads with status and metrics, so
each probe queued behind every status and metrics request already waiting (thirty clients: ~0.09 s
median on a 2-core machine, worse with more). Health now has a server thread of its own (guard.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from edge_runtime.app.daemon import Daemon
from tests.api.test_api import make_daemon

CLIENTS = 30
STATUS_S = 0.1  # what a status answer takes here (a busy disk, a lock): the crowd holds threads, not the CPU
# The crowd runs in a process of its own: thirty client threads in this one would contend for the
# interpreter with the server they measure.
CROWD = textwrap.dedent("""
    import sys, threading, time, requests
    base, n = sys.argv[1], int(sys.argv[2])
    stop, served = threading.Event(), [0] * n
    def client(k):
        with requests.Session() as s:
            while not stop.is_set():
                r = s.get(base + ("/api/v1/status" if k % 2 else "/metrics"), timeout=60)
                served[k] += r.status_code == 200
    threads = [threading.Thread(target=client, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    print("started", flush=True)
    sys.stdin.readline()
    stop.set()
    for t in threads:
        t.join()
    print(sum(served), flush=True)
""")
# The probe too, as Docker's HEALTHCHECK or an operator's curl is: one new connection per probe.
PROBE = textwrap.dedent("""
    import json, sys, time, requests
    base, waits = sys.argv[1], {"/healthz": [], "/readyz": []}
    for i in range(int(sys.argv[2])):
        path = "/healthz" if i % 2 else "/readyz"
        t0 = time.monotonic()
        r = requests.get(base + path, timeout=30)
        waits[path].append(time.monotonic() - t0)
        print(json.dumps([path, r.status_code, r.headers["Content-Type"], r.json()]), flush=True)
        time.sleep(0.05)
    print(json.dumps(waits), flush=True)
""")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    d = make_daemon(tmp_path_factory.mktemp("health-lane"), demo_dir, camera=False)
    yield d
    d.stop()


def p95(waits: list[float]) -> float:
    return sorted(waits)[int(len(waits) * 0.95) - 1]


def test_health_answers_in_milliseconds_while_thirty_clients_hammer_status_and_metrics(
        daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    assert daemon.api is not None
    report = daemon.api.app.extensions["edge_runtime"].status  # what /api/v1/status and /metrics read
    status = type(report).status

    def slow_status(self: object) -> dict[str, object]:
        time.sleep(STATUS_S)
        return status(self)

    monkeypatch.setattr(type(report), "status", slow_status)
    base = f"http://127.0.0.1:{daemon.api.port}"
    ready_body = requests.get(f"{base}/readyz", timeout=10).json()
    crowd = subprocess.Popen([sys.executable, "-c", CROWD, base, str(CLIENTS)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert crowd.stdout is not None and crowd.stdout.readline().strip() == "started"
        time.sleep(1.5)  # every client has a request in flight
        probe = subprocess.run([sys.executable, "-c", PROBE, base, "40"], capture_output=True, text=True,
                               timeout=120, check=True)
        *answers, last = probe.stdout.splitlines()
        waits = json.loads(last)
        for answer in answers:
            path, code, content_type, body = json.loads(answer)
            assert (code, content_type) == (200, "application/json"), answer
            assert body == ({"status": "ok"} if path == "/healthz" else ready_body)
    finally:
        out, _ = crowd.communicate("stop\n", timeout=90)
    served = int(out.split()[-1])
    # Before: every probe waited its turn behind the crowd's queue (seconds); after: a few ms.
    summary = json.dumps({p: [round(p95(w), 4), round(sorted(w)[len(w) // 2], 4)] for p, w in waits.items()})
    print("p95, median:", summary, "crowd requests served:", served)
    assert p95(waits["/healthz"]) < 0.05 and p95(waits["/readyz"]) < 0.05, summary
    assert served > 50  # status and metrics kept being answered meanwhile


def test_pipelined_requests_are_each_served_on_their_own_threads_in_order(daemon: Daemon) -> None:
    """A connection's requests are routed one by one: health to its lane, the rest to the pool, in order."""
    import socket

    assert daemon.api is not None
    with socket.create_connection(("127.0.0.1", daemon.api.port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /api/v1/status HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"HEAD /readyz HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.count(b"HTTP/1.1 ") == data.count(b"HTTP/1.1 200 OK") == 4, data[:500]
    assert data.index(b'{"status":"ok"}') < data.index(b'"device"')  # the status body came second
    assert data.endswith(b'{"status":"ok"}\n')
