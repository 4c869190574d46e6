"""MQTT against a real Mosquitto: delivery, availability, outages, auth, TLS, commands."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, MqttConfig, TriggerConfig
from edge_runtime.core.samples import write_sample_video
from edge_runtime.delivery.mqtt import client as mqtt_client
from tests.support.broker import Broker
from tests.support.waiting import wait_for

PREFIX = "edge/mq-test"


class Subscriber:
    """A plain paho client, like a line's MES would run."""

    def __init__(self, port: int, topic: str, client_id: str | None = None, persistent: bool = False,
                 **tls: Any) -> None:
        self.messages: list[tuple[str, bytes, bool]] = []
        self.lock = threading.Lock()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id or uuid.uuid4().hex,
                                  clean_session=not persistent)
        self.client.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
        self.client.on_message = self._on_message
        self.client.reconnect_delay_set(0.2, 1)  # type: ignore[arg-type]  # paho annotates int; it takes a float
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _on_message(self, _c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.messages.append((msg.topic, bytes(msg.payload), msg.retain))

    def on(self, topic: str) -> list[bytes]:
        with self.lock:
            return [p for t, p, _ in self.messages if t == topic]

    def result_ids(self) -> set[str]:
        with self.lock:
            return {json.loads(p)["id"] for t, p, _ in self.messages if t.endswith("/result")}

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sample_video(tmp_path_factory.mktemp("v") / "v.avi", frames=40)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path / "broker").start()
    yield b
    b.stop()


def make_config(tmp_path: Path, demo_dir: Path, video: Path, port: int, interval: float = 0.2,
                **mqtt_settings: Any) -> Config:
    cfg = Config(device_id="mq-test", data_dir=tmp_path / "data")
    cfg.model.path = demo_dir
    cfg.model.threads = 2
    cfg.api.port = 0
    cfg.cameras = [CameraConfig(name="belt", source=str(video), fps=30,
                                trigger=TriggerConfig(mode="interval", interval_s=interval))]
    cfg.mqtt = MqttConfig.model_validate({**cfg.mqtt.model_dump(), "host": "127.0.0.1", "port": port,
                                          "telemetry_interval_s": 1, **mqtt_settings})
    return cfg


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    running: list[Daemon] = []
    yield running
    for d in running:
        if d.inspector is not None:
            d.stop()


def start_daemon(cfg: Config, running: list[Daemon]) -> Daemon:
    d = Daemon(cfg)
    d.start()
    running.append(d)
    return d


def test_results_arrive_as_valid_json_with_status_and_telemetry(
        tmp_path: Path, demo_dir: Path, video: Path, broker: Broker, daemons: list[Daemon]) -> None:
    sub = Subscriber(broker.port, f"{PREFIX}/#")
    try:
        daemon = start_daemon(make_config(tmp_path, demo_dir, video, broker.port), daemons)
        wait_for(lambda: len(sub.on(f"{PREFIX}/belt/result")) >= 3, what="3 results")
        wait_for(lambda: any(json.loads(t)["cameras"] for t in sub.on(f"{PREFIX}/telemetry")), what="telemetry")
        assert sub.on(f"{PREFIX}/status")[0] == b"online"
        for payload in sub.on(f"{PREFIX}/belt/result"):
            result = json.loads(payload)
            assert result["camera"] == "belt" and result["device"] == "mq-test"
            assert daemon.journal.get(result["id"]) == result
        telemetry = json.loads(sub.on(f"{PREFIX}/telemetry")[-1])
        assert telemetry["cameras"][0]["name"] == "belt" and "outbox_backlog" in telemetry
        assert daemon.status()["mqtt"]["connected"] is True
        daemon.stop()
        wait_for(lambda: sub.on(f"{PREFIX}/status")[-1] == b"offline", what="offline on clean stop")
    finally:
        sub.close()


def test_mosquitto_sub_sees_the_same_results(tmp_path: Path, demo_dir: Path, video: Path, broker: Broker,
                                             daemons: list[Daemon]) -> None:
    proc = subprocess.Popen(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(broker.port), "-q", "1",
                             "-t", f"{PREFIX}/belt/result", "-C", "3", "-W", "60"],
                            stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    daemon = start_daemon(make_config(tmp_path, demo_dir, video, broker.port), daemons)
    out, _ = proc.communicate(timeout=70)
    lines = out.strip().splitlines()
    assert len(lines) == 3
    for line in lines:
        assert daemon.journal.get(json.loads(line)["id"]) is not None


def run_daemon_process(cfg: Config, tmp_path: Path, name: str) -> subprocess.Popen[bytes]:
    path = tmp_path / "edge.yaml"
    path.write_text(json.dumps(json.loads(cfg.model_dump_json()), indent=1))  # JSON is valid YAML
    with (tmp_path / f"{name}.log").open("wb") as log:
        return subprocess.Popen([sys.executable, "-m", "edge_runtime", "--config", str(path), "run"],
                                stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))


