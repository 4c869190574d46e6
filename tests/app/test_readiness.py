"""Readiness is "can inspect and journal": a sink that cannot deliver degrades the device, and shows in
/readyz's body, /api/v1/status, /metrics and MQTT telemetry, but /readyz still answers 200 (the image's
HEALTHCHECK and the OTA agent's health gate read its code). A real `edge-runtime run` process, a real
Mosquitto and a real webhook receiver that appears later on the port the rule points at."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from edge_runtime.core.samples import write_sample_video
from tests.app.test_lifecycle import start
from tests.support.broker import Broker
from tests.support.mjpeg import free_port
from tests.support.receiver import Receiver, Subscriber
from tests.support.waiting import wait_for

CONFIG = """\
device_id: ready-1
data_dir: {data}
model: {{path: {bundle}, threads: 2}}
mqtt: {{host: 127.0.0.1, port: {broker}, telemetry_interval_s: 1}}
api: {{host: 127.0.0.1, port: {api}}}
cameras:
  - name: cam
    source: {video}
    trigger: {{mode: interval, interval_s: 0.5}}
rules:
  - name: every
    actions:
      - type: webhook
        url: http://127.0.0.1:{hook}/hook
        timeout_s: 1
"""


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:  # not serving yet
        return 0, b""


def readyz(port: int) -> tuple[int, dict[str, Any]]:
    code, body = get(port, "/readyz")
    return code, (json.loads(body) if code else {})


def test_a_dead_webhook_receiver_degrades_the_device_but_readyz_stays_200_and_heals(
        tmp_path: Path, demo_dir: Path) -> None:
    receiver = Receiver()  # not started: its port is closed, every POST is refused
    broker = Broker(tmp_path / "broker").start()
    telemetry = Subscriber(broker.port, "edge/ready-1/telemetry")
    api = free_port()
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(CONFIG.format(data=tmp_path / "data", bundle=demo_dir, broker=broker.port, api=api,
                                 hook=receiver.port, video=write_sample_video(tmp_path / "v.avi", frames=20)))
    log = tmp_path / "log"
    proc = start(cfg, log)
    reason = f"webhooks: blocked: http://127.0.0.1:{receiver.port}"  # the webhook sink's health
    try:
        code, health = wait_for(lambda: (r := readyz(api))[1].get("state") == "degraded" and r, 90,
                                "/readyz to report the blocked receiver")
        assert code == 200, (code, health)  # before: 503 for as long as the receiver stayed down
        assert health["ready"] is True and health["reasons"] == [reason], health

        status = json.loads(get(api, "/api/v1/status")[1])
        assert status["ready"] is True and status["health"]["state"] == "degraded", status["health"]
        assert reason in status["health"]["reasons"]
        assert status["webhooks"]["blocked"] == [f"http://127.0.0.1:{receiver.port}"], status["webhooks"]
        metrics = get(api, "/metrics")[1].decode()
        assert "edge_runtime_ready 1.0" in metrics
        assert f'edge_runtime_degraded{{reason="{reason}"}} 1.0' in metrics
        sent = wait_for(lambda: [m for m in telemetry.on("/telemetry") if reason in m["health"]["reasons"]],
                        30, "telemetry naming the blocked receiver")
        assert sent[-1]["health"]["ready"] is True and sent[-1]["health"]["state"] == "degraded"

        receiver.start()  # the receiver comes up where the rule points: it heals by itself
        wait_for(lambda: receiver.keys(), 60, "the held deliveries after the receiver came up")
        code, health = wait_for(lambda: (r := readyz(api))[1].get("state") == "ok" and r, 60, "health to heal")
        assert code == 200 and health == {"ready": True, "state": "ok", "reasons": [], "model": health["model"]}
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        telemetry.client.loop_stop()
        receiver.stop()
        broker.stop()
    assert rc == 0, log.read_text()[-2000:]
