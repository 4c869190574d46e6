"""How fast the MQTT outbox drains a backlog into a real broker (QoS 1, PUBACK-tracked).

Fills a fresh journal with N results, starts the outbox against the broker and times until every
row is acknowledged. Start a broker first (e.g. `mosquitto -p 18830`).

    python benchmarks/outbox_rate.py --port 18830 --results 5000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from edge_runtime.config import MqttConfig
from edge_runtime.core.result import FrameInfo, Result
from edge_runtime.delivery.mqtt.client import MqttService
from edge_runtime.verdicts.journal import Journal


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=1883)
    ap.add_argument("--results", type=int, default=5000)
    ap.add_argument("--inflight", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        journal = Journal(Path(tmp) / "j.sqlite3")
        verdict = {"defect": True, "category": "scratch", "confidence": 0.87, "notes": "scratch near the edge"}
        for i in range(args.results):
            journal.add(Result(device="bench", camera="cam", frame=FrameInfo(i, 1280, 720), verdict=verdict,
                               text=json.dumps(verdict), model="m@1", prompt="p",
                               timings_ms={"total": 30.0}))
        cfg = MqttConfig(host=args.host, port=args.port, max_inflight=args.inflight, telemetry_interval_s=3600)
        service = MqttService(cfg, "bench", "edge/bench", journal, dict, {})
        t0 = time.perf_counter()
        service.start()
        while journal.counts()["unsent"] > 0:
            time.sleep(0.01)
            if time.perf_counter() - t0 > 300:
                raise SystemExit("outbox did not drain in 300 s")
        elapsed = time.perf_counter() - t0
        service.stop()
        print(json.dumps({"results": args.results, "seconds": round(elapsed, 2),
                          "acknowledged_per_s": round(args.results / elapsed, 1), "max_inflight": args.inflight}))


if __name__ == "__main__":
    main()
