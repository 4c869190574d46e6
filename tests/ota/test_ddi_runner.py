"""The DDI loop around the real agent (manifest checks, update lock, state files) against a recorded
DDI server. Only the Docker engine is a stand-in here (the swap itself is `make test-ota`'s): a pulled
image and an old container, and a swap whose outcome the test picks."""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest
import requests

from edge_runtime.config import Config
from edge_runtime.config.ota import HawkbitConfig
from edge_runtime.lineio.ota_lock import LineJobsLock
from edge_runtime.ota.agent import VERSION_LABEL, OtaAgent
from edge_runtime.ota.ddi.artifact import build_swu
from edge_runtime.ota.ddi.attributes import device_attributes
from edge_runtime.ota.ddi.client import DdiClient
from edge_runtime.ota.ddi.runner import MAX_TOLD_PER_ACTION, DdiSource, backoff_s, poll_wait_s, retry_wait_s
from edge_runtime.ota.manifest import Manifest, generate_keypair, sign
from edge_runtime.ota.update_lock import UpdateLock
from tests.ota import test_agent_swap as swap
from tests.ota.ddi_server import CONTROLLER, TENANT, Recorded, controller_base, ddi_server, deployment_base
from tests.ota.test_update_lock import signals

BASE_PATH = f"/{TENANT}/controller/v1/{CONTROLLER}"
IMAGE = "registry.plant.local/edge-runtime@sha256:" + "ab" * 32
ARTIFACT = f"{BASE_PATH}/softwaremodules/23/artifacts/manifest.signed.json"


class Engine:
    """The Docker engine as the agent sees it before a swap: one old container, pulls recorded."""

    def __init__(self) -> None:
        self.pulls: list[str] = []
        old = type("Container", (), {"id": "old-id", "name": "edge-runtime",
                                     "image": type("Image", (), {"labels": {VERSION_LABEL: "1.0.0"}})()})()
        self.containers = type("Containers", (), {"get": self._get})()
        self.api = type("Api", (), {"pull": lambda _s, repo, tag: self.pulls.append(f"{repo}@{tag}")})()
        self.images = type("Images", (), {"get": lambda _s, ref: None})()
        self._old = old

    def _get(self, name: str) -> Any:
        if name in ("edge-runtime", "old-id"):
            return self._old
        raise docker.errors.NotFound(name)


class Agent(OtaAgent):
    """The real agent up to the swap; the swap's outcome is the test's (`outcome`)."""

    outcome = "committed"
    swaps = 0

    def _start(self, manifest: Manifest, old: Any, idle: dict[str, Any] | None = None) -> str:
        self.swaps += 1
        self._status("starting", manifest)
        if self.outcome == "committed":
            self._status("healthy", manifest)
            self._save(phase="idle", version=manifest.version)
            self._status("committed", manifest)
        else:
            self._save(phase="idle", version="1.0.0")
            self._status("rolled_back", manifest, "candidate unhealthy")
        return self.outcome


@pytest.fixture
def keys() -> tuple[str, str]:
    return generate_keypair()


@pytest.fixture
def served() -> Iterator[tuple[Recorded, str]]:
    recorded = Recorded()
    with ddi_server(recorded) as url:
        yield recorded, url


def release(private: str, version: str = "2.0.0", tamper: bool = False) -> bytes:
    manifest = sign(Manifest(image=IMAGE, version=version, notes="new prompt"), private)
    data = json.loads(manifest.model_dump_json(exclude_none=True))
    if tamper:
        data["image"] = "evil.example/x@sha256:" + "cd" * 32
    return json.dumps(data).encode()


def offer(recorded: Recorded, url: str, artifact: bytes, action: str = "8", **base: Any) -> None:
    recorded.reopen(action)  # offered now, if closed before (goosebit reuses its ids)
    recorded.json(BASE_PATH, controller_base(url + BASE_PATH, deployment=action, **base))
    recorded.json(f"{BASE_PATH}/deploymentBase/{action}", deployment_base(url, action, artifact))
    recorded.raw(ARTIFACT, artifact)


def make(tmp_path: Path, url: str, public: str, lock: UpdateLock | None = None,
         stop: threading.Event | None = None) -> tuple[DdiSource, Agent, Engine]:
    engine = Engine()
    agent = Agent(engine, "edge-runtime", tmp_path / "state.json", [public], lambda s: None, lock=lock)
    cfg = HawkbitConfig.model_validate({"url": url, "tenant": TENANT, "request_timeout_s": 5})
    config = Config.model_validate({"device_id": CONTROLLER, "data_dir": str(tmp_path)})
    source = DdiSource(DdiClient(cfg, CONTROLLER), agent, tmp_path / "ddi.json",
                       lambda: device_attributes(config, agent.current_version()), stop or threading.Event())
    return source, agent, engine


def executions(recorded: Recorded) -> list[tuple[str, str, str]]:
    return [(f["status"]["execution"], f["status"]["result"]["finished"], "; ".join(f["status"]["details"]))
            for f in recorded.feedbacks()]


def test_a_signed_release_is_applied_and_closed_with_success(served: tuple[Recorded, str], keys: tuple[str, str],
                                                             tmp_path: Path) -> None:
    recorded, url = served
    offer(recorded, url, build_swu(release(keys[0]), "2.0.0"), config_data=True)  # as goosebit hands it out
    source, _agent, engine = make(tmp_path, url, keys[1])
    assert 1.0 <= source.step() <= 1.1  # the server's polling sleep, plus up to 10 % jitter
    assert engine.pulls == [IMAGE]
    steps = executions(recorded)
    assert all(s[:2] == ("proceeding", "none") for s in steps[:-1])
    assert [d.split(":")[0].split(" ")[0] for _e, _f, d in steps[:-1]] == [
        "downloading", "received", "verified", "pulling", "starting", "healthy"]
    assert steps[-1] == ("closed", "success", "committed 2.0.0")
    [config] = [json.loads(r[3])["data"] for r in recorded.sent("PUT", "/configData")]
    assert config["device_id"] == CONTROLLER and config["running_version"] == "1.0.0"
    assert set(config) >= {"agent_version", "model_bundle", "model_bundle_sha256"}


def test_a_tampered_release_is_closed_as_refused_and_nothing_is_pulled(served: tuple[Recorded, str],
                                                                       keys: tuple[str, str], tmp_path: Path) -> None:
    recorded, url = served
    offer(recorded, url, release(keys[0], tamper=True))
    source, agent, engine = make(tmp_path, url, keys[1])
    source.step()
    assert engine.pulls == [] and agent.swaps == 0
    assert executions(recorded)[-1][:2] == ("closed", "failure")
    assert executions(recorded)[-1][2].startswith("refused: the signature does not match any trusted fleet key")


def test_a_rollback_is_closed_as_failure_with_the_reason(served: tuple[Recorded, str], keys: tuple[str, str],
                                                         tmp_path: Path) -> None:
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    source, agent, _engine = make(tmp_path, url, keys[1])
    agent.outcome = "rolled_back"
    source.step()
    assert executions(recorded)[-1] == ("closed", "failure", "rolled back: candidate unhealthy")


