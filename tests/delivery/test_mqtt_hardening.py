"""MQTT against a real Mosquitto when things go wrong: poison rows, refused connections, removed cameras."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, TriggerConfig
from tests.delivery.test_mqtt import PREFIX, Subscriber, broker, daemons, make_config, start_daemon, video  # noqa: F401
from tests.support.broker import Broker
from tests.support.file_daemon import daemon_from_file
from tests.support.mjpeg import free_port
from tests.support.waiting import wait_for
from tests.verdicts.test_journal import make_result


def test_a_poison_row_is_parked_and_the_rest_is_delivered(tmp_path: Path, demo_dir: Path, video: Path,  # noqa: F811
                                                          broker: Broker, daemons: list[Daemon]) -> None:  # noqa: F811
    sub = Subscriber(broker.port, f"{PREFIX}/+/result")
    try:
        daemon = start_daemon(make_config(tmp_path, demo_dir, video, broker.port, interval=0.1), daemons)
        wait_for(lambda: sub.result_ids(), what="a first result")
        # A row paho refuses (a wildcard in its topic), as a name from an older, unanchored config made.
        daemon.journal.add(make_result(camera="line#1"))
        after = daemon.journal.counts()["total"]
        wait_for(lambda: len(sub.result_ids()) >= after + 3, timeout=30, what="results after the poison row")
        status = daemon.status()
        assert status["mqtt"]["parked"] == 1 and status["journal"]["parked"] == 1
        [(_, camera, reason)] = daemon.journal.parked()
        assert camera == "line#1" and "wildcard" in reason
        assert status["threads"]["mqtt-outbox"] == {"alive": True, "restarts": 0}
    finally:
        sub.close()


def test_a_refused_broker_connection_shows_in_status_and_logs_once(
        tmp_path: Path, demo_dir: Path, video: Path, daemons: list[Daemon],  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()  # nothing listens there: every attempt is refused
    daemon = start_daemon(make_config(tmp_path, demo_dir, video, port), daemons)
    wait_for(lambda: daemon.status()["mqtt"]["last_error"], timeout=15, what="last_error")
    assert f"127.0.0.1:{port}" in daemon.status()["mqtt"]["last_error"]
    time.sleep(4)  # paho retries every second or two: still one line
    lines = [r for r in caplog.records if "cannot connect" in r.getMessage()]
    assert len(lines) == 1


def test_removing_a_camera_clears_its_retained_discovery(tmp_path: Path, demo_dir: Path, video: Path,  # noqa: F811
                                                        broker: Broker) -> None:  # noqa: F811
    cfg = make_config(tmp_path, demo_dir, video, broker.port, homeassistant={"enabled": True})
    cfg.cameras.append(CameraConfig(name="side", source=str(video), fps=30,
                                    trigger=TriggerConfig(mode="interval", interval_s=1)))
    path = tmp_path / "edge.yaml"
    with daemon_from_file(path, cfg, running=cfg) as started:  # the daemon runs `cfg` itself, as before
        daemon = started.daemon
        wait_for(lambda: daemon.status()["mqtt"]["connected"], what="connected")
        edited = cfg.model_copy(deep=True)
        edited.cameras = edited.cameras[:1]
        edited.mqtt.keepalive = 45  # a setting only a restart applies: the reload must name it
        path.write_text(edited.model_dump_json())
        outcome = daemon.reload()
        assert outcome == {"applied": ["cameras"], "restart_needed": ["mqtt.keepalive"]}
        assert daemon.config.mqtt.keepalive == 30  # status shows what runs, not what waits for a restart
        time.sleep(0.5)
        sub = Subscriber(broker.port, "homeassistant/#")  # what a Home Assistant starting now would see
        try:
            wait_for(lambda: len(sub.messages) >= 3, what="retained discovery")
            time.sleep(0.5)
            with sub.lock:
                topics = {t for t, payload, _ in sub.messages if payload}
            assert topics and all("mq-test_belt" in t for t in topics)
        finally:
            sub.close()


def run_process(config_path: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "edge_runtime", "--config", str(config_path), "run"],
                                stdout=out, stderr=subprocess.STDOUT)


def journal_ids(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        return {row[0] for row in conn.execute("SELECT id FROM results WHERE camera != 'line#1'")}


@pytest.mark.robustness
def test_outage_kill_and_poison_row_lose_no_result(tmp_path: Path, demo_dir: Path, video: Path,  # noqa: F811
                                                   broker: Broker) -> None:  # noqa: F811
    sub = Subscriber(broker.port, f"{PREFIX}/+/result", client_id="mes-consumer", persistent=True)
    cfg = make_config(tmp_path, demo_dir, video, broker.port, interval=0.1)
    path = tmp_path / "edge.yaml"
    path.write_text(cfg.model_dump_json())
    db = cfg.journal_path()
    proc = run_process(path, tmp_path / "log")
    try:
        wait_for(lambda: len(sub.result_ids()) >= 3, what="results before the outage")
        broker.stop()
        during = len(journal_ids(db))
        wait_for(lambda: len(journal_ids(db)) >= during + 8, what="results during the outage")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        with sqlite3.connect(db) as conn:  # a poison row among the unsent ones
            conn.execute("INSERT INTO results (id, ts, created, camera, body) VALUES (?, ?, ?, ?, ?)",
                         ("poison", "2026-01-01T00:00:00Z", time.time(), "line#1", "{}"))
        proc = run_process(path, tmp_path / "log")
        after_kill = len(journal_ids(db))
        wait_for(lambda: len(journal_ids(db)) >= after_kill + 5, what="results after the restart")
        broker.start()
        # Every result journaled so far (the outage, the kill and the poison row are all behind us);
        # the daemon goes on producing, so a set read later could hold one not yet published.
        produced = journal_ids(db)
        wait_for(lambda: produced <= sub.result_ids(), timeout=60, what="every result delivered")
        received = sub.result_ids()
        print(f"outage + kill -9 + poison row: produced {len(produced)}, received {len(received)}, "
              f"lost {len(produced - received)}")
        assert not produced - received
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT sent FROM results WHERE id = 'poison'").fetchone()[0] == 2
    finally:
        proc.kill()
        proc.wait(10)
        sub.close()


def test_ctrl_c_stops_without_a_warning(tmp_path: Path, demo_dir: Path, video: Path,  # noqa: F811
                                        broker: Broker) -> None:  # noqa: F811
    cfg = make_config(tmp_path, demo_dir, video, broker.port)
    path = tmp_path / "edge.yaml"
    path.write_text(cfg.model_dump_json())
    sub = Subscriber(broker.port, f"{PREFIX}/+/result")
    proc = run_process(path, tmp_path / "log")
    try:
        wait_for(lambda: sub.result_ids(), what="a delivered result")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 0
    finally:
        proc.kill()
        sub.close()
    log = (tmp_path / "log").read_text()
    assert "daemon: stopped" in log and " WARNING " not in log and "Traceback" not in log
    assert json.loads(json.dumps(log.count("ERROR"))) == 0


def _replies(sub: Subscriber, name: str) -> list[dict[str, object]]:
    return [json.loads(p) for p in sub.on(f"{PREFIX}/cmd/{name}/reply")]


def test_an_oversized_command_is_refused_before_it_is_parsed(tmp_path: Path, demo_dir: Path, video: Path,  # noqa: F811
                                                             broker: Broker, daemons: list[Daemon]) -> None:  # noqa: F811
    # Four 20 MB `{"x": [{}, {}, ...]}` status commands held the command threads 62 s and grew the daemon
    # by 2.7 GB before the next command was answered: the payload was parsed (and each value checked in
    # Python) before anything looked at its size.
    daemon = start_daemon(make_config(tmp_path, demo_dir, video, broker.port, interval=60), daemons)
    wait_for(lambda: daemon.status()["mqtt"]["connected"], what="connected")
    sub = Subscriber(broker.port, f"{PREFIX}/cmd/+/reply")
    try:
        time.sleep(0.3)
        payload = b'{"x": [' + b"{}," * 700_000 + b"{}]}"  # 2.1 MB
        sub.client.publish(f"{PREFIX}/cmd/status", payload, qos=1)
        [reply] = wait_for(lambda: _replies(sub, "status"), what="the refusal")
        assert reply["ok"] is False and reply["field"] == "payload"
        assert "larger than 64 KiB" in str(reply["error"])
        assert daemon.status()["mqtt"]["commands_refused"] == 1
        sub.client.publish(f"{PREFIX}/cmd/status", b'{"id": "after"}', qos=1)
        wait_for(lambda: any(r["id"] == "after" and r["ok"] for r in _replies(sub, "status")), what="a later reply")
    finally:
        sub.close()


def test_a_command_flood_is_refused_past_a_bounded_backlog(tmp_path: Path, demo_dir: Path, video: Path,  # noqa: F811
                                                           broker: Broker, daemons: list[Daemon]) -> None:  # noqa: F811
    # Commands waited for the two command threads in an unbounded queue: a flood while they were busy
    # (a trigger waits up to 300 s for its verdict) grew memory without limit and delayed every later
    # command behind it. Past the bound each gets an `ok: false` "busy" reply at once.
    from edge_runtime.delivery.mqtt.client import MAX_PENDING_COMMANDS

    daemon = start_daemon(make_config(tmp_path, demo_dir, video, broker.port, interval=60), daemons)
    wait_for(lambda: daemon.status()["mqtt"]["connected"], what="connected")
    assert daemon.mqtt is not None
    release = threading.Event()
    started: list[int] = []

    def slow(_payload: dict[str, object]) -> dict[str, object]:  # a trigger waiting for its verdict
        started.append(1)
        release.wait(30)
        return {}

    daemon.mqtt.commands["slow"] = slow
    sub = Subscriber(broker.port, f"{PREFIX}/cmd/+/reply")
    try:
        time.sleep(0.3)
        flood = 100
        for i in range(flood):
            sub.client.publish(f"{PREFIX}/cmd/slow", json.dumps({"id": i}).encode(), qos=1)
        busy = flood - MAX_PENDING_COMMANDS
        wait_for(lambda: len(_replies(sub, "slow")) >= busy, what="busy replies")
        replies = _replies(sub, "slow")
        assert len(replies) == busy and all(r["ok"] is False and "busy" in str(r["error"]) for r in replies)
        assert {r["id"] for r in replies} == set(range(MAX_PENDING_COMMANDS, flood))  # the newest are refused
        release.set()
        wait_for(lambda: len(_replies(sub, "slow")) == flood, what="the accepted ones answered")
        assert len(started) == MAX_PENDING_COMMANDS
        assert daemon.status()["mqtt"]["commands_refused"] == busy
    finally:
        release.set()
        sub.close()


def test_a_retained_command_is_not_run_again_on_every_connect(tmp_path: Path, demo_dir: Path, video: Path,  # noqa: F811
                                                              broker: Broker, daemons: list[Daemon]) -> None:  # noqa: F811
    # `mosquitto_pub -r` (or a dashboard's retain box) left `cmd/status` on the broker: the broker hands it
    # to every new subscription, so the daemon ran it at each start and each reconnect (a retained trigger:
    # one more journaled inspection every time). A command now runs only when it arrives live.
    sub = Subscriber(broker.port, f"{PREFIX}/cmd/+/reply")
    try:
        time.sleep(0.3)
        sub.client.publish(f"{PREFIX}/cmd/status", b'{"id": "kept"}', qos=1, retain=True).wait_for_publish(5)
        daemon = start_daemon(make_config(tmp_path, demo_dir, video, broker.port, interval=60), daemons)
        [reply] = wait_for(lambda: _replies(sub, "status"), what="the reply to the retained command")
        assert reply["id"] == "kept" and reply["ok"] is False and "retained" in str(reply["error"])
        assert daemon.status()["mqtt"]["commands_refused"] == 1
        sub.client.publish(f"{PREFIX}/cmd/status", b'{"id": "live"}', qos=1).wait_for_publish(5)
        wait_for(lambda: any(r["id"] == "live" and r["ok"] for r in _replies(sub, "status")), what="a live reply")
    finally:
        sub.client.publish(f"{PREFIX}/cmd/status", b"", qos=1, retain=True)  # clears it on the broker
        sub.close()
