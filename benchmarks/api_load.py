"""Load on the real HTTP server: requests/s for /api/v1/status and the latency of /api/v1/infer.

Starts the daemon (demo bundle, no cameras, API on a free loopback port), then runs a bounded load
from a few client threads on loopback only.

    python benchmarks/api_load.py --seconds 10 --clients 4 --infer 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import cv2
import requests

import edge_runtime.inference.engines  # noqa: F401 - onnxruntime, then llama_cpp (see engines.py)
from edge_runtime.app.daemon import Daemon
from edge_runtime.config import Config
from edge_runtime.core.samples import part_image


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--infer", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Config(device_id="load", data_dir=Path(tmp))
        cfg.mqtt.enabled = False
        cfg.governor.enabled = False
        cfg.api.host, cfg.api.port = "127.0.0.1", 0
        daemon = Daemon(cfg)
        daemon.start()
        base = f"http://127.0.0.1:{daemon.api.port}"  # type: ignore[union-attr]
        try:
            counts = [0] * args.clients
            stop = time.monotonic() + args.seconds

            def hammer(i: int) -> None:
                with requests.Session() as s:
                    while time.monotonic() < stop:
                        s.get(f"{base}/api/v1/status", timeout=5).raise_for_status()
                        counts[i] += 1
            threads = [threading.Thread(target=hammer, args=(i,)) for i in range(args.clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            jpeg = cv2.imencode(".jpg", part_image(1, 1280, 720))[1].tobytes()
            latencies = []
            with requests.Session() as s:
                for _ in range(args.infer):
                    t0 = time.perf_counter()
                    s.post(f"{base}/api/v1/infer", files={"image": ("p.jpg", jpeg)}, timeout=30).raise_for_status()
                    latencies.append((time.perf_counter() - t0) * 1000)
            latencies.sort()
            print(json.dumps({
                "status_requests_per_s": round(sum(counts) / args.seconds, 1), "clients": args.clients,
                "infer_ms_p50": round(statistics.median(latencies), 1),
                "infer_ms_p95": round(latencies[int(0.95 * (len(latencies) - 1))], 1),
                "infer_image": "1280x720 JPEG", "model": daemon.inspector.model_name,  # type: ignore[union-attr]
            }))
        finally:
            daemon.stop()


if __name__ == "__main__":
    main()
