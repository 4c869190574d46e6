"""The agent's swap when the Docker engine refuses a step (no engine needed: a stand-in that keeps the
containers' names and running state, and fails where the test says)."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import docker.errors
import pytest
import requests

from edge_runtime.ota.agent import VERSION_LABEL, OtaAgent, engine_lost
from edge_runtime.ota.manifest import Manifest, generate_keypair, sign
from edge_runtime.ota.recovery import Recovery

IMAGE = "registry.plant.local/edge-runtime@sha256:" + "ab" * 32


def _answered(status: int, explanation: str, reason: str = "Not Found") -> docker.errors.APIError:
    """What docker-py raises when the engine answers with an error (its own, a registry's, an image's)."""
    response = requests.Response()
    response.status_code, response.reason, response.url = status, reason, "http+docker://localhost/v1.43"
    return docker.errors.APIError("", response=response, explanation=explanation)


class Container:
    def __init__(self, engine: Engine, cid: str, name: str, version: str, running: bool,
                 fail_start: bool = False) -> None:
        self.engine, self.id, self.name, self.running, self.fail_start = engine, cid, name, running, fail_start
        self.image = type("Image", (), {"labels": {VERSION_LABEL: version}})()

    @property
    def status(self) -> str:
        return "running" if self.running else "exited"

    def start(self) -> None:
        if self.fail_start:  # e.g. the device path or host port of the old configuration is not free
            raise _answered(500, "driver failed programming external connectivity: port is already allocated",
                            "Internal Server Error")
        self.running = True

    def stop(self, timeout: int = 10) -> None:
        self.running = False

    def rename(self, name: str) -> None:
        self.name = name

    def remove(self, force: bool = False) -> None:
        self.engine.removed.append(self.id)
        self.engine.all.remove(self)


class Engine:
    def __init__(self) -> None:
        self.removed: list[str] = []
        self.all = [Container(self, "old-id", "edge-runtime", "1.0.0", running=True)]
        self.containers = type("Containers", (), {"get": lambda _s, key: self.get(key)})()
        self.api = type("Api", (), {"pull": lambda _s, repo, tag: None})()
        self.images = type("Images", (), {"get": lambda _s, ref: None})()

    down = False  # the engine does not answer (still starting at boot)

    def get(self, key: str) -> Container:
        if self.down:
            raise docker.errors.APIError("Cannot connect to the Docker daemon at unix:///var/run/docker.sock")
        for c in self.all:
            if key in (c.id, c.name):
                return c
        raise docker.errors.NotFound(key)


class Agent(OtaAgent):
    candidate_starts = False
    clones = 0

    def _clone(self, old: Any, image: str) -> Any:  # creating works; starting it fails unless candidate_starts
        self.clones += 1
        candidate = Container(self.docker, "cand-id", f"{self.name}-candidate", "2.0.0", running=False,
                              fail_start=not self.candidate_starts)
        self.docker.all.append(candidate)
        return candidate

    def _health(self, container: Any) -> str:
        return "healthy" if container.running else "unhealthy"


def test_a_candidate_the_engine_refuses_to_start_is_rolled_back_and_the_old_container_runs_again(
        tmp_path: Path) -> None:
    private, public = generate_keypair()
    manifest = sign(Manifest(image=IMAGE, version="2.0.0"), private)
    engine = Engine()
    statuses: list[dict[str, Any]] = []
    agent = Agent(engine, "edge-runtime", tmp_path / "state.json", [public], statuses.append, health_timeout_s=1)
    assert agent.handle(manifest.model_dump_json(exclude_none=True)) == "rolled_back"
    old = engine.get("old-id")
    assert old.running and old.name == "edge-runtime" and engine.removed == ["cand-id"]
    assert agent.state()["phase"] == "idle"
    assert statuses[-1]["phase"] == "rolled_back" and "port is already allocated" in statuses[-1]["reason"]
    assert json.loads((tmp_path / "state.json").read_text())["phase"] == "idle"


def test_recovery_never_leaves_the_old_container_running_beside_the_committed_candidate(tmp_path: Path) -> None:
    # Killed after the candidate was created but before the old container was stopped (or the old one
    # came back at boot through its restart policy): both exist, the old one runs.
    private, public = generate_keypair()
    manifest = sign(Manifest(image=IMAGE, version="2.0.0"), private)
    engine = Engine()
    engine.all.append(Container(engine, "cand-id", "edge-runtime-candidate", "2.0.0", running=False))
    (tmp_path / "state.json").write_text(json.dumps({"phase": "starting", "manifest": manifest.model_dump(),
                                                     "old_id": "old-id"}))
    statuses: list[dict[str, Any]] = []
    agent = Agent(engine, "edge-runtime", tmp_path / "state.json", [public], statuses.append, health_timeout_s=1)
    assert agent.recover() == "committed"
    assert [(c.name, c.id) for c in engine.all if c.running] == [("edge-runtime", "cand-id")]
    assert engine.get("old-id").name == "edge-runtime-previous"


def test_a_retained_manifest_of_the_running_release_is_the_current_state_after_a_restart(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A "desired state" manifest published retained: the broker hands it to the agent at every start (and
    # reconnect). Once it is installed, each restart had refused it ("not newer") on the retained status.
    private, public = generate_keypair()
    payload = sign(Manifest(image=IMAGE, version="2.0.0"), private).model_dump_json(exclude_none=True)
    engine = Engine()
    first = Agent(engine, "edge-runtime", tmp_path / "state.json", [public], lambda s: None)
    first.candidate_starts = True
    assert first.handle(payload) == "committed"
    statuses: list[dict[str, Any]] = []
    restarted = Agent(engine, "edge-runtime", tmp_path / "state.json", [public], statuses.append)
    restarted.recover()
    with caplog.at_level(logging.INFO, logger="edge_runtime.ota"):
        assert restarted.handle(payload) == "current"
    assert [s["phase"] for s in statuses] == ["received", "current"]
    assert statuses[-1]["version"] == "2.0.0" and "reason" not in statuses[-1]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert restarted.clones == 0 and restarted.state() == {"phase": "idle", "version": "2.0.0", "image": IMAGE}
    # Still checked like any manifest: a forged one of the running version is refused.
    forged = json.dumps({**json.loads(payload), "notes": "changed after signing"})
    assert restarted.handle(forged) == "refused" and "trusted fleet key" in statuses[-1]["reason"]
    # A genuinely older release, and the running version with another image, are still refused.
    older = sign(Manifest(image=IMAGE, version="1.5.0"), private).model_dump_json(exclude_none=True)
    assert restarted.handle(older) == "refused" and "not newer" in statuses[-1]["reason"]
    rebuilt = sign(Manifest(image=IMAGE.replace("ab" * 32, "cd" * 32), version="2.0.0"), private)
    assert restarted.handle(rebuilt.model_dump_json(exclude_none=True)) == "refused"
    assert "not newer" in statuses[-1]["reason"] and restarted.clones == 0


def _lost(what: str) -> requests.exceptions.ConnectionError:
    """What docker-py raises when dockerd goes away (its socket closed or gone) in the middle of a call."""
    return requests.exceptions.ConnectionError(f"('Connection aborted.', RemoteDisconnected('{what}'))")


def test_an_engine_that_goes_away_during_the_pull_is_waited_for_and_a_registry_error_still_fails(
        tmp_path: Path) -> None:
    # The engine answered the check, then went away (dockerd restarting) while the image was pulled: the
    # update ended `failed` ("pull failed: Connection aborted") and the release was dropped.
    private, public = generate_keypair()
    payload = sign(Manifest(image=IMAGE, version="2.0.0"), private).model_dump_json(exclude_none=True)
    engine = Engine()
    failures = [_lost("Remote end closed connection without response")]

    def pull(repo: str, tag: str) -> None:
        if failures:
            raise failures.pop(0)

    engine.api = type("Api", (), {"pull": lambda _s, repo, tag: pull(repo, tag)})()
    statuses: list[dict[str, Any]] = []
    agent = Agent(engine, "edge-runtime", tmp_path / "state.json", [public], statuses.append, health_timeout_s=1)
    agent.candidate_starts = True
    (tmp_path / "state.json").write_text(json.dumps({"phase": "idle", "version": "1.0.0", "image": "x@sha256:1"}))
    assert agent.handle(payload) == "waiting_engine"
    assert [s["phase"] for s in statuses] == ["received", "verified", "pulling", "waiting_engine"]
    assert statuses[-1]["reason"].startswith("the container engine is not answering: ('Connection aborted.'")
    assert agent.state() == {"phase": "idle", "version": "1.0.0", "image": "x@sha256:1"}  # as it was
    assert agent.clones == 0 and engine.get("old-id").running
    assert agent.handle(payload) == "committed"  # the source takes it again once the engine answers
    # The engine answered, with the registry's error: a real failure, as before.
    failures.append(_answered(404, "manifest for registry.plant.local/edge-runtime not found: manifest unknown"))
    newer = sign(Manifest(image=IMAGE, version="2.1.0"), private).model_dump_json(exclude_none=True)
    assert agent.handle(newer) == "failed"
    assert statuses[-1]["reason"].startswith("pull failed: 404 Client Error") and "manifest unknown" in \
        statuses[-1]["reason"]
    assert agent.state()["phase"] == "idle" and agent.state()["version"] == "2.0.0"


def test_an_engine_that_goes_away_before_the_old_container_stops_is_waited_for_and_after_it_recovered(
        tmp_path: Path) -> None:
    private, public = generate_keypair()
    payload = sign(Manifest(image=IMAGE, version="2.0.0"), private).model_dump_json(exclude_none=True)
    engine = Engine()
    statuses: list[dict[str, Any]] = []

    class Flaky(Agent):
        lose_at: str | None = "create"  # where the engine goes away once

        def _clone(self, old: Any, image: str) -> Any:
            candidate = Container(engine, f"cand-{len(engine.all)}", f"{self.name}-candidate", "", running=False)
            engine.all.append(candidate)  # created, then the engine went away before it answered
            if self.lose_at == "create":
                self.lose_at = None
                raise _lost("create")
            if self.lose_at == "start":  # the candidate's first start is cut off; the engine is back at once
                self.lose_at = None
                starts = iter([_lost("start")])

                def start() -> None:
                    error = next(starts, None)
                    if error is not None:
                        raise error
                    candidate.running = True

                candidate.start = start  # type: ignore[method-assign]
            return candidate

    agent = Flaky(engine, "edge-runtime", tmp_path / "state.json", [public], statuses.append, health_timeout_s=1)
    agent.candidate_starts = True
    # Before the old container stopped nothing changed: waiting_engine, the old one runs; taken again, the
    # candidate left behind is removed and the update commits.
    assert agent.handle(payload) == "waiting_engine"
    assert engine.get("old-id").running and agent.state() == {"phase": "idle"}
    assert statuses[-1]["reason"] == "the container engine is not answering: ('Connection aborted.', " \
                                     "RemoteDisconnected('create'))"
    assert agent.handle(payload) == "committed" and engine.removed == ["cand-1"]
    # After the old container stopped: the swap is left recorded for the recovery, which finishes it once the
    # engine answers (it was rolled back at once when the engine came back before the rollback's calls).
    agent.lose_at = "start"
    newer = sign(Manifest(image=IMAGE, version="2.1.0"), private).model_dump_json(exclude_none=True)
    with pytest.raises(requests.exceptions.ConnectionError):
        agent.handle(newer)
    assert agent.state()["phase"] == "starting"
    assert agent.recover() == "committed" and statuses[-1]["version"] == "2.1.0"
    assert [c.name for c in engine.all if c.running] == ["edge-runtime"]


def _waiting_health(tmp_path: Path, engine: Engine, private: str, old_running: bool = False) -> None:
    """The agent was killed while its 2.0.0 candidate waited for its health verdict."""
    manifest = sign(Manifest(image=IMAGE, version="2.0.0"), private)
    engine.get("old-id").running = old_running
    engine.all.append(Container(engine, "cand-id", "edge-runtime-candidate", "2.0.0", running=True))
    (tmp_path / "state.json").write_text(json.dumps({"phase": "waiting_health", "manifest": manifest.model_dump(),
                                                     "old_id": "old-id", "candidate_id": "cand-id"}))


def _stopped_within(agent: OtaAgent, recovery: Recovery, after_s: float = 0.3) -> tuple[bool | None, float]:
    """Run the recovery beside, stop the agent after `after_s`: (the attempt's result, seconds to end)."""
    result: list[bool] = []
    worker = threading.Thread(target=lambda: result.append(recovery.attempt()), daemon=True)
    worker.start()
    time.sleep(after_s)
    started = time.monotonic()
    agent.stopping.set()
    worker.join(10)
    return (result[0] if result else None), time.monotonic() - started


def test_stopping_ends_the_recoverys_health_wait_and_leaves_the_swap_to_the_next_start(tmp_path: Path) -> None:
    # The recovery waited for the candidate's verdict up to health_timeout_s (120 s by default) whatever
    # the stop: `systemctl stop` (or the service's stop event) was held that long.
    private, public = generate_keypair()
    engine = Engine()
    _waiting_health(tmp_path, engine, private)

    class Slow(Agent):
        def _health(self, container: Any) -> str:
            return "starting"  # no verdict yet (the model still loads)

    statuses: list[dict[str, Any]] = []
    agent = Slow(engine, "edge-runtime", tmp_path / "state.json", [public], statuses.append, health_timeout_s=60)
    recovered, took_s = _stopped_within(agent, Recovery(agent, statuses.append))
    assert recovered is False and took_s < 1.5, took_s
    assert agent.state()["phase"] == "waiting_health" and agent.state()["candidate_id"] == "cand-id"
    assert not engine.removed and not engine.get("old-id").running  # no rollback: left as it was
    assert "recovering" not in [s["phase"] for s in statuses]  # a stop is no failed attempt
    restarted = Agent(engine, "edge-runtime", tmp_path / "state.json", [public], statuses.append)  # next start
    assert restarted.recover() == "committed"
    assert [c.id for c in engine.all if c.running] == ["cand-id"]


def test_stopping_ends_a_recoverys_engine_call_that_hangs(tmp_path: Path) -> None:
    # Killed before the old container was stopped: the recovery stops it (docker waits up to 20 s for its
    # daemon to exit; a hung engine up to the client's timeout), and the stop waited for that call.
    private, public = generate_keypair()
    engine = Engine()
    _waiting_health(tmp_path, engine, private, old_running=True)
    release = threading.Event()
    old = engine.get("old-id")

    def hang(timeout: int = 10) -> None:
        release.wait(30)

    old.stop = hang  # type: ignore[method-assign]
    agent = Agent(engine, "edge-runtime", tmp_path / "state.json", [public], lambda s: None, health_timeout_s=60)
    try:
        recovered, took_s = _stopped_within(agent, Recovery(agent, None))
    finally:
        release.set()
    assert recovered is False and took_s < 1.0, took_s
    assert agent.state()["phase"] == "waiting_health"


def test_only_an_engine_that_did_not_answer_is_waited_for_a_local_error_is_rolled_back(tmp_path: Path) -> None:
    # engine_lost() took any OSError and any DockerException without a response for "the engine did not
    # answer": ENOSPC writing ota/state.json during the swap was left to the recovery as engine loss, and
    # docker-py's own argument errors (InvalidArgument in _clone) looped as waiting_engine for ever.
    import errno
    import os

    import urllib3

    private, public = generate_keypair()
    refused = urllib3.exceptions.NewConnectionError(None, "Failed to establish a new connection: [Errno 111] "  # type: ignore[arg-type]
                                                    "Connection refused")
    assert engine_lost(requests.exceptions.ConnectionError(refused))
    assert engine_lost(requests.exceptions.ConnectionError(urllib3.exceptions.ProtocolError(
        "Connection aborted.", ConnectionResetError(104, "Connection reset by peer"))))
    assert engine_lost(urllib3.exceptions.ProtocolError("Connection aborted."))
    assert engine_lost(requests.exceptions.ReadTimeout("UnixHTTPConnectionPool: Read timed out."))
    assert engine_lost(requests.exceptions.ChunkedEncodingError("Connection broken: IncompleteRead"))
    assert engine_lost(ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"))
    assert engine_lost(docker.errors.APIError("Cannot connect to the Docker daemon"))  # no response
    try:  # docker.from_env() when the engine is down: the client not made
        raise docker.errors.DockerException("Error while fetching server API version") from _lost("version")
    except docker.errors.DockerException as made:
        assert engine_lost(made)
    enospc = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "ota/state.tmp")
    for answered_or_local in (enospc, FileNotFoundError(errno.ENOENT, "No such file"), PermissionError(13, "no"),
                              docker.errors.InvalidArgument("invalid port bindings"),
                              docker.errors.InvalidVersion("runtime is not supported by API version 1.24"),
                              _answered(500, "port is already allocated"), ValueError("x")):
        assert not engine_lost(answered_or_local), answered_or_local

    engine = Engine()
    statuses: list[dict[str, Any]] = []

    class Local(Agent):
        fail: str | None = None

        def _clone(self, old: Any, image: str) -> Any:
            if self.fail == "invalid":
                raise docker.errors.InvalidArgument("'bogus' is not a valid port binding")
            if self.fail == "refused":
                self.fail = None
                raise requests.exceptions.ConnectionError(refused)
            return super()._clone(old, image)

        def _save(self, **state: Any) -> None:
            if self.fail == "enospc" and state.get("phase") == "waiting_health":
                self.fail = None
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.state_path.with_suffix(".tmp")))
            super()._save(**state)

    agent = Local(engine, "edge-runtime", tmp_path / "state.json", [public], statuses.append, health_timeout_s=1)
    agent.candidate_starts = True
    payload = sign(Manifest(image=IMAGE, version="2.0.0"), private).model_dump_json(exclude_none=True)
    agent.fail = "invalid"
    assert agent.handle(payload) == "rolled_back"
    assert "not a valid port binding" in statuses[-1]["reason"] and engine.get("old-id").running
    agent.fail = "enospc"
    assert agent.handle(payload) == "rolled_back"
    assert statuses[-1]["reason"] == "starting the candidate failed: [Errno 28] No space left on device: " \
                                     f"'{tmp_path / 'state.tmp'}'"
    assert [c.id for c in engine.all if c.running] == ["old-id"] and agent.state()["phase"] == "idle"
    agent.fail = "refused"  # the engine did not answer: waited for, then taken again
    assert agent.handle(payload) == "waiting_engine" and engine.get("old-id").running
    assert agent.handle(payload) == "committed"
