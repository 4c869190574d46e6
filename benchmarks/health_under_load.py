"""/healthz and /readyz latency while a crowd keeps the daemon's CPU busy with /api/v1/status and /metrics.

Three processes, as on a device: the daemon (`edge-runtime run --demo`: the demo bundle and its sample
video camera, API on a free loopback port), a crowd of `--clients` keep-alive clients reading status and
metrics as fast as they are answered (a process of its own), and this one, which probes like Docker's
HEALTHCHECK or an operator's curl does: a new connection per probe, alternately /healthz and /readyz,
every `--interval` s for `--seconds`. Prints one JSON line: p50/p95/p99/max per path in ms, the
crowd's answers per second, the probes' status codes and the mean time of the camera's inspections
meanwhile (one a second; `edge_stage_latency_seconds{stage="total"}`). Run it alone on the machine:

    flock -x /work/coord/cpu.lock python benchmarks/health_under_load.py --seconds 30 --clients 30
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

CROWD = textwrap.dedent("""
    import sys, threading, requests
    base, n = sys.argv[1], int(sys.argv[2])
    stop, served = threading.Event(), [0] * n
    def client(k):
        with requests.Session() as s:
            while not stop.is_set():
                try:
                    r = s.get(base + ("/api/v1/status" if k % 2 else "/metrics"), timeout=60)
                    served[k] += r.status_code == 200
                except requests.RequestException:
                    pass
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def probe(port: int, path: str) -> tuple[float, int, bytes]:
    """One probe on a new connection, as curl does it: seconds from connect to the whole answer (its
    Content-Length read), the status code, the body."""
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
        data, length = b"", None
        while length is None or len(data) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            if length is None and b"\r\n\r\n" in data:
                head = data.split(b"\r\n\r\n", 1)[0].lower()
                length = len(head) + 4 + int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
    took = time.perf_counter() - t0
    head, _, body = data.partition(b"\r\n\r\n")
    return took, int(head.split(b" ", 2)[1]), body


def inspections(port: int) -> tuple[float, float]:
    """The daemon's inspections so far (its camera's, one a second): total seconds and count, from /metrics."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    found = {}
    for line in data.decode().splitlines():
        for key in ("_sum", "_count"):
            if line.startswith(f'edge_stage_latency_seconds{key}{{stage="total"}}'):
                found[key] = float(line.rsplit(" ", 1)[1])
    return found.get("_sum", 0.0), found.get("_count", 0.0)


def percentiles(waits: list[float]) -> dict[str, float]:
    w = sorted(waits)
    at = lambda q: round(w[min(len(w) - 1, int(q * len(w)))] * 1000, 1)  # noqa: E731
    return {"n": len(w), "p50_ms": at(0.5), "p95_ms": at(0.95), "p99_ms": at(0.99), "max_ms": round(w[-1] * 1000, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--clients", type=int, default=30)
    ap.add_argument("--interval", type=float, default=0.05, help="seconds between probes")
    ap.add_argument("--model", help="bundle folder (default: the demo bundle, built in the data folder)")
    args = ap.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "config.yaml"
        cfg.write_text(f"device_id: health-bench\napi:\n  host: 127.0.0.1\n  port: {port}\nmqtt:\n  enabled: false\n")
        cmd = [sys.executable, "-m", "edge_runtime", "-c", str(cfg), "--data-dir", str(Path(tmp) / "data"),
               "--log-level", "warning", "run", "--demo"] + (["--model", args.model] if args.model else [])
        log = (Path(tmp) / "daemon.log").open("w")  # waitress logs every queue depth past its warning level
        daemon = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        crowd = None
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if probe(port, "/readyz")[1] == 200:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline or daemon.poll() is not None:
                    raise SystemExit("not ready:\n" + (Path(tmp) / "daemon.log").read_text()[-3000:])
                time.sleep(0.2)
            base = f"http://127.0.0.1:{port}"
            crowd = subprocess.Popen([sys.executable, "-c", CROWD, base, str(args.clients)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
            assert crowd.stdout is not None and crowd.stdout.readline().strip() == "started"
            time.sleep(2)  # every client has a request in flight
            waits: dict[str, list[float]] = {"/healthz": [], "/readyz": []}
            codes: dict[str, dict[int, int]] = {"/healthz": {}, "/readyz": {}}
            inspected0 = inspections(port)
            load0, t_start = os.getloadavg()[0], time.monotonic()
            i = 0
            while time.monotonic() - t_start < args.seconds:
                path = ("/healthz", "/readyz")[i % 2]
                took, code, _ = probe(port, path)
                waits[path].append(took)
                codes[path][code] = codes[path].get(code, 0) + 1
                i += 1
                time.sleep(args.interval)
            elapsed = time.monotonic() - t_start
            inspected = [b - a for a, b in zip(inspected0, inspections(port), strict=True)]
            out, _ = crowd.communicate("stop\n", timeout=120)
            served = int(out.split()[-1])
            print(json.dumps({
                "clients": args.clients, "seconds": round(elapsed, 1), "cpus": os.cpu_count(),
                "healthz": percentiles(waits["/healthz"]), "readyz": percentiles(waits["/readyz"]),
                "codes": codes, "crowd_answers_per_s": round(served / (elapsed + 2), 1),
                "inspections": int(inspected[1]),
                "inspection_ms_mean": round(inspected[0] / inspected[1] * 1000, 1) if inspected[1] else None,
                "loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
            }))
        finally:
            if crowd is not None and crowd.poll() is None:
                crowd.kill()
            daemon.terminate()
            daemon.wait(60)
            log.close()


if __name__ == "__main__":
    main()