def journal_ids(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        return {row[0] for row in conn.execute("SELECT id FROM results")}


def test_offline_last_will_arrives_when_the_daemon_is_killed(tmp_path: Path, demo_dir: Path, video: Path,
                                                            broker: Broker) -> None:
    sub = Subscriber(broker.port, f"{PREFIX}/status")
    proc = run_daemon_process(make_config(tmp_path, demo_dir, video, broker.port), tmp_path, "d")
    try:
        wait_for(lambda: b"online" in sub.on(f"{PREFIX}/status"), what="online")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        wait_for(lambda: sub.on(f"{PREFIX}/status")[-1] == b"offline", timeout=10, what="last will")
    finally:
        proc.kill()
        sub.close()


def test_no_result_is_lost_through_broker_outage_and_daemon_kill(tmp_path: Path, demo_dir: Path, video: Path,
                                                                broker: Broker) -> None:
    # The line's consumer keeps a persistent session, so the broker queues for it while it is away.
    sub = Subscriber(broker.port, f"{PREFIX}/+/result", client_id="mes-consumer", persistent=True)
    cfg = make_config(tmp_path, demo_dir, video, broker.port, interval=0.1)
    db = cfg.journal_path()
    proc = run_daemon_process(cfg, tmp_path, "first")
    try:
        wait_for(lambda: len(sub.result_ids()) >= 3, what="results before the outage")
        broker.stop()
        during = len(journal_ids(db))
        wait_for(lambda: len(journal_ids(db)) >= during + 8, what="results during the outage")
        proc.send_signal(signal.SIGKILL)  # with unsent results in the journal
        proc.wait(10)
        proc = run_daemon_process(cfg, tmp_path, "second")
        after_kill = len(journal_ids(db))
        wait_for(lambda: len(journal_ids(db)) >= after_kill + 5, what="results after the restart")
        broker.start()
        wait_for(lambda: journal_ids(db) <= sub.result_ids(), timeout=60, what="every result delivered")
        produced, received = journal_ids(db), sub.result_ids()
        print(f"outage test: produced {len(produced)}, received {len(received)} unique ids, "
              f"{len(sub.on(f'{PREFIX}/belt/result'))} messages")
        assert produced <= received
    finally:
        proc.kill()
        proc.wait(10)
        sub.close()


def test_password_authentication(tmp_path: Path, demo_dir: Path, video: Path, daemons: list[Daemon],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    broker = Broker(tmp_path / "auth", password=("edge", "s3cret-pw")).start()
    try:
        refused = start_daemon(make_config(tmp_path / "a", demo_dir, video, broker.port), daemons)
        wait_for(lambda: "not authorized" in (refused.status()["mqtt"]["last_error"] or "").lower(),
                 what="refusal without credentials")
        assert refused.status()["mqtt"]["connected"] is False
        refused.stop()
        monkeypatch.setenv("TEST_MQTT_PASSWORD", "s3cret-pw")  # undone after the test
        from edge_runtime.config import parse_config
        secret = parse_config("mqtt:\n  password: ${TEST_MQTT_PASSWORD}\n").mqtt.password
        ok = start_daemon(make_config(tmp_path / "b", demo_dir, video, broker.port, username="edge",
                                      password=secret), daemons)
        wait_for(lambda: ok.status()["mqtt"]["connected"], what="authenticated connection")
        wait_for(lambda: ok.status()["mqtt"]["published"] >= 2, what="published with credentials")
        assert "s3cret-pw" not in json.dumps(ok.status()) and "s3cret-pw" not in repr(ok.config)
    finally:
        broker.stop()


def make_ca(folder: Path) -> tuple[Path, Path, Path]:
    """A private CA and a server certificate for 127.0.0.1, made with openssl."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (folder / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
    ext = folder / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=edge-test-ca",
        "-keyout", str(ca_key), "-out", str(ca))
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(csr))
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-days", "2", "-extfile", str(ext), "-out", str(cert))
    return ca, cert, key


def test_tls_with_a_private_ca(tmp_path: Path, demo_dir: Path, video: Path, daemons: list[Daemon]) -> None:
    ca, cert, key = make_ca(tmp_path / "pki")
    other_ca, _, _ = make_ca(tmp_path / "other")
    broker = Broker(tmp_path / "tls", tls=(ca, cert, key)).start()
    try:
        wrong = start_daemon(make_config(tmp_path / "w", demo_dir, video, broker.port,
                                         tls={"enabled": True, "ca_file": other_ca}), daemons)
        good = start_daemon(make_config(tmp_path / "g", demo_dir, video, broker.port,
                                        tls={"enabled": True, "ca_file": ca}), daemons)
        wait_for(lambda: good.status()["mqtt"]["published"] >= 2, what="results over TLS")
        # Verification is on by default: the wrong CA's handshake fails, and the status says so.
        wait_for(lambda: wrong.status()["mqtt"]["last_error"], what="the TLS failure to be reported")
        mqtt = wrong.status()["mqtt"]
        assert mqtt["connected"] is False and mqtt["published"] == 0
        assert "cannot connect" in mqtt["last_error"]
    finally:
        broker.stop()


def test_commands_get_replies_with_the_correlation_id(tmp_path: Path, demo_dir: Path, video: Path,
                                                      broker: Broker, daemons: list[Daemon]) -> None:
    daemon = start_daemon(make_config(tmp_path, demo_dir, video, broker.port, interval=60), daemons)
    wait_for(lambda: daemon.status()["mqtt"]["connected"], what="connected")
    wait_for(lambda: daemon.rigs["belt"].camera.slot.peek(), what="a frame")
    sub = Subscriber(broker.port, f"{PREFIX}/cmd/+/reply")
    time.sleep(0.3)

    def ask(name: str, payload: bytes) -> dict[str, Any]:
        before = len(sub.on(f"{PREFIX}/cmd/{name}/reply"))
        sub.client.publish(f"{PREFIX}/cmd/{name}", payload, qos=1)
        wait_for(lambda: len(sub.on(f"{PREFIX}/cmd/{name}/reply")) > before, what=f"{name} reply")
        return dict(json.loads(sub.on(f"{PREFIX}/cmd/{name}/reply")[-1]))

    try:
        reply = ask("trigger", b'{"id": "c-1", "camera": "belt", "prompt": "Any cracks?"}')
        assert reply["ok"] is True and reply["id"] == "c-1"
        assert daemon.journal.get(reply["result"]["result_id"])["prompt"] == "Any cracks?"  # type: ignore[index]
        assert ask("status", b'{"id": 7}')["result"]["device"] == "mq-test"
        assert ask("reload", b"{}")["ok"] is True
        bad = {
            ("trigger", b'{"id": "c-2", "camera": "nope"}'): "no camera named 'nope'",
            ("trigger", b'{"id": "c-3"}'): "camera: Field required",
            ("trigger", b'{"camera": "belt", "colour": 1}'): "colour: Extra inputs are not permitted",
            ("trigger", b"{not json"): "not valid JSON",
            ("trigger", b"[1, 2]"): "must be a JSON object",
            ("explode", b"{}"): "unknown command 'explode'",
            ("trigger", b'{"camera": "belt", "prompt": "a\\ud800"}'): "prompt: contains a lone surrogate",
            ("trigger", b'{"camera": "nope", "camera": "belt"}'): "camera: the key appears more than once",
        }
        for (name, payload), message in bad.items():
            reply = ask(name, payload)
            assert reply["ok"] is False and message in reply["error"], reply
        assert ask("status", b"{}")["ok"] is True  # still alive after the bad ones
    finally:
        sub.close()


def test_home_assistant_discovery_is_retained(tmp_path: Path, demo_dir: Path, video: Path, broker: Broker,
                                              daemons: list[Daemon]) -> None:
    daemon = start_daemon(make_config(tmp_path, demo_dir, video, broker.port,
                                      homeassistant={"enabled": True}), daemons)
    wait_for(lambda: daemon.status()["mqtt"]["connected"], what="connected")
    time.sleep(0.5)  # a consumer that arrives later must get the configs from the broker (retained)
    sub = Subscriber(broker.port, "homeassistant/#")
    try:
        wait_for(lambda: len(sub.messages) >= 3, what="discovery configs")
        with sub.lock:
            configs = {t: json.loads(p) for t, p, retained in sub.messages}
            assert all(retained for _, _, retained in sub.messages)
        defect = configs["homeassistant/binary_sensor/mq-test_belt/defect/config"]
        assert defect["state_topic"] == f"{PREFIX}/belt/result"
        assert defect["availability_topic"] == f"{PREFIX}/status"
    finally:
        sub.close()


def test_without_a_broker_the_daemon_keeps_journaling(tmp_path: Path, demo_dir: Path, video: Path,
                                                      daemons: list[Daemon]) -> None:
    from tests.support.mjpeg import free_port
    daemon = start_daemon(make_config(tmp_path, demo_dir, video, free_port()), daemons)
    wait_for(lambda: daemon.journal.counts()["total"] >= 3, what="journaled results")
    status = daemon.status()
    assert status["mqtt"]["connected"] is False and status["mqtt"]["backlog"] >= 3


def test_a_broker_away_too_long_degrades_the_device_and_its_return_heals_it(
        tmp_path: Path, demo_dir: Path, video: Path, broker: Broker, daemons: list[Daemon],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mqtt_client, "BROKER_DOWN_DEGRADED_S", 1.0)
    daemon = start_daemon(make_config(tmp_path, demo_dir, video, broker.port), daemons)
    wait_for(lambda: daemon.mqtt is not None and daemon.mqtt.connected, what="connected")
    assert daemon.health()["state"] == "ok"
    broker.stop()
    wait_for(lambda: any(r.startswith("mqtt: broker") for r in daemon.health()["reasons"]), timeout=20,
             what="degraded by the broker's absence")
    health = daemon.health()
    assert health["state"] == "degraded" and health["ready"] is True  # inspection goes on, verdicts wait
    broker.start()
    wait_for(lambda: daemon.health()["state"] == "ok", timeout=40, what="healed by the broker's return")
