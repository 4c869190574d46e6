"""Schemathesis against the OpenAPI document of a live `edge-runtime run --demo` process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import requests
from waiting import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fuzz_live_daemon(tmp: Path, examples: int) -> tuple[int, Counter[int], str]:
    """Start the demo daemon (own data dir, free port), fuzz it; (requests, statuses, daemon log)."""
    port = free_port()
    cfg = tmp / "edge.yaml"
    cfg.write_text(f"device_id: fuzz\ndata_dir: {tmp / 'data'}\napi:\n  host: 127.0.0.1\n  port: {port}\n"
                   "mqtt:\n  enabled: false\n")
    log = tmp / "daemon.log"
    bin_dir = Path(sys.executable).parent
    with log.open("wb") as out:
        proc = subprocess.Popen([str(bin_dir / "edge-runtime"), "--config", str(cfg), "run", "--demo"],
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "EDGE_RUNTIME_DATA": str(tmp / "data")})
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return requests.get(f"{base}/readyz", timeout=2).status_code == 200
        except requests.ConnectionError:
            return proc.poll() is not None  # died: stop waiting, the assert below says so

    try:
        wait_for(ready, 120, "the demo daemon")
        assert proc.poll() is None, log.read_text()[-2000:]
        # The event stream is left out: a request/response fuzzer would wait for a stream to end;
        # its one input (last_event_id) is covered by the API tests.
        run = subprocess.run(
            [str(bin_dir / "schemathesis"), "run", f"{base}/api/v1/openapi.json", "--checks", "not_a_server_error",
             "--max-examples", str(examples), "--exclude-path", "/api/v1/events", "--request-timeout", "60",
             "--generation-deterministic", "--report", "har", "--report-dir", str(tmp / "report")],
            capture_output=True, text=True, timeout=1800, check=False, cwd=tmp)  # its cache stays in tmp
        (tmp / "schemathesis.out").write_text(run.stdout + run.stderr)
        (har,) = (tmp / "report").glob("*.json")
        entries = json.loads(har.read_text())["log"]["entries"]
        statuses = Counter(int(e["response"]["status"]) for e in entries)
        return len(entries), statuses, log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
