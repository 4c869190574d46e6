"""`edge-runtime ota agent` with MQTT as its source (`service.run_agent`), against a real Mosquitto broker.
No Docker engine needed: the engine is the stand-in of test_agent_swap.py (down when the test says), or
the real Docker SDK pointed at a socket where no engine answers (an engine not up yet at boot)."""

from __future__ import annotations

import gc
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edge_runtime.config import Config
from edge_runtime.ota import recovery
from edge_runtime.ota.manifest import Manifest, generate_keypair, sign
from edge_runtime.ota.service import run_agent
from tests.ota import test_agent_swap as swap
from tests.support.broker import Broker

DEVICE = "press-7"
STATUS = f"edge/{DEVICE}/ota/status"
CMD = f"edge/{DEVICE}/cmd/ota"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path / "broker").start()
    yield b
    b.stop()


class Watcher:
    """The status topic as an operator sees it, and a publisher of manifests."""

    def __init__(self, port: int) -> None:
        self.seen: list[dict[str, Any]] = []
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2)
        self.client.on_message = lambda _c, _u, m: self.seen.append(json.loads(m.payload))
        self.client.connect("127.0.0.1", port)
        self.client.subscribe(STATUS, qos=1)
        self.client.loop_start()

    def publish(self, payload: bytes | str, retain: bool = True) -> None:
        self.client.publish(CMD, payload, qos=1, retain=retain).wait_for_publish(5)

    def phases(self) -> list[str]:
        return [s["phase"] for s in self.seen]

    def wait(self, until: Callable[[list[dict[str, Any]]], bool], timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not until(self.seen) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert until(self.seen), self.phases()

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def _config(tmp_path: Path, port: int, public: str) -> Config:
    return Config.model_validate({
        "device_id": DEVICE, "data_dir": str(tmp_path), "mqtt": {"host": "127.0.0.1", "port": port},
        "ota": {"container": "edge-runtime", "public_keys": [public], "state_dir": str(tmp_path / "ota")}})


def _interrupted(tmp_path: Path, private: str) -> None:
    """The agent was killed while it pulled 2.0.0 (nothing changed yet): its recovery needs the engine."""
    manifest = sign(Manifest(image=swap.IMAGE, version="2.0.0"), private)
    (tmp_path / "ota").mkdir()
    (tmp_path / "ota" / "state.json").write_text(json.dumps({"phase": "pulling", "manifest": manifest.model_dump(),
                                                             "old_id": "old-id"}))


def _start(config: Config, engine: Any = None) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    thread = threading.Thread(target=run_agent, args=(config, stop, engine), daemon=True)
    thread.start()
    return thread, stop


def test_a_recovery_that_fails_is_retried_with_backoff_before_any_manifest_is_taken(
        tmp_path: Path, broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    # service.py called agent.recover() once before its loop: with the engine down at boot the exception
    # ended the agent, and the interrupted update was never recovered.
    asked: list[int] = []  # the failure counts the backoff was asked for

    def backoff_s(failures: int) -> float:
        asked.append(failures)
        return 0.2  # short waits, for the test

    monkeypatch.setattr(recovery, "backoff_s", backoff_s)
    private, public = generate_keypair()
    _interrupted(tmp_path, private)
    engine = swap.Engine()
    engine.down = True  # the agent started before the engine answered
    watcher = Watcher(broker.port)
    # The fleet's desired state, retained: it reaches the agent at once, and must wait for the recovery.
    watcher.publish(sign(Manifest(image=swap.IMAGE, version="1.0.0"), private).model_dump_json(exclude_none=True))
    thread, stop = _start(_config(tmp_path, broker.port, public), engine)
    try:
        watcher.wait(lambda seen: sum(s["phase"] == "recovering" for s in seen) >= 3)
        assert thread.is_alive()
        recovering = [s for s in watcher.seen if s["phase"] == "recovering"]
        assert [s["recovery_failures"] for s in recovering] == list(range(1, len(recovering) + 1))
        assert recovering[0]["reason"] == "Cannot connect to the Docker daemon at unix:///var/run/docker.sock"
        assert recovering[0]["interrupted"] == "pulling" and recovering[0]["version"] == "2.0.0"
        assert asked[:3] == [1, 2, 3]
        assert "received" not in watcher.phases()  # no manifest was taken while the recovery failed
        engine.down = False
        watcher.wait(lambda seen: seen[-1]["phase"] == "current")
        after = watcher.phases()[len(recovering):]
        assert after == ["failed", "received", "current"], after  # recovered first, then the manifest
        assert watcher.seen[len(recovering)]["reason"] == "interrupted while pulling; nothing was changed"
        assert json.loads((tmp_path / "ota" / "state.json").read_text())["phase"] == "idle"
    finally:
        stop.set()
        thread.join(5)
        watcher.close()
    assert not thread.is_alive()


# The SDK leaves the socket of a client it could not make to the garbage collector (in reference cycles):
# collected, and its ResourceWarning ignored, within this test (see docker_support.engine_answers).
@pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning")
def test_an_engine_not_up_at_start_is_retried_and_stopping_stays_prompt(
        tmp_path: Path, broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    # The real Docker SDK: docker.from_env() asks the engine for its API version, so it raised out of
    # run_agent when no engine answered yet.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    private, public = generate_keypair()
    _interrupted(tmp_path, private)
    watcher = Watcher(broker.port)
    thread, stop = _start(_config(tmp_path, broker.port, public))
    try:
        watcher.wait(lambda seen: "recovering" in [s["phase"] for s in seen])
        assert watcher.seen[-1]["recovery_failures"] == 1
        assert "Error while fetching server API version" in watcher.seen[-1]["reason"]
        assert thread.is_alive()
    finally:
        started = time.monotonic()
        stop.set()  # during the first backoff (5 s)
        thread.join(5)
        joined_s = time.monotonic() - started
        watcher.close()
        gc.collect()
    assert not thread.is_alive() and joined_s < 2.0, joined_s