def test_a_cancel_while_waiting_for_the_line_is_confirmed_and_nothing_is_swapped(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    line = LineJobsLock(tmp_path / "line.lock")
    line.changed("press", signals(busy=True))  # the daemon has a part in flight
    source, agent, engine = make(tmp_path, url, keys[1], lock=UpdateLock(tmp_path / "line.lock", [], 60))
    worker = threading.Thread(target=source.step)
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while not any("waiting for the line" in d for *_, d in executions(recorded)) and time.monotonic() < deadline:
            time.sleep(0.05)
        # The operator cancels: hawkBit's cancelAction (its own id) names the running action as stopId.
        recorded.json(BASE_PATH, controller_base(url + BASE_PATH, cancel="9"))
        recorded.json(f"{BASE_PATH}/cancelAction/9", {"id": "9", "cancelAction": {"stopId": "8"}})
        worker.join(15)
    finally:
        line.close()
    assert not worker.is_alive()
    assert engine.pulls == [IMAGE] and agent.swaps == 0 and agent.state()["phase"] == "idle"
    assert ("proceeding", "none", "waiting_line: waiting for the line: a line station has a job in flight") in \
        executions(recorded)
    [confirm] = [json.loads(r[3]) for r in recorded.sent("POST", "/cancelAction/9/feedback")]
    assert confirm["status"]["execution"] == "closed" and confirm["status"]["result"]["finished"] == "success"
    assert not recorded.sent("POST", "/deploymentBase/8/feedback")[-1][3].count(b'"closed"')


def test_a_closing_feedback_that_fails_is_sent_again_after_a_restart(served: tuple[Recorded, str],
                                                                     keys: tuple[str, str], tmp_path: Path) -> None:
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    recorded.raw(f"{BASE_PATH}/deploymentBase/8/feedback", b"busy", status=503)
    source, _agent, _engine = make(tmp_path, url, keys[1])
    source.step()
    assert json.loads((tmp_path / "ddi.json").read_text())["action"]["sent"] is False
    del recorded.routes[f"{BASE_PATH}/deploymentBase/8/feedback"]  # the server is back
    recorded.requests.clear()
    restarted, agent2, _ = make(tmp_path, url, keys[1])  # a new process: same state files
    restarted.step()  # resends the recorded result first; the action still offered is not run again
    closed = [e for e in executions(recorded) if e[0] == "closed"]
    assert closed == [("closed", "success", "committed 2.0.0")] and agent2.swaps == 0
    restarted.step()
    assert [e for e in executions(recorded) if e[0] == "closed"] == closed  # once


def test_an_update_interrupted_before_any_change_is_taken_again(served: tuple[Recorded, str], keys: tuple[str, str],
                                                                tmp_path: Path) -> None:
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    manifest = Manifest.model_validate_json(release(keys[0]))
    (tmp_path / "state.json").write_text(json.dumps({"phase": "pulling", "manifest": manifest.model_dump(),
                                                     "old_id": "old-id"}))
    (tmp_path / "ddi.json").write_text(json.dumps({"action": {"id": "8"}}))
    source, _agent, _engine = make(tmp_path, url, keys[1])
    source._recover()
    assert not [e for e in executions(recorded) if e[0] == "closed"]  # not closed as failed
    assert "action" not in json.loads((tmp_path / "ddi.json").read_text())  # forgotten; the server offers it again
    source.step()
    assert executions(recorded)[-1] == ("closed", "success", "committed 2.0.0")


def test_a_failing_server_is_retried_with_exponential_backoff(served: tuple[Recorded, str], keys: tuple[str, str],
                                                              tmp_path: Path) -> None:
    recorded, url = served
    recorded.raw(BASE_PATH, b"down for maintenance", status=503)
    source, _agent, _engine = make(tmp_path, url, keys[1])
    waits = [source.step() for _ in range(4)]
    assert [round(w / b) for w, b in zip(waits, (5, 10, 20, 40), strict=True)] == [1, 1, 1, 1]
    assert all(4 <= w / 2 ** i <= 6 for i, w in enumerate(waits))
    assert backoff_s(50, lambda: 0.5) == 300.0
    recorded.json(BASE_PATH, controller_base(url + BASE_PATH, sleep="00:05:00"))
    assert 300.0 <= source.step() <= 330.0 and source.failures == 0


def test_a_download_only_action_is_refused(served: tuple[Recorded, str], keys: tuple[str, str],
                                           tmp_path: Path) -> None:
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    recorded.json(f"{BASE_PATH}/deploymentBase/8", deployment_base(url, "8", release(keys[0]), update="skip"))
    source, _agent, engine = make(tmp_path, url, keys[1])
    source.step()
    assert engine.pulls == [] and executions(recorded)[-1][:2] == ("closed", "failure")
    assert "download-only" in executions(recorded)[-1][2]


def test_the_loop_outlives_a_broken_agent(served: tuple[Recorded, str], keys: tuple[str, str],
                                          tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    stop = threading.Event()
    waits: list[float] = []

    def sleep(s: float) -> bool:
        waits.append(s)
        if len(waits) >= 3:
            stop.set()
        return stop.is_set()

    source, agent, _engine = make(tmp_path, url, keys[1], stop=stop)
    source._sleep = sleep
    agent.handle = lambda payload: (_ for _ in ()).throw(RuntimeError("docker went away"))  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="edge_runtime.ota"):
        source.run()
    assert len(waits) == 3 and all(4 <= w <= 24 for w in waits)  # backed off, went on
    # The same error again is not another traceback: one line (with it) per distinct error, rate-limited.
    [logged] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "docker went away (1 in a row)" in logged.getMessage() and logged.exc_info


def test_stopping_the_agent_ends_a_wait_for_the_line_and_leaves_the_action_open(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    line = LineJobsLock(tmp_path / "line.lock")
    line.changed("press", signals(busy=True))
    stop = threading.Event()
    source, agent, _engine = make(tmp_path, url, keys[1], lock=UpdateLock(tmp_path / "line.lock", [], 3600),
                                  stop=stop)
    worker = threading.Thread(target=source.step)
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while agent.state().get("phase") != "waiting_line" and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()  # SIGTERM: the wait must not hold the agent for lock_max_wait_s
        worker.join(5)
    finally:
        line.close()
    assert not worker.is_alive() and agent.swaps == 0 and agent.state()["phase"] == "idle"
    assert not [e for e in executions(recorded) if e[0] == "closed"]  # the server offers it again later
    assert "action" not in json.loads((tmp_path / "ddi.json").read_text())  # forgotten; the server offers it again


def test_an_action_outside_hawkbits_maintenance_window_waits_and_is_applied_when_it_opens(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    # What hawkBit sends for an action with a maintenance schedule outside its window: the update part is
    # `skip` (DdiRootController.calculateUpdateType) and maintenanceWindow `unavailable`.
    closed_window = deployment_base(url, "8", release(keys[0]), update="skip")
    closed_window["deployment"]["maintenanceWindow"] = "unavailable"
    recorded.json(f"{BASE_PATH}/deploymentBase/8", closed_window)
    source, _agent, _engine = make(tmp_path, url, keys[1])
    source.step()
    source.step()
    source, agent, engine = make(tmp_path, url, keys[1])  # a restart while it waits: told once all the same
    source._recover()
    source.step()
    source.step()
    assert engine.pulls == [] and agent.swaps == 0
    assert executions(recorded) == [("proceeding", "none", "waiting for the server's maintenance window")]
    # Polled while it waits, the action's history grows by one RETRIEVED, not one a poll (hawkBit adds one
    # only after another entry; a feedback at every poll would make it two a poll).
    assert recorded.history["8"] == ["RETRIEVED", "proceeding: waiting for the server's maintenance window",
                                     "RETRIEVED"]
    recorded.json(f"{BASE_PATH}/deploymentBase/8", deployment_base(url, "8", release(keys[0])))  # it opens
    source.step()
    assert engine.pulls == [IMAGE] and executions(recorded)[-1] == ("closed", "success", "committed 2.0.0")



def test_failures_after_a_good_poll_back_off_too(served: tuple[Recorded, str], keys: tuple[str, str],
                                                  tmp_path: Path) -> None:
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    recorded.raw(f"{BASE_PATH}/deploymentBase/8", b"database unavailable", status=500)
    source, _agent, engine = make(tmp_path, url, keys[1])
    waits = [source.step() for _ in range(4)]  # the controller base answers; its deployment does not
    assert all(4 <= w / 2 ** i <= 6 for i, w in enumerate(waits)), waits
    recorded.json(f"{BASE_PATH}/deploymentBase/8", deployment_base(url, "8", release(keys[0])))
    assert 1.0 <= source.step() <= 1.1 and source.failures == 0 and engine.pulls == [IMAGE]


class Killed(BaseException):
    """The agent's process dies here (power loss): nothing after this point runs."""


def test_a_commit_killed_before_its_feedback_was_recorded_is_closed_as_success_after_the_restart(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    engine = swap.Engine()  # the containers outlive the agent's process

    def source_for(mirror: Any) -> tuple[DdiSource, swap.Agent]:
        agent = swap.Agent(engine, "edge-runtime", tmp_path / "state.json", [keys[1]], lambda s: None)
        agent.candidate_starts = True
        cfg = HawkbitConfig.model_validate({"url": url, "tenant": TENANT, "request_timeout_s": 5})
        return DdiSource(DdiClient(cfg, CONTROLLER), agent, tmp_path / "ddi.json", lambda: {}, threading.Event(),
                         publish=mirror), agent

    def die_at_commit(status: dict[str, Any]) -> None:
        if status["phase"] == "committed":  # the swap is recorded as done; its feedback is not yet
            raise Killed

    source, agent = source_for(die_at_commit)
    with pytest.raises(Killed):
        source.step()
    assert agent.clones == 1 and engine.get("edge-runtime").image.labels[VERSION_LABEL] == "2.0.0"
    restarted, agent2 = source_for(None)
    restarted._recover()
    restarted.step()
    restarted.step()
    assert [e for e in executions(recorded) if e[0] == "closed"] == [("closed", "success", "committed 2.0.0")]
    assert agent2.clones == 0 and agent2.state()["phase"] == "idle"


def test_a_fleet_that_starts_together_does_not_poll_in_step(served: tuple[Recorded, str], keys: tuple[str, str],
                                                              tmp_path: Path) -> None:
    recorded, url = served
    recorded.json(BASE_PATH, controller_base(url + BASE_PATH, sleep="00:05:00"))
    devices = [make(tmp_path / str(i), url, keys[1])[0] for i in range(2)]  # a plant powering up
    waits = [[d.step() for _ in range(3)] for d in devices]
    assert all(300.0 <= w <= 330.0 for ws in waits for w in ws)  # never sooner than the server asked
    assert waits[0] != waits[1]
    assert poll_wait_s(300.0, lambda: 0.0) == 300.0 and poll_wait_s(300.0, lambda: 1.0) == 330.0


def interrupted_swap(tmp_path: Path, keys: tuple[str, str], url: str) -> tuple[swap.Engine, swap.Agent, HawkbitConfig]:
    """An agent killed in action 8 while its 2.0.0 candidate waited for its health verdict (the old
    container stopped, the candidate running): the engine, the agent and the hawkBit config."""
    engine = swap.Engine()
    engine.get("old-id").running = False
    engine.all.append(swap.Container(engine, "cand-id", "edge-runtime-candidate", "2.0.0", running=True))
    manifest = Manifest.model_validate_json(release(keys[0]))
    (tmp_path / "state.json").write_text(json.dumps({"phase": "waiting_health", "manifest": manifest.model_dump(),
                                                     "old_id": "old-id", "candidate_id": "cand-id"}))
    (tmp_path / "ddi.json").write_text(json.dumps({"action": {"id": "8"}}))
    agent = swap.Agent(engine, "edge-runtime", tmp_path / "state.json", [keys[1]], lambda s: None)
    return engine, agent, HawkbitConfig.model_validate({"url": url, "tenant": TENANT, "request_timeout_s": 5})


def test_a_recovery_that_failed_at_start_is_retried_before_the_action_is_answered(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    recorded, url = served
    offer(recorded, url, release(keys[0]))  # the server still offers the action the agent was killed in
    engine, agent, cfg = interrupted_swap(tmp_path, keys, url)
    source = DdiSource(DdiClient(cfg, CONTROLLER), agent, tmp_path / "ddi.json", lambda: {}, threading.Event())
    engine.down = True  # the agent started before the engine answered
    source._recover()
    with contextlib.suppress(docker.errors.APIError):  # as `run()` does
        source.step()
    assert not [e for e in executions(recorded) if e[0] == "closed"]
    engine.down = False
    source.step()
    source.step()
    assert [e for e in executions(recorded) if e[0] == "closed"] == [("closed", "success", "committed 2.0.0")]
    assert agent.clones == 0 and [c.id for c in engine.all if c.running] == ["cand-id"]


def test_an_action_for_the_running_release_is_closed_as_success_and_an_older_one_as_refused(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    recorded, url = served
    offer(recorded, url, release(keys[0], version="1.0.0"))  # the engine's container runs 1.0.0
    source, agent, engine = make(tmp_path, url, keys[1])
    source.step()
    assert engine.pulls == [] and agent.swaps == 0
    assert executions(recorded)[-1] == ("closed", "success", "already running 1.0.0")
    offer(recorded, url, release(keys[0], version="0.9.0"), action="9")
    source.step()
    assert engine.pulls == [] and executions(recorded)[-1][:2] == ("closed", "failure")
    assert "not newer" in executions(recorded)[-1][2]


def test_a_recovery_that_keeps_failing_polls_reports_and_logs_each_error_once(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    recorded, url = served
    offer(recorded, url, release(keys[0]), config_data=True)  # the action the agent was killed in, still offered
    recorded.json(BASE_PATH, controller_base(url + BASE_PATH, sleep="00:00:30", deployment="8", config_data=True))
    engine, agent, cfg = interrupted_swap(tmp_path, keys, url)
    config = Config.model_validate({"device_id": CONTROLLER, "data_dir": str(tmp_path)})
    stop = threading.Event()
    now = [1000.0]
    waits: list[float] = []
    polls: list[float] = []  # the simulated time of each poll
    statuses: list[dict[str, Any]] = []
    down = ["Cannot connect to the Docker daemon at unix:///var/run/docker.sock"]

    answering = engine.get

    def get(key: str) -> swap.Container:
        if down:
            raise docker.errors.APIError(down[0])
        return answering(key)

    def sleep(s: float) -> bool:
        polls.extend([now[0]] * (len(recorded.sent("GET", BASE_PATH)) - len(polls)))
        waits.append(s)
        now[0] += s
        if now[0] > 1000.0 + 400:  # the engine answers
            down.clear()
        elif now[0] > 1000.0 + 200:  # a second, different error
            down[:] = ["Read timed out. (read timeout=60)"]
        if now[0] > 1000.0 + 500:
            stop.set()
        return stop.is_set()

    engine.get = get  # type: ignore[method-assign]
    source = DdiSource(DdiClient(cfg, CONTROLLER), agent, tmp_path / "ddi.json",
                       lambda: device_attributes(config, agent.current_version()), stop, publish=statuses.append,
                       sleep=sleep, clock=lambda: now[0])
    with caplog.at_level(logging.DEBUG, logger="edge_runtime.ota"):
        source.run()
    # The server saw the device at its polling interval throughout (never sooner than asked), and heard
    # once per distinct error what keeps the action open; the action was not answered before the recovery.
    during = [t for t in polls if t < 1000.0 + 400]
    assert len(during) >= 12 and all(29.99 <= b - a <= 33.01 for a, b in itertools.pairwise(during))
    recovering = [d for e, _f, d in executions(recorded) if "recovering" in d]
    assert recovering == ["recovering the interrupted update failed: Cannot connect to the Docker daemon at "
                          "unix:///var/run/docker.sock (retrying)",
                          "recovering the interrupted update failed: Read timed out. (read timeout=60) (retrying)"]
    assert [e for e in executions(recorded) if e[0] == "closed"] == [("closed", "success", "committed 2.0.0")]
    assert agent.clones == 0 and [c.id for c in engine.all if c.running] == ["cand-id"]
    # configData: not sent while the engine could not say the running version, sent once it could.
    sent = [json.loads(r[3])["data"]["running_version"] for r in recorded.sent("PUT", "/configData")]
    assert sent and set(sent) == {"2.0.0"}  # the recorded server keeps asking for it at every poll
    # Recovery retried with backoff (5 s, 10 s, 20 s … each wait also ends at the next poll).
    assert waits[:2] == pytest.approx([5.0, 10.0], rel=0.21) and max(waits) <= 33.0
    # The agent's status counts the attempts; the log has one line per distinct error, no traceback.
    counts = [s["recovery_failures"] for s in statuses if s["phase"] == "recovering"]
    assert counts == list(range(1, len(counts) + 1)) and len(counts) >= 12
    assert statuses[-1]["phase"] == "committed" and source.recovery_failures == 0
    failed = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage().split(" (")[0] for r in failed] == [
        "ota: recovering from an interrupted update",  # the agent's, once
        "ota: recovering the interrupted update failed: Cannot connect to the Docker daemon at "
        "unix:///var/run/docker.sock",
        "ota: configData not sent",  # it needs the running version from the engine
        "ota: recovering the interrupted update failed: Read timed out.",
        "ota: configData not sent"]
    assert not any(r.exc_info for r in failed)
    assert any(r.getMessage().startswith(f"ota: the interrupted update was recovered after {counts[-1]} failed")
               for r in caplog.records)


def test_an_error_whose_text_differs_only_by_an_address_or_a_number_is_one_distinct_error() -> None:
    from edge_runtime.ota.ddi.runner import DistinctErrors

    errors = DistinctErrors(logging.getLogger("test-ota-distinct"))
    first = ConnectionError("<urllib3.connection.HTTPConnection object at 0x7f3a2c1d9e50>: port 2375 refused")
    again = ConnectionError("<urllib3.connection.HTTPConnection object at 0x7f3a2c1e1b10>: port 2375 refused")
    other = TimeoutError("the engine did not answer")
    assert errors.log("recovery", first, "recovery failed: %s") is True
    assert errors.log("recovery", again, "recovery failed: %s") is False
    assert errors.log("recovery", other, "recovery failed: %s") is True


def engine_down(engine: Any) -> list[bool]:
    """The engine's `containers.get` refuses as a Docker engine that is not running does while the returned
    flag's [0] is True; set it False and the engine answers again."""
    down = [True]
    answering = engine.containers.get

    def get(name: str) -> Any:
        if down[0]:
            raise docker.errors.APIError("Cannot connect to the Docker daemon at unix:///var/run/docker.sock")
        return answering(name)

    engine.containers = type("Containers", (), {"get": lambda _s, name: get(name)})()
    return down


def test_an_action_taken_while_the_engine_does_not_answer_says_so_and_is_taken_again_when_it_answers(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # No swap under way and dockerd restarting: handle() raised out of its first engine call; the server's
    # last word from the device stayed `received` (the MQTT mirror too) while the loop backed off and retried.
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    statuses: list[dict[str, Any]] = []
    source, agent, engine = make(tmp_path, url, keys[1])
    source.mirror = statuses.append
    down = engine_down(engine)
    with caplog.at_level(logging.INFO, logger="edge_runtime.ota"):
        waits = [source.step() for _ in range(3)]
    assert all(5.0 <= w <= 5.5 for w in waits), waits  # the server's 1 s polling sleep, bounded below at 5 s
    assert engine.pulls == [] and agent.swaps == 0
    assert not [e for e in executions(recorded) if e[0] == "closed"]  # the action stays open
    said = [d for _e, _f, d in executions(recorded) if d.startswith("waiting_engine")]
    assert said == ["waiting_engine: the container engine is not answering: Cannot connect to the Docker daemon at "
                    "unix:///var/run/docker.sock"]  # once, not at every attempt
    assert [s["phase"] for s in statuses].count("waiting_engine") == 3 and statuses[-1]["phase"] == "waiting_engine"
    assert sum("Cannot connect" in r.getMessage() for r in caplog.records) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    down[0] = False
    assert 1.0 <= source.step() <= 1.1  # the server's polling sleep again
    assert engine.pulls == [IMAGE] and executions(recorded)[-1] == ("closed", "success", "committed 2.0.0")
    assert source.failures == 0


def test_an_action_whose_pull_the_engine_dropped_stays_open_and_is_taken_again(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    # dockerd went away after the engine check, while the image was pulled: the action was closed as
    # `failure` ("pull failed: Connection aborted") and the release never installed on this device.
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    source, agent, engine = make(tmp_path, url, keys[1])
    lost = [requests.exceptions.ConnectionError("('Connection aborted.', RemoteDisconnected('pull'))")]

    def pull(repo: str, tag: str) -> None:
        if lost:
            raise lost.pop()
        engine.pulls.append(f"{repo}@{tag}")

    engine.api = type("Api", (), {"pull": lambda _s, repo, tag: pull(repo, tag)})()
    source.step()
    assert not [e for e in executions(recorded) if e[0] == "closed"] and agent.swaps == 0
    assert executions(recorded)[-1] == ("proceeding", "none", "waiting_engine: the container engine is not "
                                        "answering: ('Connection aborted.', RemoteDisconnected('pull'))")
    source.step()
    assert engine.pulls == [IMAGE] and executions(recorded)[-1] == ("closed", "success", "committed 2.0.0")


def test_an_action_retried_reuses_its_downloaded_artifact_and_follows_the_servers_polling_interval(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    # Each retry downloaded the artifact again, and came after the agent's backoff (5 s, 10 s, 20 s …)
    # whatever the server's polling sleep: a server asking for 2 min between polls was asked every few seconds.
    recorded, url = served
    offer(recorded, url, release(keys[0]), sleep="00:02:00")
    source, _agent, engine = make(tmp_path, url, keys[1])
    down = engine_down(engine)
    waits = [source.step() for _ in range(3)]
    downloads = lambda: len(recorded.sent("GET", "/artifacts/manifest.signed.json"))  # noqa: E731
    assert downloads() == 1 and [d for *_, d in executions(recorded)].count("downloading manifest.signed.json") == 1
    assert all(120.0 <= w <= 132.0 for w in waits), waits  # the server's interval, plus up to 10 %
    recorded.json(BASE_PATH, controller_base(url + BASE_PATH, sleep="10:00:00", deployment="8"))
    assert 300.0 <= source.step() <= 330.0  # bounded above: an update that waits is taken again within minutes
    down[0] = False
    assert 36000.0 <= source.step() <= 39600.0  # taken; the server's own interval again
    assert executions(recorded)[-1] == ("closed", "success", "committed 2.0.0") and downloads() == 1
    # A failing server backs off, but is not asked again sooner than its interval either.
    offer(recorded, url, release(keys[0], version="2.1.0"), action="9", sleep="00:02:00")
    recorded.raw(f"{BASE_PATH}/deploymentBase/9", b"database unavailable", status=500)
    assert 120.0 <= source.step() <= 132.0
    recorded.json(f"{BASE_PATH}/deploymentBase/9", deployment_base(url, "9", release(keys[0], version="2.1.0")))
    source.step()  # another artifact (another hash): downloaded
    assert downloads() == 2 and executions(recorded)[-1] == ("closed", "success", "committed 2.1.0")
    assert retry_wait_s(1, 1.0, lambda: 0.5) == 5.25 and retry_wait_s(7, 60.0, lambda: 0.5) == 300.0
    assert retry_wait_s(1, 86400.0, lambda: 0.0) == 300.0 and retry_wait_s(1, 86400.0, lambda: 1.0) == 330.0


def test_stopping_during_the_recoverys_health_wait_is_prompt_and_the_action_is_reported_at_the_next_start(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    # The recovery's health wait (up to health_timeout_s) did not look at the loop's stop.
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    engine, agent, cfg = interrupted_swap(tmp_path, keys, url)
    verdict = ["starting"]

    class Loading(swap.Agent):
        def _health(self, container: Any) -> str:
            return verdict[0]

    agent = Loading(engine, "edge-runtime", tmp_path / "state.json", [keys[1]], lambda s: None, health_timeout_s=60)
    stop = threading.Event()
    source = DdiSource(DdiClient(cfg, CONTROLLER), agent, tmp_path / "ddi.json", lambda: {}, stop)
    worker = threading.Thread(target=source.run, daemon=True)
    worker.start()
    time.sleep(1.0)
    started = time.monotonic()
    stop.set()
    worker.join(5)
    assert not worker.is_alive() and time.monotonic() - started < 1.5
    assert agent.state()["phase"] == "waiting_health" and json.loads((tmp_path / "ddi.json").read_text())[
        "action"] == {"id": "8"}
    assert not [e for e in executions(recorded) if e[0] == "closed"]
    verdict[0] = "healthy"
    restarted = DdiSource(DdiClient(cfg, CONTROLLER), agent, tmp_path / "ddi.json", lambda: {}, threading.Event())
    restarted._recover()
    restarted.step()
    assert [e for e in executions(recorded) if e[0] == "closed"] == [("closed", "success", "committed 2.0.0")]


def test_an_engine_gone_mid_swap_is_one_warning_line_and_the_recovery_reports_the_action(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # dockerd went away as the candidate started, after the old container was stopped: handle() leaves the swap
    # recorded for the recovery (an expected, handled condition), and the loop logged it as "DDI step failed"
    # at ERROR with a traceback, as it does a bug.
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    engine = swap.Engine()

    class Candidate(swap.Container):
        starts = 0

        def start(self) -> None:
            Candidate.starts += 1
            if Candidate.starts == 1:
                engine.down = True
                raise requests.exceptions.ConnectionError("('Connection aborted.', RemoteDisconnected('start'))")
            self.running = True

    class Agent(swap.Agent):
        def _clone(self, old: Any, image: str) -> Any:
            candidate = Candidate(engine, "cand-id", f"{self.name}-candidate", "2.0.0", running=False)
            engine.all.append(candidate)
            return candidate

    agent = Agent(engine, "edge-runtime", tmp_path / "state.json", [keys[1]], lambda s: None, health_timeout_s=5)
    stop = threading.Event()
    waits: list[float] = []

    def sleep(s: float) -> bool:
        waits.append(s)
        engine.down = False  # the engine is back
        if len(waits) >= 2:
            stop.set()
        return stop.is_set()

    cfg = HawkbitConfig.model_validate({"url": url, "tenant": TENANT, "request_timeout_s": 5})
    source = DdiSource(DdiClient(cfg, CONTROLLER), agent, tmp_path / "ddi.json", lambda: {}, stop, sleep=sleep)
    with caplog.at_level(logging.DEBUG, logger="edge_runtime.ota"):
        source.run()
    assert [e for e in executions(recorded) if e[0] == "closed"] == [("closed", "success", "committed 2.0.0")]
    assert [c.name for c in engine.all if c.running] == ["edge-runtime"]
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    [gone] = [r for r in caplog.records if "during the update to" in r.getMessage()]
    assert gone.levelno == logging.WARNING and gone.exc_info is None
    assert gone.getMessage() == (
        "ota: the container engine is not answering: ('Connection aborted.', RemoteDisconnected('start')), during "
        "the update to 2.0.0 (phase starting); the recovery finishes or undoes it once the engine answers (retried "
        "with backoff, polling meanwhile), and the action is reported then")


def test_an_action_waiting_for_the_engine_tells_the_server_received_once_not_at_every_retry(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    # Each retry ran handle() again, whose `received` became a `proceeding` feedback every 5-30 s: hawkBit
    # keeps at most 1000 status entries per action (maxStatusEntriesPerAction), then refuses the action's
    # feedback, its closing one included, after hours of a Docker outage.
    recorded, url = served
    offer(recorded, url, release(keys[0]))  # the server's polling sleep: 1 s
    source, agent, engine = make(tmp_path, url, keys[1])
    down = engine_down(engine)
    for _ in range(6):
        source.step()
    details = [d for *_, d in executions(recorded)]
    assert details.count("received") == 1, details
    assert sum(d.startswith("waiting_engine") for d in details) == 1 and len(details) == 3, details
    down[0] = False
    source.step()
    assert executions(recorded)[-1] == ("closed", "success", "committed 2.0.0") and agent.swaps == 1
    # Another action is told its own `received`.
    offer(recorded, url, release(keys[0], version="2.1.0"), action="9")
    source.step()
    assert [d for *_, d in executions(recorded)].count("received") == 2


def test_an_action_whose_pull_the_engine_keeps_losing_tells_the_server_each_step_once_across_a_restart(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    # Each lost pull (dockerd gone while the image was pulled) ran handle() again up to the pull: `verified` and
    # `pulling` went to the server at every retry, and with them hawkBit's RETRIEVED for the deploymentBase
    # fetched in between (3 status entries a retry, every 5 s - 5 min: hawkBit's 1000 within a day or two of
    # an outage); a restart told `received`, `downloading` and `waiting_engine` again too.
    recorded, url = served
    offer(recorded, url, release(keys[0]))  # the server's polling sleep: 1 s
    lost = 12

    def losing(engine: Engine) -> None:
        def pull(repo: str, tag: str) -> None:
            nonlocal lost
            if lost:
                lost -= 1
                raise requests.exceptions.ConnectionError("('Connection aborted.', RemoteDisconnected('pull'))")
            engine.pulls.append(f"{repo}@{tag}")

        engine.api = type("Api", (), {"pull": lambda _s, repo, tag: pull(repo, tag)})()

    source, _agent, engine = make(tmp_path, url, keys[1])
    losing(engine)
    for _ in range(6):
        assert 5.0 <= source.step() <= 5.5  # waiting for the engine: taken again at the (bounded) interval
    restarted, agent, engine = make(tmp_path, url, keys[1])  # a new process, the same state files
    losing(engine)
    restarted._recover()
    for _ in range(6):
        restarted.step()
    assert lost == 0 and engine.pulls == [] and not [e for e in executions(recorded) if e[0] == "closed"]
    restarted.step()  # the engine keeps the pull this time
    assert engine.pulls == [IMAGE] and agent.swaps == 1
    told = collections.Counter(d.split(":")[0].split(" ")[0] for _e, _f, d in executions(recorded))
    assert told == {"downloading": 1, "received": 1, "verified": 1, "pulling": 1, "waiting_engine": 1, "starting": 1,
                    "healthy": 1, "committed": 1}, told  # each once, the restart's download included
    # What hawkBit keeps for the action: each step once, one RETRIEVED for the polls of the action that waited,
    # one DOWNLOAD per download (the restart's too), whatever the number of lost pulls.
    assert recorded.history["8"] == [
        "RETRIEVED", "proceeding: downloading manifest.signed.json", "DOWNLOAD", "proceeding: received",
        "proceeding: verified 2.0.0", "proceeding: pulling 2.0.0",
        "proceeding: waiting_engine: the container engine is not answering: ('Connection aborted.', "
        "RemoteDisconnected('pull'))", "RETRIEVED", "DOWNLOAD", "RETRIEVED", "proceeding: starting 2.0.0",
        "proceeding: healthy 2.0.0", "closed: committed 2.0.0"], recorded.history["8"]


def test_an_action_tells_the_server_a_bounded_number_of_distinct_steps_and_still_closes(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    # Texts that differ by more than a number (an engine error naming something new at every attempt) were each
    # a new `waiting_engine` feedback: once per distinct text is only bounded by a bound on the texts.
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    source, agent, engine = make(tmp_path, url, keys[1])
    answering = engine.containers.get
    names = ("".join(p) for p in itertools.product("abcdefghij", repeat=3))
    down = [True]

    def get(name: str) -> Any:
        if down[0]:
            raise docker.errors.APIError(f"Cannot connect to the Docker daemon: context {next(names)} is gone")
        return answering(name)

    engine.containers = type("Containers", (), {"get": lambda _s, name: get(name)})()
    for _ in range(MAX_TOLD_PER_ACTION + 10):
        source.step()
    told = [d for *_, d in executions(recorded)]
    assert len(told) == MAX_TOLD_PER_ACTION and told[:2] == ["downloading manifest.signed.json", "received"], told[:3]
    down[0] = False
    source.step()
    assert executions(recorded)[-1] == ("closed", "success", "committed 2.0.0") and agent.swaps == 1
    assert len(recorded.history["8"]) <= 2 * MAX_TOLD_PER_ACTION + 3  # with RETRIEVED and DOWNLOAD: within 1000


def test_an_action_id_the_server_uses_again_after_it_was_closed_is_told_every_step_again(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    # goosebit's action id is its software's id: a deployment of that software again, after another one, comes
    # with an id the device has told steps under already; those are forgotten once the action is closed.
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    source, _agent, _engine = make(tmp_path, url, keys[1])
    source.step()
    offer(recorded, url, release(keys[0], version="2.1.0"), action="9")
    source.step()
    offer(recorded, url, release(keys[0], version="2.2.0"), action="8")
    restarted, agent, _engine = make(tmp_path, url, keys[1])  # and a restart in between
    restarted.step()
    assert agent.swaps == 1 and executions(recorded)[-1] == ("closed", "success", "committed 2.2.0")
    steps = ["downloading manifest.signed.json", "received", "verified {v}", "pulling {v}", "starting {v}",
             "healthy {v}"]
    assert [d for d in recorded.history["8"] if d.startswith("proceeding: ")] == [
        f"proceeding: {step.format(v=v)}" for v in ("2.0.0", "2.2.0") for step in steps]


def test_a_closing_feedback_the_server_already_has_ends_its_retries(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    # A closing feedback the server kept but whose answer was lost (a timeout) is sent again; hawkBit answers
    # 410 Gone for an action that is no longer active (DdiRootController.postDeploymentBaseActionFeedback):
    # that ends the retries, and the loop polls on, instead of posting it every 5 s - 5 min without end.
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    recorded.raw(f"{BASE_PATH}/deploymentBase/8/feedback", b"", status=410)
    (tmp_path / "ddi.json").write_text(json.dumps({"action": {"id": "8", "sent": False, "final": {
        "finished": "success", "details": ["committed 2.0.0"]}}}))
    source, agent, _engine = make(tmp_path, url, keys[1])
    waits = [source.step() for _ in range(4)]
    assert all(1.0 <= w <= 1.1 for w in waits), waits  # the server's polling interval: nothing left to retry
    assert len(recorded.sent("POST", "/deploymentBase/8/feedback")) == 1 and agent.swaps == 0
    assert json.loads((tmp_path / "ddi.json").read_text())["action"]["sent"] is True


def test_a_closing_feedback_that_fails_at_start_is_retried_with_the_backoff_not_the_default_interval(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    # Before any poll answered, the server's interval was the 300 s default: a closing feedback refused at
    # start was tried again only after ~5 min (`retry_wait_s` with that default), not after the backoff.
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    recorded.raw(f"{BASE_PATH}/deploymentBase/8/feedback", b"busy", status=503)
    (tmp_path / "ddi.json").write_text(json.dumps({"action": {"id": "8", "sent": False, "final": {
        "finished": "success", "details": ["committed 2.0.0"]}}}))
    source, _agent, _engine = make(tmp_path, url, keys[1])
    waits = [source.step() for _ in range(3)]
    assert all(4.0 * 2 ** i <= w <= 6.0 * 2 ** i for i, w in enumerate(waits)), waits  # 5, 10, 20 s (±20 %)
    del recorded.routes[f"{BASE_PATH}/deploymentBase/8/feedback"]
    recorded.requests.clear()  # the refused ones
    assert 1.0 <= source.step() <= 1.1 and source.failures == 0  # sent, then polled: the server's 1 s
    assert [e for e in executions(recorded) if e[0] == "closed"] == [("closed", "success", "committed 2.0.0")]
    # Once the server's interval is known, a closing feedback it fails is not retried sooner than it.
    source.interval_s = 120.0
    source._save(action={"id": "9", "sent": False, "final": {"finished": "success", "details": ["x"]}})
    recorded.raw(f"{BASE_PATH}/deploymentBase/9/feedback", b"busy", status=503)
    assert 120.0 <= source.step() <= 132.0


def test_a_closing_feedback_refused_for_good_is_dropped_after_three_tries_and_the_device_polls_on(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # hawkBit refuses with 403 every feedback of an action whose history is full (`maxStatusEntriesPerAction`;
    # releases that quota-check the closing one too). It was retried at the backoff without end, before every
    # poll, so the device never polled again until the operator force-quit the action.
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    refusal = {"exceptionClass": "org.eclipse.hawkbit.repository.exception.AssignmentQuotaExceededException",
               "errorCode": "hawkbit.server.error.quota.tooManyEntries",
               "message": "Quota exceeded: Cannot assign 1 more ActionStatus entities to Action '8'. "
                          "The maximum is 1000."}
    recorded.json(f"{BASE_PATH}/deploymentBase/8/feedback", refusal, status=403)
    source, agent, _engine = make(tmp_path, url, keys[1])
    statuses: list[dict[str, Any]] = []
    source.mirror = statuses.append
    with caplog.at_level(logging.WARNING, logger="edge_runtime.ota.ddi.runner"):
        assert 1.0 <= source.step() <= 1.1  # the update, its feedback refused (the history is full), the first try
        assert 4.0 <= source.step() <= 6.0  # the second try, refused: the backoff, not the server's 1 s
        polls = len(recorded.sent("GET", BASE_PATH))
        assert 1.0 <= source.step() <= 1.1  # the third try, dropped; then polled, at the server's interval
        assert len(recorded.sent("GET", BASE_PATH)) == polls + 1
        waits = [source.step() for _ in range(3)]  # hawkBit still offers the action (it is open there)
    assert all(1.0 <= w <= 1.1 for w in waits), waits
    assert len(recorded.sent("POST", "/deploymentBase/8/feedback")) == 3 + 6  # 6 proceeding steps, 3 closing
    assert [e for e in executions(recorded) if e[0] == "closed"] == [("closed", "success", "committed 2.0.0")] * 3
    assert agent.swaps == 1  # offered again, not installed again
    assert len(recorded.sent("GET", BASE_PATH)) == polls + 4
    dropped = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert len(dropped) == 1 and dropped[0].levelno == logging.WARNING
    assert "action 8" in dropped[0].getMessage() and "HTTP 403" in dropped[0].getMessage()
    assert source.closings_dropped == 1
    assert statuses[-1]["phase"] == "feedback_dropped" and statuses[-1]["status"] == 403
    assert statuses[-1]["action"] == "8" and statuses[-1]["closings_dropped"] == 1
    # Not pending any more: a restart neither sends it nor installs the action the server still offers.
    recorded.requests.clear()
    restarted, agent2, _ = make(tmp_path, url, keys[1])
    assert 1.0 <= restarted.step() <= 1.1
    assert not recorded.sent("POST", "/feedback") and agent2.swaps == 0


def test_a_closing_feedback_refused_by_a_server_that_refuses_every_request_is_kept_until_a_poll_answers(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    # A proxy's IP allowlist (or a hawkBit account without the permission) answers 403 to every request, the polls
    # too: that is not the server refusing this feedback, and dropping it lost the result within ~16 s (the 3 tries
    # come before any poll).
    recorded, url = served
    recorded.raw(f"{BASE_PATH}/deploymentBase/8/feedback", b"Forbidden", status=403)
    recorded.raw(BASE_PATH, b"Forbidden", status=403)
    (tmp_path / "ddi.json").write_text(json.dumps({"action": {"id": "8", "sent": False, "final": {
        "finished": "success", "details": ["committed 2.0.0"]}}}))
    source, _agent, _engine = make(tmp_path, url, keys[1])
    waits = [source.step() for _ in range(6)]
    action = json.loads((tmp_path / "ddi.json").read_text())["action"]
    assert source.closings_dropped == 0 and "dropped" not in action and action["sent"] is False
    assert len(recorded.sent("POST", "/deploymentBase/8/feedback")) == 6
    assert len(recorded.sent("GET", BASE_PATH)) == 4  # from the third try on, a poll before it would drop it
    assert all(backoff_s(n, lambda: 0.0) <= w <= backoff_s(n, lambda: 1.0)
               for n, w in enumerate(waits, 1)), waits  # at the backoff: 5 s, 10 s, 20 s …
    # The server answers again, and refuses this feedback still: dropped, and that poll is the step's (not two).
    offer(recorded, url, release(keys[0]))
    recorded.requests.clear()
    assert 1.0 <= source.step() <= 1.1
    assert source.closings_dropped == 1 and json.loads((tmp_path / "ddi.json").read_text())["action"]["dropped"] == 403
    assert len(recorded.sent("POST", "/deploymentBase/8/feedback")) == 1
    assert len(recorded.sent("GET", BASE_PATH)) == 1


@pytest.mark.parametrize("status", [503, 429, 408, 401, 407, 409, 421, 423, 425])
def test_a_closing_feedback_failed_with_a_status_that_may_pass_is_retried_without_a_bound(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path, status: int) -> None:
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    recorded.raw(f"{BASE_PATH}/deploymentBase/8/feedback", b"not now", status=status)
    (tmp_path / "ddi.json").write_text(json.dumps({"action": {"id": "8", "sent": False, "final": {
        "finished": "success", "details": ["committed 2.0.0"]}}}))
    source, _agent, _engine = make(tmp_path, url, keys[1])
    for _ in range(5):
        source.step()
    assert len(recorded.sent("POST", "/deploymentBase/8/feedback")) == 5 and not recorded.sent("GET", BASE_PATH)
    assert source.closings_dropped == 0 and "dropped" not in json.loads((tmp_path / "ddi.json").read_text())["action"]


# ---- an action id the server offers again after it was closed (goosebit: its action id is the software's) --------


def closings(recorded: Recorded) -> list[tuple[str, str, str]]:
    return [e for e in executions(recorded) if e[0] == "closed"]


def test_a_failed_action_the_server_offers_again_under_its_id_is_tried_again_after_a_restart_too(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    # goosebit re-offers a failed release under the same id (its software's) when the operator forces it; ddi.json
    # still held that id as closed, so `_deploy` returned without acting at every poll, for ever: nothing applied,
    # nothing told, the server waiting for an answer that never came.
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    source, agent, engine = make(tmp_path, url, keys[1])
    agent.outcome = "rolled_back"
    source.step()
    assert closings(recorded) == [("closed", "failure", "rolled back: candidate unhealthy")]
    told = len(recorded.history["8"])
    # hawkBit (and goosebit unforced) no longer offers a closed action: the device polls on and tells nothing.
    assert all(1.0 <= source.step() <= 1.1 for _ in range(3))
    assert len(recorded.history["8"]) == told and agent.swaps == 1
    recorded.reopen("8")  # force_update: the same id, the same release
    agent.outcome = "committed"
    assert 5.0 <= source.step() <= 6.0  # answered; the next poll not sooner than the backoff's first 5 s
    assert agent.swaps == 2 and engine.pulls == [IMAGE, IMAGE]
    assert closings(recorded)[-1] == ("closed", "success", "committed 2.0.0")
    assert [d for d in recorded.history["8"][told:] if d.startswith("proceeding: ")] == [  # every step told again
        "proceeding: received", "proceeding: verified 2.0.0", "proceeding: pulling 2.0.0",
        "proceeding: starting 2.0.0", "proceeding: healthy 2.0.0"]  # (the artifact kept: not downloaded again)
    assert 1.0 <= source.step() <= 1.1 and len(closings(recorded)) == 2  # once: the server took it
    # Failed again, with a restart in between (ddi.json holds the closed action), then forced again.
    recorded.reopen("8")
    recorded.json(BASE_PATH, controller_base(url + BASE_PATH, deployment="8"))
    offer(recorded, url, release(keys[0], version="2.1.0"), action="8")
    agent.outcome = "rolled_back"
    source.step()
    assert closings(recorded)[-1] == ("closed", "failure", "rolled back: candidate unhealthy")
    restarted, agent2, engine2 = make(tmp_path, url, keys[1])
    assert json.loads((tmp_path / "ddi.json").read_text())["action"]["final"]["finished"] == "failure"
    restarted.step()
    assert agent2.swaps == 0 and len(closings(recorded)) == 3  # not offered: nothing done, nothing told
    recorded.reopen("8")
    restarted.step()
    assert agent2.swaps == 1 and engine2.pulls == [IMAGE]
    assert closings(recorded)[-1] == ("closed", "success", "committed 2.1.0") and len(closings(recorded)) == 4


def test_a_committed_action_offered_again_while_its_release_runs_is_closed_as_success_at_once_once_per_offer(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    # goosebit offers a release again under its id (forced, or after the device reported another running version);
    # ddi.json held the id as closed/success: ignored for ever. The release runs: answered at once, nothing pulled.
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    engine = swap.Engine()  # the containers outlive the agent's process
    pulls: list[str] = []
    engine.api = type("Api", (), {"pull": lambda _s, repo, tag: pulls.append(f"{repo}@{tag}")})()

    def started() -> tuple[DdiSource, swap.Agent]:
        agent = swap.Agent(engine, "edge-runtime", tmp_path / "state.json", [keys[1]], lambda s: None)
        agent.candidate_starts = True
        cfg = HawkbitConfig.model_validate({"url": url, "tenant": TENANT, "request_timeout_s": 5})
        return DdiSource(DdiClient(cfg, CONTROLLER), agent, tmp_path / "ddi.json", lambda: {},
                         threading.Event()), agent

    source, agent = started()
    source.step()
    assert closings(recorded) == [("closed", "success", "committed 2.0.0")] and agent.clones == 1
    assert engine.get("edge-runtime").image.labels[VERSION_LABEL] == "2.0.0"
    restarted, agent2 = started()  # a restart in between: ddi.json holds action 8 as closed/success
    told = len(recorded.feedbacks())
    restarted.step()
    assert len(recorded.feedbacks()) == told  # not offered: nothing told
    recorded.reopen("8")
    recorded.requests.clear()
    restarted.step()
    assert closings(recorded) == [("closed", "success", "already running 2.0.0")]
    assert [d for *_, d in executions(recorded)] == ["downloading manifest.signed.json", "received",
                                                      "already running 2.0.0"]
    assert pulls == [IMAGE] and agent2.clones == 0  # nothing pulled, nothing swapped
    for _ in range(3):
        restarted.step()
    assert len(closings(recorded)) == 1  # once per offer: the server took the answer and offers it no more
    recorded.reopen("8")  # offered again: answered again
    restarted.step()
    assert len(closings(recorded)) == 2 and pulls == [IMAGE] and agent2.clones == 0


def test_a_server_that_keeps_offering_a_closed_action_is_answered_at_the_backoff_not_at_every_poll(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    # A server that offers the same id whatever the device answers (each offer after a closing feedback it took
    # is a new one): each is answered once, the polls after them backing off, so it gets neither a feedback nor
    # a swap at every poll; once it stops offering it, the device polls at its interval again.
    recorded, url = served
    recorded.closes = False
    offer(recorded, url, release(keys[0], version="1.0.0"))  # the release that runs
    source, agent, engine = make(tmp_path, url, keys[1])
    waits = [source.step() for _ in range(5)]
    assert 1.0 <= waits[0] <= 1.1  # the first offer: the server's interval
    assert all(max(5.0, 4.0 * 2 ** i) <= w <= max(5.5, 6.0 * 2 ** i) for i, w in enumerate(waits[1:])), waits
    assert closings(recorded) == [("closed", "success", "already running 1.0.0")] * 5
    assert engine.pulls == [] and agent.swaps == 0
    recorded.json(BASE_PATH, controller_base(url + BASE_PATH))  # no longer offered
    assert 1.0 <= source.step() <= 1.1
    assert 1.0 <= source.step() <= 1.1 and len(closings(recorded)) == 5
    offer(recorded, url, release(keys[0], version="1.0.0"))  # offered again later: answered, the backoff afresh
    assert 5.0 <= source.step() <= 6.0  # a closed action offered again, the first time in a row
    assert len(closings(recorded)) == 6


def test_an_action_closed_after_its_downloads_failed_and_offered_again_gets_its_download_tries_afresh(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    recorded.raw(ARTIFACT, b"busy", status=503)
    source, agent, _engine = make(tmp_path, url, keys[1])
    for _ in range(3):
        source.step()
    assert closings(recorded)[-1][:2] == ("closed", "failure") and "download failed" in closings(recorded)[-1][2]
    recorded.reopen("8")
    source.step()  # failed once more: retried, not closed at once as the fourth try
    assert len(closings(recorded)) == 1
    recorded.raw(ARTIFACT, release(keys[0]))
    source.step()
    assert agent.swaps == 1 and closings(recorded)[-1] == ("closed", "success", "committed 2.0.0")


def test_a_closed_action_offered_again_outside_the_servers_maintenance_window_waits_then_is_applied(
        served: tuple[Recorded, str], keys: tuple[str, str], tmp_path: Path) -> None:
    recorded, url = served
    offer(recorded, url, release(keys[0]))
    source, agent, _engine = make(tmp_path, url, keys[1])
    agent.outcome = "rolled_back"
    source.step()
    recorded.reopen("8")
    closed_window = deployment_base(url, "8", release(keys[0]))
    closed_window["deployment"]["maintenanceWindow"] = "unavailable"
    recorded.json(f"{BASE_PATH}/deploymentBase/8", closed_window)
    source.step()
    source.step()
    assert [d for *_, d in executions(recorded)].count("waiting for the server's maintenance window") == 1
    assert agent.swaps == 1
    recorded.json(f"{BASE_PATH}/deploymentBase/8", deployment_base(url, "8", release(keys[0])))
    agent.outcome = "committed"
    source.step()
    assert agent.swaps == 2 and closings(recorded)[-1] == ("closed", "success", "committed 2.0.0")
