"""Refused 10 MB chat prompts cost no lasting memory: six distinct ones left a real `run --demo` daemon
60-120 MB bigger for good (glibc's dynamic mmap threshold moved the large request buffers into heap
arenas that keep their pages; core/heap.py pins the threshold)."""

from __future__ import annotations

import json
import os
import random
import string
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.support.mjpeg import free_port
from tests.support.waiting import wait_for

pytestmark = pytest.mark.robustness


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_six_refused_10_mb_chat_prompts_leave_rss_where_it_was(tmp_path: Path) -> None:
    port = free_port()
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(f"device_id: rss\ndata_dir: {tmp_path / 'data'}\napi: {{host: 127.0.0.1, port: {port}}}\n"
                   "mqtt: {enabled: false}\n")
    with (tmp_path / "daemon.log").open("wb") as log:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "edge-runtime"), "--config", str(cfg), "run",
                                 "--demo"], stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "EDGE_RUNTIME_DATA": str(tmp_path / "data")})
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return requests.get(f"{base}/readyz", timeout=2).status_code == 200
        except requests.ConnectionError:
            return proc.poll() is not None

    try:
        wait_for(ready, 120, "the demo daemon")
        time.sleep(2)
        before = rss_mb(proc.pid)
        rng = random.Random(7)
        for _ in range(6):  # 50 parts of 200,000 characters: each part passes its own limit, the sum does not
            parts = [{"type": "text", "text": "".join(rng.choices(string.ascii_letters + " ", k=200_000))}
                     for _ in range(50)]
            body = json.dumps({"messages": [{"role": "user", "content": parts}], "max_tokens": 8})
            r = requests.post(f"{base}/v1/chat/completions", data=body, timeout=60,
                              headers={"Content-Type": "application/json"})
            assert r.status_code == 400, r.text[:300]
        time.sleep(2)
        grown = rss_mb(proc.pid) - before
        assert grown < 20, f"RSS grew {grown:.1f} MB over six refused 10 MB prompts"
    finally:
        proc.terminate()
        proc.wait(30)
