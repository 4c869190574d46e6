"""Line I/O latency as a PLC sees it, per protocol: trigger -> AcquisitionDone and trigger -> ResultValid.

The real daemon in-process on the demo bundle (ONNX Runtime + llama.cpp), a video camera in on_demand
mode, the OPC UA server with Basic256Sha256 SignAndEncrypt, and the independent node-opcua client
(npm; tests/support/opcua_client.js) calling StartSingleJob and timing its subscription's data changes
(the node client's own monotonic clock on both ends). Each job is acknowledged before the next.

    python benchmarks/line_io.py --jobs 50
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support: the node-opcua driver and certificates

import edge_runtime.inference.engines  # noqa: E402,F401 - onnxruntime, then llama_cpp (see engines.py)
from edge_runtime.app.daemon import Daemon  # noqa: E402
from edge_runtime.config import CameraConfig, Config, TriggerConfig  # noqa: E402
from edge_runtime.config.line_io import LineIOConfig  # noqa: E402
from edge_runtime.core.samples import write_sample_video  # noqa: E402
from edge_runtime.lineio.passwords import hash_password  # noqa: E402
from tests.support.mjpeg import free_port  # noqa: E402
from tests.support.opcua_peer import NodeClient, client_certificate, trust  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def opcua(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    port = free_port()
    cert, key = client_certificate(tmp / "plc", "urn:bench:plc")
    trust(tmp / "pki", cert)
    cfg = Config(device_id="bench-line", data_dir=tmp / "data")
    cfg.model.threads = 2
    if args.model:
        cfg.model.path = Path(args.model)
    cfg.api.enabled = False
    cfg.mqtt.enabled = False
    cfg.cameras = [CameraConfig(name="cam", source=str(write_sample_video(tmp / "v.avi", frames=90)), fps=args.fps,
                                trigger=TriggerConfig(mode="on_demand"))]
    cfg.line_io = LineIOConfig.model_validate({
        "stations": [{"name": "st1", "camera": "cam", "result_deadline_ms": 60_000,
                      "nok_when": [{"field": "verdict.defect", "equals": True}]}],
        "opcua": {"enabled": True, "port": port, "pki_dir": str(tmp / "pki"),
                  "users": [{"name": "plc", "password_hash": hash_password("secret")}]}})
    daemon = Daemon(cfg)
    daemon.start()
    plc = NodeClient(tmp / "node")
    try:
        assert daemon.line_io is not None
        station = daemon.line_io.stations[0]
        deadline = time.monotonic() + 60
        while not (station.signals().ready and daemon.line_io.adapters[0].listening) and time.monotonic() < deadline:
            time.sleep(0.05)
        answer = plc.connect(f"opc.tcp://127.0.0.1:{port}/edge-runtime/", cert, key, "urn:bench:plc")
        assert answer["ok"], answer
        plc.request("subscribe", station="st1", names=["AcquisitionDone", "ResultValid"], interval=args.interval_ms)
        acquired, valid = [], []
        for i in range(args.jobs):
            mark = len(plc.notes)
            call = plc.request("call", station="st1", method="StartSingleJob", args=[f"B{i}", ""])
            assert call["status"] == "Good", call
            t0, seq = call["t0"], call["out"][0]

            def after(name: str, value: bool, m: int = mark) -> float:
                note = plc.wait_note(lambda n: plc.notes.index(n) >= m and n.get("change") == name
                                     and n["value"] is value, timeout=60)
                return float(note["t"])
            acquired.append(after("AcquisitionDone", True) - t0)
            valid.append(after("ResultValid", True) - t0)
            plc.request("call", station="st1", method="ResultAck", args=[seq])
            after("ResultValid", False, len(plc.notes) - 1)
        return {"protocol": "opcua", "jobs": args.jobs, "camera_fps": args.fps,
                "subscription_ms": args.interval_ms,
                "trigger_to_acquisition_done_ms": {"p50": pct(acquired, 0.5), "p99": pct(acquired, 0.99),
                                                   "mean": round(statistics.fmean(acquired), 2)},
                "trigger_to_result_valid_ms": {"p50": pct(valid, 0.5), "p99": pct(valid, 0.99),
                                               "mean": round(statistics.fmean(valid), 2)}}
    finally:
        plc.close()
        daemon.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--fps", type=float, default=60, help="the camera's frame rate (AcquisitionDone waits a frame)")
    ap.add_argument("--interval-ms", type=float, default=5, help="the PLC's subscription sampling/publishing")
    ap.add_argument("--model", help="a bundle folder (default: the demo bundle)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(opcua(args, Path(tmp))))


if __name__ == "__main__":
    main()
