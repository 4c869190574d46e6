"""`edge-runtime ota agent` with MQTT as its source (`service.run_agent`), against a real Mosquitto broker.
No Docker engine needed: the engine is the stand-in of test_agent_swap.py (down when the test says), or
the real Docker SDK pointed at a socket where no engine answers (an engine not up yet at boot)."""

from __future__ import annotations

import gc
import http.server
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker.errors
import paho.mqtt.client as mqtt
import pytest
import requests
from paho.mqtt.enums import CallbackAPIVersion

from edge_runtime.config import Config
from edge_runtime.ota import recovery
from edge_runtime.ota.agent import OtaAgent
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


def _manifest(private: str, version: str = "1.0.0") -> str:
    return sign(Manifest(image=swap.IMAGE, version=version), private).model_dump_json(exclude_none=True)


def test_an_empty_retained_message_clears_the_manifest_and_is_no_refusal(
        tmp_path: Path, broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    # An operator clears the retained manifest by publishing an empty retained payload; the agent took b""
    # for a manifest and published `refused` ("the manifest is not valid JSON").
    private, public = generate_keypair()
    watcher = Watcher(broker.port)
    thread, stop = _start(_config(tmp_path, broker.port, public), swap.Engine())
    try:
        watcher.publish(_manifest(private))  # the fleet's desired state, retained
        watcher.wait(lambda seen: [s["phase"] for s in seen] == ["received", "current"])
        with caplog.at_level(logging.DEBUG, logger="edge_runtime.ota"):
            watcher.publish(b"")  # cleared
            watcher.publish(b"  \n", retain=False)  # blank: no manifest either
            watcher.publish(_manifest(private), retain=False)  # after them, in order: a manifest again
            watcher.wait(lambda seen: len(seen) >= 4)
            time.sleep(0.3)
        assert watcher.phases() == ["received", "current", "received", "current"]
        empty = [r.getMessage() for r in caplog.records if "no manifest" in r.getMessage()]
        assert empty == [f"ota: an empty message on {CMD} (a cleared retained manifest): no manifest, nothing to do",
                         f"ota: an empty message on {CMD} (a cleared retained manifest): no manifest, nothing to do"]
    finally:
        stop.set()
        thread.join(5)
        watcher.close()


class _Site(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


def test_an_empty_manifest_url_is_no_manifest(tmp_path: Path, broker: Broker,
                                              caplog: pytest.LogCaptureFixture) -> None:
    # A 200 with an empty body (the file emptied to withdraw the release) was refused as invalid JSON.
    _private, public = generate_keypair()
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{web.server_address[1]}/manifest.json"
    config = _config(tmp_path, broker.port, public)
    config = config.model_copy(update={"ota": config.ota.model_copy(update={"manifest_url": url})})
    watcher = Watcher(broker.port)
    with caplog.at_level(logging.DEBUG, logger="edge_runtime.ota"):
        thread, stop = _start(config, swap.Engine())
        try:
            deadline = time.monotonic() + 10  # the first poll comes at once
            while not any("no manifest" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
        finally:
            stop.set()
            thread.join(5)
            watcher.close()
            web.shutdown()
            web.server_close()
    assert watcher.phases() == []
    assert [r.getMessage() for r in caplog.records if "no manifest" in r.getMessage()] == [
        f"ota: {url} serves no manifest (an empty answer): nothing to do"]



def test_a_swap_an_engine_error_left_mid_way_is_recovered_before_the_next_manifest(
        tmp_path: Path, broker: Broker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # The engine went away mid-swap (dockerd restarted as the candidate started): the rollback's own engine
    # call raised out of handle(), leaving the state at `starting` and the old container stopped. The MQTT
    # loop recovered only at its start, so the device ran no daemon and every later manifest was refused
    # ("another update in progress") until the agent was restarted; the DDI loop recovers such a swap.
    # The loop also logged it as "handling a manifest failed" at ERROR with a traceback, as it does a bug: an
    # expected condition the recovery takes over is one WARNING line naming the engine and what comes next.
    monkeypatch.setattr(recovery, "backoff_s", lambda failures: 0.2)
    private, public = generate_keypair()
    engine = swap.Engine()
    lost = threading.Event()  # the engine goes away once, as the first candidate starts

    class Candidate(swap.Container):
        def start(self) -> None:
            if not lost.is_set():
                lost.set()
                engine.down = True
                raise docker.errors.APIError("Cannot connect to the Docker daemon at unix:///var/run/docker.sock")
            self.running = True

    def clone(agent: OtaAgent, old: Any, image: str) -> Any:
        candidate = Candidate(engine, f"cand-{len(engine.all)}", f"{agent.name}-candidate", "", running=False)
        engine.all.append(candidate)
        return candidate

    monkeypatch.setattr(OtaAgent, "_clone", clone)
    monkeypatch.setattr(OtaAgent, "_health", lambda _agent, c: "healthy" if c.running else "unhealthy")
    watcher = Watcher(broker.port)
    caplog.set_level(logging.DEBUG, logger="edge_runtime.ota")
    thread, stop = _start(_config(tmp_path, broker.port, public), engine)
    try:
        watcher.publish(_manifest(private, "2.0.0"))  # retained: reaches the agent once it subscribed
        watcher.wait(lambda seen: "recovering" in [s["phase"] for s in seen])
        assert watcher.seen[-1]["interrupted"] == "starting" and watcher.seen[-1]["version"] == "2.0.0"
        assert not engine.all[0].running  # the old container stopped, the candidate not started: no daemon
        watcher.publish(_manifest(private, "2.1.0"))  # waits until the swap is recovered
        watcher.wait(lambda seen: sum(s["phase"] == "recovering" for s in seen) >= 3)
        engine.down = False  # the engine is back
        watcher.wait(lambda seen: seen[-1]["phase"] == "committed" and seen[-1]["version"] == "2.1.0")
        phases = [p for p in watcher.phases() if p != "recovering"]
        assert phases == ["received", "verified", "pulling", "starting", "healthy", "committed",  # 2.0.0 finished
                          "received", "verified", "pulling", "starting", "healthy", "committed"], phases  # 2.1.0
        assert [c.name for c in engine.all if c.running] == ["edge-runtime"]
        assert json.loads((tmp_path / "ota" / "state.json").read_text())["version"] == "2.1.0"
    finally:
        stop.set()
        thread.join(5)
        watcher.close()
    assert not thread.is_alive()
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    [gone] = [r for r in caplog.records if "during the update to" in r.getMessage()]
    assert gone.levelno == logging.WARNING and gone.exc_info is None
    assert gone.getMessage() == (
        "ota: the container engine is not answering: Cannot connect to the Docker daemon at "
        "unix:///var/run/docker.sock, during the update to 2.0.0 (phase starting); the recovery finishes or "
        "undoes it once the engine answers (retried with backoff; manifests wait until then)")


def _recorded(tmp_path: Path, version: str) -> None:
    """The state file of an agent whose last update committed `version` (swap.IMAGE)."""
    (tmp_path / "ota").mkdir(exist_ok=True)
    (tmp_path / "ota" / "state.json").write_text(json.dumps({"phase": "idle", "version": version,
                                                             "image": swap.IMAGE}))


def test_a_manifest_taken_while_the_engine_does_not_answer_waits_and_is_applied_when_it_answers(
        tmp_path: Path, broker: Broker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # No swap under way and dockerd restarting: handle() raised out of its first engine call, the loop only
    # logged it, the retained status stayed `received` and the release was never applied unless sent again.
    asked: list[int] = []

    def backoff_s(failures: int) -> float:
        asked.append(failures)
        return 0.2

    monkeypatch.setattr(recovery, "backoff_s", backoff_s)
    private, public = generate_keypair()
    _recorded(tmp_path, "1.0.0")
    engine = swap.Engine()
    engine.down = True
    monkeypatch.setattr(OtaAgent, "_clone", lambda agent, old, image: _candidate(engine, agent))
    monkeypatch.setattr(OtaAgent, "_health", lambda _agent, c: "healthy" if c.running else "unhealthy")
    watcher = Watcher(broker.port)
    with caplog.at_level(logging.DEBUG, logger="edge_runtime.ota"):
        thread, stop = _start(_config(tmp_path, broker.port, public), engine)
        try:
            watcher.publish(_manifest(private, "2.0.0"))  # retained: reaches the agent once it subscribed
            watcher.wait(lambda seen: sum(s["phase"] == "waiting_engine" for s in seen) >= 3)
            waiting = [s for s in watcher.seen if s["phase"] == "waiting_engine"]
            assert watcher.phases()[:2] == ["received", "waiting_engine"]
            assert waiting[0]["reason"] == ("the container engine is not answering: Cannot connect to the Docker "
                                            "daemon at unix:///var/run/docker.sock")
            assert waiting[0]["version"] == "2.0.0" and waiting[0]["image"] == swap.IMAGE
            assert [s["engine_failures"] for s in waiting[1:]] == list(range(2, len(waiting) + 1))
            assert asked[:3] == [1, 2, 3]  # retried with backoff
            # Refused for its content at once, whatever the engine: forged, and older than the recorded release.
            forged = json.dumps({**json.loads(_manifest(private, "3.0.0")), "notes": "changed after signing"})
            watcher.publish(forged, retain=False)
            watcher.wait(lambda seen: seen[-1]["phase"] == "refused")
            assert "trusted fleet key" in watcher.seen[-1]["reason"]
            watcher.publish(_manifest(private, "0.9.0"), retain=False)
            watcher.wait(lambda seen: seen[-1]["phase"] == "refused" and "not newer" in seen[-1]["reason"])
            # The recorded release again (the fleet's desired state): the current state, not a refusal.
            watcher.publish(_manifest(private, "1.0.0"), retain=False)
            watcher.wait(lambda seen: seen[-1]["phase"] == "current")
            # A newer release replaces the waiting one; an older one that comes after it does not.
            watcher.publish(_manifest(private, "2.1.0"), retain=False)
            watcher.wait(lambda seen: seen[-1]["phase"] == "waiting_engine" and seen[-1]["version"] == "2.1.0")
            watcher.publish(_manifest(private, "2.0.0"), retain=False)
            watcher.wait(lambda seen: sum(s["phase"] == "waiting_engine" and s["version"] == "2.1.0"
                                          for s in seen) >= 3 and seen[-1]["version"] == "2.1.0")
            assert engine.all[0].running and len(engine.all) == 1  # nothing changed meanwhile
            engine.down = False
            watcher.wait(lambda seen: seen[-1]["phase"] == "committed")
        finally:
            stop.set()
            thread.join(5)
            watcher.close()
    assert not thread.is_alive()
    assert watcher.seen[-1]["version"] == "2.1.0"
    applied = [s["version"] for s in watcher.seen if s["phase"] in ("verified", "committed")]
    assert applied == ["2.1.0", "2.1.0"]  # without being sent again; 2.0.0 never
    assert [c.name for c in engine.all if c.running] == ["edge-runtime"]
    assert json.loads((tmp_path / "ota" / "state.json").read_text())["version"] == "2.1.0"
    # The log: a line per distinct error (and the agent's own status lines), not one per attempt.
    engine_lines = [r for r in caplog.records if r.levelno >= logging.INFO and "Cannot connect" in r.getMessage()]
    assert len(engine_lines) <= 3 < len([s for s in watcher.seen if s["phase"] == "waiting_engine"]), \
        [r.getMessage() for r in engine_lines]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no "handling a manifest failed"


def _candidate(engine: swap.Engine, agent: OtaAgent) -> swap.Container:
    candidate = swap.Container(engine, f"cand-{len(engine.all)}", f"{agent.name}-candidate", "", running=False)
    engine.all.append(candidate)
    return candidate


def test_a_manifest_url_read_while_the_engine_does_not_answer_is_applied_when_it_answers(
        tmp_path: Path, broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    # The URL's manifest was read once (it had not changed since): the failed handle() was never repeated.
    monkeypatch.setattr(recovery, "backoff_s", lambda failures: 0.2)
    private, public = generate_keypair()
    engine = swap.Engine()
    engine.down = True
    monkeypatch.setattr(OtaAgent, "_clone", lambda agent, old, image: _candidate(engine, agent))
    monkeypatch.setattr(OtaAgent, "_health", lambda _agent, c: "healthy" if c.running else "unhealthy")

    class Site(_Site):
        body = _manifest(private, "2.0.0").encode()

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Site)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    config = _config(tmp_path, broker.port, public)
    url = f"http://127.0.0.1:{web.server_address[1]}/manifest.json"
    config = config.model_copy(update={"ota": config.ota.model_copy(update={"manifest_url": url})})
    watcher = Watcher(broker.port)
    thread, stop = _start(config, engine)
    try:
        watcher.wait(lambda seen: sum(s["phase"] == "waiting_engine" for s in seen) >= 2)
        engine.down = False
        watcher.wait(lambda seen: seen[-1]["phase"] == "committed" and seen[-1]["version"] == "2.0.0")
    finally:
        stop.set()
        thread.join(5)
        watcher.close()
        web.shutdown()
        web.server_close()
    assert not thread.is_alive()


@pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning")
def test_a_manifest_taken_with_no_engine_at_the_socket_waits_and_stopping_stays_prompt(
        tmp_path: Path, broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    # The real Docker SDK at a socket where nothing answers: its client cannot even be made.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    private, public = generate_keypair()
    watcher = Watcher(broker.port)
    thread, stop = _start(_config(tmp_path, broker.port, public))
    try:
        watcher.publish(_manifest(private, "2.0.0"))
        watcher.wait(lambda seen: "waiting_engine" in [s["phase"] for s in seen])
        assert watcher.seen[-1]["reason"].startswith(
            "the container engine is not answering: Error while fetching server API version")
        assert thread.is_alive()
    finally:
        started = time.monotonic()
        stop.set()  # during the first backoff (5 s)
        thread.join(5)
        joined_s = time.monotonic() - started
        watcher.close()
        gc.collect()
    assert not thread.is_alive() and joined_s < 2.0, joined_s


def test_a_manifest_whose_pull_the_engine_dropped_is_applied_when_it_answers_again(
        tmp_path: Path, broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    # The engine answered the check and went away during the pull (dockerd restarting): `failed`, and the
    # retained manifest was never taken again (unless sent again, or the agent restarted).
    monkeypatch.setattr(recovery, "backoff_s", lambda failures: 0.2)
    private, public = generate_keypair()
    engine = swap.Engine()
    pulls: list[str] = []

    def pull(repo: str, tag: str) -> None:
        pulls.append(tag)
        if len(pulls) == 1:
            raise requests.exceptions.ConnectionError("('Connection aborted.', RemoteDisconnected('pull'))")

    engine.api = type("Api", (), {"pull": lambda _s, repo, tag: pull(repo, tag)})()
    monkeypatch.setattr(OtaAgent, "_clone", lambda agent, old, image: _candidate(engine, agent))
    monkeypatch.setattr(OtaAgent, "_health", lambda _agent, c: "healthy" if c.running else "unhealthy")
    watcher = Watcher(broker.port)
    thread, stop = _start(_config(tmp_path, broker.port, public), engine)
    try:
        watcher.publish(_manifest(private, "2.0.0"))
        watcher.wait(lambda seen: bool(seen) and seen[-1]["phase"] in ("committed", "failed"))
    finally:
        stop.set()
        thread.join(5)
        watcher.close()
    assert not thread.is_alive()
    assert watcher.phases() == ["received", "verified", "pulling", "waiting_engine",
                                "received", "verified", "pulling", "starting", "healthy", "committed"]
    assert len(pulls) == 2 and [c.name for c in engine.all if c.running] == ["edge-runtime"]


def test_stopping_during_the_recoverys_health_wait_is_prompt_and_the_next_start_finishes_the_swap(
        tmp_path: Path, broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    # Killed while the candidate waited for its verdict: at the next start the recovery waits for it again, up
    # to health_timeout_s (120 s), and a stop in that wait was held until it ended.
    private, public = generate_keypair()
    engine = swap.Engine()
    engine.get("old-id").running = False
    engine.all.append(swap.Container(engine, "cand-id", "edge-runtime-candidate", "2.0.0", running=True))
    manifest = sign(Manifest(image=swap.IMAGE, version="2.0.0"), private)
    (tmp_path / "ota").mkdir()
    (tmp_path / "ota" / "state.json").write_text(json.dumps({
        "phase": "waiting_health", "manifest": manifest.model_dump(), "old_id": "old-id", "candidate_id": "cand-id"}))
    verdict = ["starting"]  # the candidate's model still loads
    monkeypatch.setattr(OtaAgent, "_health", lambda _agent, c: verdict[0])
    config = _config(tmp_path, broker.port, public)
    assert config.ota.health_timeout_s == 120
    watcher = Watcher(broker.port)
    thread, stop = _start(config, engine)
    try:
        time.sleep(1.0)  # in the health wait
        started = time.monotonic()
        stop.set()
        thread.join(5)
        joined_s = time.monotonic() - started
        assert not thread.is_alive() and joined_s < 1.5, joined_s
        state = json.loads((tmp_path / "ota" / "state.json").read_text())
        assert state["phase"] == "waiting_health" and not engine.removed  # left for the next start
        assert "recovering" not in watcher.phases()
        verdict[0] = "healthy"
        thread, stop = _start(config, engine)  # the next start finishes the swap
        watcher.wait(lambda seen: bool(seen) and seen[-1]["phase"] == "committed")
    finally:
        stop.set()
        thread.join(5)
        watcher.close()
    assert [c.id for c in engine.all if c.running] == ["cand-id"]
