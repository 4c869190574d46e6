"""Line I/O latency as a PLC sees it, per protocol: trigger -> AcquisitionDone and trigger -> ResultValid.

The real daemon in-process on the demo bundle (ONNX Runtime + llama.cpp), a video camera in on_demand
mode, the OPC UA server with Basic256Sha256 SignAndEncrypt, and the independent node-opcua client
(npm; tests/support/opcua_client.js) calling StartSingleJob and timing its subscription's data changes
(the node client's own monotonic clock on both ends); Modbus TCP from the npm modbus-serial client
polling the status word; Sparkplug B from a paho host sending DCMDs through Mosquitto. Each job is
acknowledged before the next. One JSON line per protocol.

    python benchmarks/line_io.py --jobs 50 [--protocol opcua|modbus|sparkplug|all]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support: the node-opcua driver and certificates

import edge_runtime.inference.engines  # noqa: E402,F401 - onnxruntime, then llama_cpp (see engines.py)
from edge_runtime.app.daemon import Daemon  # noqa: E402
from edge_runtime.config import CameraConfig, Config, TriggerConfig  # noqa: E402
from edge_runtime.config.line_io import LineIOConfig  # noqa: E402
from edge_runtime.config.line_protocols import SparkplugConfig  # noqa: E402
from edge_runtime.config.mqtt import MqttConfig  # noqa: E402
from edge_runtime.core.samples import write_sample_video  # noqa: E402
from edge_runtime.lineio.passwords import hash_password  # noqa: E402
from edge_runtime.lineio.sparkplug import payload as spb  # noqa: E402
from edge_runtime.lineio.sparkplug.node import SparkplugNode  # noqa: E402
from tests.lineio.test_modbus import MODBUS_SERIAL  # noqa: E402
from tests.lineio.test_sparkplug import GROUP, NODE, Host, is_, topic  # noqa: E402
from tests.support.broker import Broker  # noqa: E402
from tests.support.mjpeg import free_port  # noqa: E402
from tests.support.npm import npm_package  # noqa: E402
from tests.support.opcua_peer import NodeClient, client_certificate, trust  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def line_daemon(args: argparse.Namespace, tmp: Path, **protocols: object) -> Daemon:
    """The real daemon on the demo bundle with one on_demand station and the given protocol sections."""
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
                      "nok_when": [{"field": "verdict.defect", "equals": True}]}], **protocols})
    daemon = Daemon(cfg)
    daemon.start()
    return daemon


def summary(protocol: str, args: argparse.Namespace, acquired: list[float], valid: list[float],
            **extra: object) -> dict[str, object]:
    return {"protocol": protocol, "jobs": len(valid), "camera_fps": args.fps, **extra,
            "trigger_to_acquisition_done_ms": {"p50": pct(acquired, 0.5), "p99": pct(acquired, 0.99),
                                               "mean": round(statistics.fmean(acquired), 2)},
            "trigger_to_result_valid_ms": {"p50": pct(valid, 0.5), "p99": pct(valid, 0.99),
                                           "mean": round(statistics.fmean(valid), 2)}}


def wait_ready(daemon: Daemon, listening: Callable[[], bool]) -> None:
    assert daemon.line_io is not None
    station = daemon.line_io.stations[0]
    deadline = time.monotonic() + 60
    while not (station.signals().ready and listening()) and time.monotonic() < deadline:
        time.sleep(0.05)


def opcua(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    port = free_port()
    cert, key = client_certificate(tmp / "plc", "urn:bench:plc")
    trust(tmp / "pki", cert)
    daemon = line_daemon(args, tmp, opcua={"enabled": True, "port": port, "pki_dir": str(tmp / "pki"),
                                           "users": [{"name": "plc", "password_hash": hash_password("secret")}]})
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
        return summary("opcua", args, acquired, valid, subscription_ms=args.interval_ms)
    finally:
        plc.close()
        daemon.stop()


def modbus(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    """The npm modbus-serial client (tests/lineio/modbus_plc.js) polling the status word as fast as it can."""
    port = free_port()
    daemon = line_daemon(args, tmp, modbus={"enabled": True, "port": port})
    try:
        assert daemon.line_io is not None
        wait_ready(daemon, lambda: bool(daemon.line_io and daemon.line_io.adapters[0].listening.is_set()))
        node = shutil.which("node")
        assert node, "node is needed for the modbus-serial client"
        out = subprocess.run([node, str(ROOT / "tests/lineio/modbus_plc.js"), str(port),
                              *[f"handshake:B{i}" for i in range(args.jobs)]], capture_output=True, text=True,
                             timeout=60 + 30 * args.jobs,
                             env={"NODE_PATH": str(npm_package(MODBUS_SERIAL)), "PATH": "/usr/bin:/bin",
                                  "RESULT_WAIT_MS": "60000"})  # the station's result_deadline_ms
        rows = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
        assert rows and all("ms_result" in r for r in rows), (rows, out.stderr)
        return summary("modbus", args, [r["ms_acquired"] for r in rows], [r["ms_result"] for r in rows])
    finally:
        daemon.stop()


def sparkplug(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    """A Sparkplug host (paho) sending DCMD Trigger and timing the node's DDATA, on a private Mosquitto
    with set_tcp_nodelay (docs/line-io.md: without it each burst of DDATA waited ~40 ms)."""
    broker = Broker(tmp / "broker")
    broker.conf.write_text(broker.conf.read_text() + "set_tcp_nodelay true\n")
    broker.start()
    daemon = line_daemon(args, tmp)
    assert daemon.line_io is not None
    stations = daemon.line_io.stations
    node = SparkplugNode(stations, SparkplugConfig(enabled=True, group_id=GROUP, device_commands=True),
                         MqttConfig(host="127.0.0.1", port=broker.port), NODE, tmp / "bdseq")
    # The host subscribes before the node connects, as a primary host does: started the other way round,
    # a slow machine let the node publish its births before anyone listened (CI, stop 37).
    host = Host(broker.port)
    node.start()
    try:
        wait_ready(daemon, lambda: node.connected)
        host.wait(is_("DBIRTH", "st1"), timeout=30)
        acquired, valid = [], []
        for i in range(args.jobs):
            mark = len(host.messages)
            t0 = time.perf_counter()
            host.client.publish(topic("DCMD", "st1"), spb.payload(None, [("PartId", spb.STRING, f"B{i}"),
                                                                         ("Trigger", spb.BOOLEAN, True),
                                                                         ("ResultAck", spb.BOOLEAN, False)]))
            host.wait(lambda _t, m: m.get("AcquisitionDone") is True or m.get("ResultValid") is True, mark, 60)
            acquired.append((time.perf_counter() - t0) * 1000)
            j, _m = host.wait(lambda _t, m: m.get("ResultValid") is True, mark, 60)
            valid.append((time.perf_counter() - t0) * 1000)
            host.client.publish(topic("DCMD", "st1"), spb.payload(None, [("Trigger", spb.BOOLEAN, False),
                                                                         ("ResultAck", spb.BOOLEAN, True)]))
            host.wait(lambda _t, m: m.get("ResultValid") is False, j, 60)
        return summary("sparkplug", args, acquired, valid)
    finally:
        host.close()
        node.stop()
        daemon.stop()
        broker.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--fps", type=float, default=60, help="the camera's frame rate (AcquisitionDone waits a frame)")
    ap.add_argument("--interval-ms", type=float, default=5, help="the PLC's subscription sampling/publishing")
    ap.add_argument("--model", help="a bundle folder (default: the demo bundle)")
    ap.add_argument("--protocol", choices=["opcua", "modbus", "sparkplug", "all"], default="all")
    args = ap.parse_args()
    runs = {"opcua": opcua, "modbus": modbus, "sparkplug": sparkplug}
    for name, run in runs.items():
        if args.protocol in (name, "all"):
            with tempfile.TemporaryDirectory() as tmp:
                print(json.dumps(run(args, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
