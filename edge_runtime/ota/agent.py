"""The update agent: applies a verified manifest to the daemon's container, health-gated, with rollback.

Runs beside the daemon (natively or in its own container) and talks to the Docker engine through its
API (the `docker` SDK). Every step is written to a state file before it is taken, so an agent killed
at any point converges on restart (`recover()`) to exactly one healthy container under the managed
name: the candidate if it turned healthy, otherwise the previous one.

Phases published: received, current (the manifest's release runs already), verified, pulling,
waiting_line, starting, healthy, committed, rolled_back, refused, failed, canceled, and waiting_engine (the
engine did not answer before anything changed — at the check, during the pull, or before the old container
was stopped: nothing changed; the source takes the manifest again).
With an update lock (`update_lock.py`) the pulled image waits for the line and the quiet window before the
old container is stopped; a source may cancel an update until then.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from edge_runtime import __version__
from edge_runtime.ota.manifest import Manifest, ManifestRefused, parse, verify
from edge_runtime.ota.update_lock import LockVerdict, UpdateLock

log = logging.getLogger(__name__)
VERSION_LABEL = "org.opencontainers.image.version"
WAITING_ENGINE = "waiting_engine"  # handle()'s phase when the engine did not answer before anything changed
_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")
_T = TypeVar("_T")


class AgentStopping(Exception):
    """The agent was asked to stop (`OtaAgent.stopping`) during a swap's wait or engine call: left there,
    `ota/state.json` recording the step, so the next start's `recover()` finishes or undoes the swap, as
    after a kill."""


def engine_lost(exc: BaseException) -> bool:
    """Whether `exc` says the engine did not answer: the connection refused or cut, a timeout (requests'
    ConnectionError, Timeout, ChunkedEncodingError, and the urllib3 or socket errors they wrap, should one
    come through unwrapped), an APIError without an HTTP response, or the client not made for one of those
    (docker.from_env()'s DockerException, caused by it). Not an answer with an error: a registry's or an
    image's error (manifest unknown, unauthorized, registry unreachable) comes back from the engine as an
    APIError with its HTTP response, and is a real failure; nor a local one: an OSError that is no connection
    error (ENOSPC writing ota/state.json), docker-py's own argument errors (InvalidArgument, InvalidVersion)."""
    import docker.errors
    import requests
    import urllib3

    if isinstance(exc, requests.exceptions.HTTPError):  # docker's APIError is one
        return exc.response is None
    if isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout
                  | requests.exceptions.ChunkedEncodingError | urllib3.exceptions.ProtocolError
                  | urllib3.exceptions.TimeoutError | urllib3.exceptions.NewConnectionError
                  | ConnectionError | TimeoutError):
        return True
    if isinstance(exc, docker.errors.DockerException) and exc.__cause__ is not None:
        return engine_lost(exc.__cause__)
    return False


class OtaAgent:
    def __init__(self, client: Any, container: str, state_path: Path, public_keys: list[str],
                 publish: Callable[[dict[str, Any]], None], health_timeout_s: float = 120.0,
                 allow_downgrade: bool = False, lock: UpdateLock | None = None) -> None:
        self.docker = client
        self.name = container
        self.state_path = state_path
        self.keys = public_keys
        self.publish_cb = publish
        self.health_timeout_s = health_timeout_s
        self.allow_downgrade = allow_downgrade
        self.lock = lock
        # Asked until the old container is stopped: a reason to cancel (the source withdrew the update) or None.
        self.cancelled: Callable[[], str | None] = lambda: None
        # Set by the source when the agent must stop: the health wait and the swap's engine calls end at once
        # (`AgentStopping`), the state file left for the next start.
        self.stopping = threading.Event()
        self._crash_after = os.environ.get("EDGE_OTA_CRASH_AFTER")  # test hook: die right after this phase
        self._recovery_logged: str | None = None  # a recovery retried (the engine down) is announced once
        self._engine_said: str | None = None  # the last `waiting_engine` reason logged (a repeat goes to debug)
        state_path.parent.mkdir(parents=True, exist_ok=True)

    # ---- state -------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.state_path.read_text()))
        except (OSError, json.JSONDecodeError):
            return {"phase": "idle"}

    def _save(self, **state: Any) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        with tmp.open("w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.state_path)
        if self._crash_after == state.get("phase"):
            os._exit(137)  # simulated power loss right after this step was recorded

    def status_message(self, phase: str, manifest: Manifest | None = None, reason: str = "") -> dict[str, Any]:
        msg: dict[str, Any] = {"phase": phase, "ts": time.time(), "agent": __version__}
        if manifest is not None:
            msg.update(version=manifest.version, image=manifest.image)
            if manifest.evaluation is not None:  # what was measured for this release (edge-runtime eval)
                msg["evaluation"] = manifest.evaluation
        if reason:
            msg["reason"] = reason
        return msg

    def _status(self, phase: str, manifest: Manifest | None = None, reason: str = "",
                level: int = logging.INFO) -> None:
        log.log(level, "ota: %s%s", phase, f" ({reason})" if reason else "")
        self.publish_cb(self.status_message(phase, manifest, reason))

    # ---- containers ----------------------------------------------------------------------------

    def _get(self, name: str) -> Any:
        import docker.errors

        try:
            return self.docker.containers.get(name)
        except docker.errors.NotFound:
            return None

    def current_version(self) -> str | None:
        return self._version_of(self._get(self.name))

    def check_engine(self) -> None:
        """Raise unless the engine answers (asked for the managed container, as `handle` asks first)."""
        self._get(self.name)

    def _version_of(self, container: Any) -> str | None:
        """The release `container` runs; with none (none found, or the engine not answering) the state
        file's, the release of the last update."""
        if container is None:
            return self.state().get("version")
        labels = container.image.labels or {}
        return labels.get(VERSION_LABEL) or self.state().get("version")

    def _runs_image_of(self, manifest: Manifest, container: Any) -> bool:
        """Whether the running container's image is the manifest's (by digest), as far as the engine and
        the state file know; unknown counts as yes, the version being the same."""
        digests: set[str] = set()
        if container is not None:
            attrs = getattr(container.image, "attrs", None) or {}
            digests.update(ref.split("@", 1)[1] for ref in attrs.get("RepoDigests") or [] if "@" in ref)
        state = self.state()
        if state.get("image") and state.get("version") == manifest.version:  # recorded by the last commit
            digests.add(str(state["image"]).split("@", 1)[-1])
        return not digests or manifest.image.split("@", 1)[-1] in digests

    def _call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """An engine call of a swap, which a stop does not wait for: made beside (a stop of the old container
        waits up to 20 s for it, a hung engine up to the client's timeout) and left, on `stopping`, within
        0.1 s. Left, it ends on its own (a process that exits ends it); the engine's side of it is what a
        kill at that point leaves, which the next `recover()` handles."""
        if self.stopping.is_set():
            raise AgentStopping("the agent is stopping")
        done = threading.Event()
        outcome: list[Any] = []

        def call() -> None:
            try:
                outcome.append((True, fn(*args, **kwargs)))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller as it is
                outcome.append((False, exc))
            finally:
                done.set()

        threading.Thread(target=call, name="ota-engine-call", daemon=True).start()
        while not done.wait(0.1):
            if self.stopping.is_set():
                raise AgentStopping("the agent is stopping")
        ok, value = outcome[0]
        if not ok:
            raise value
        return value

    def _health(self, container: Any) -> str:
        self._call(container.reload)
        health = container.attrs["State"].get("Health")
        if health is None:  # no HEALTHCHECK in the image: running is all we can see
            return "healthy" if container.status == "running" else "unhealthy"
        if container.status != "running":
            return "unhealthy"
        return str(health["Status"])

    def _wait_healthy(self, container: Any) -> str:
        deadline = time.monotonic() + self.health_timeout_s
        status = "starting"
        while time.monotonic() < deadline:
            status = self._health(container)
            if status in ("healthy", "unhealthy"):
                return status
            if self.stopping.wait(0.5):
                raise AgentStopping("the agent is stopping")
        return f"no health verdict within {self.health_timeout_s:.0f} s (last: {status})"

    def _clone(self, old: Any, image: str) -> Any:
        """A candidate container with the old one's configuration, volumes, devices and network."""
        api = self.docker.api
        info = api.inspect_container(old.id)
        host = info["HostConfig"]
        image_env = set((old.image.attrs.get("Config") or {}).get("Env") or [])
        env = [e for e in (info["Config"].get("Env") or []) if e not in image_env]  # only what was set at run
        host_config = api.create_host_config(
            binds=host.get("Binds"), devices=[f"{d['PathOnHost']}:{d['PathInContainer']}:{d['CgroupPermissions']}"
                                              for d in host.get("Devices") or []],
            network_mode=host.get("NetworkMode"), restart_policy=host.get("RestartPolicy"),
            group_add=host.get("GroupAdd"), runtime=host.get("Runtime"),
            port_bindings={k: [(b.get("HostIp", ""), b["HostPort"]) for b in v]
                           for k, v in (host.get("PortBindings") or {}).items()} or None)
        created = api.create_container(image, name=f"{self.name}-candidate", environment=env,
                                       host_config=host_config, labels=info["Config"].get("Labels"),
                                       volumes=list((info["Config"].get("Volumes") or {}).keys()) or None)
        return self.docker.containers.get(created["Id"])

    # ---- the update -----------------------------------------------------------------------------

    def handle(self, payload: bytes | str | dict[str, Any]) -> str:
        """Apply one manifest; returns the final phase."""
        self._status("received")
        engine_error: Exception | None = None
        try:
            manifest = parse(payload)
            verify(manifest, self.keys, None, __version__)  # signature, digest, agent: no engine needed
            try:
                old = self._get(self.name)
                current = self._judge(manifest, old)
            except ManifestRefused:
                raise
            except Exception as exc:  # noqa: BLE001 - docker raises DockerException, APIError, connection errors
                # The engine does not answer (dockerd restarting) and nothing was recorded yet: judged by the
                # state file (the release of the last update), so a manifest refused for its content, or the
                # recorded release again, is answered now; any other waits for the engine (the source retries).
                engine_error, old = exc, None
                current = self._judge(manifest, None)
            if current:
                # The release that runs, again: a retained ("desired state") manifest the broker hands to
                # every new subscription, or a polled URL read again after a restart. Checked like any
                # other, then reported as the current state instead of refused as "not newer".
                self._status("current", manifest)
                return "current"
        except ManifestRefused as exc:
            self._status("refused", reason=str(exc))
            return "refused"
        if self.state().get("phase") not in (None, "idle"):
            self._status("refused", manifest, "another update is in progress")
            return "refused"
        if engine_error is not None:
            return self._wait_for_engine(manifest, engine_error)
        self._engine_said = None
        if old is None:
            self._status("failed", manifest, f"no container named {self.name!r} to update")
            return "failed"
        idle = {k: v for k, v in self.state().items() if k in ("version", "image")}  # what an undo restores
        self._save(phase="verified", manifest=manifest.model_dump(), old_id=old.id)
        self._status("verified", manifest)

        self._save(phase="pulling", manifest=manifest.model_dump(), old_id=old.id)
        self._status("pulling", manifest)
        try:
            repo, digest = manifest.image.split("@", 1)
            self.docker.api.pull(repo, tag=digest)
            self.docker.images.get(manifest.image)
        except Exception as exc:  # noqa: BLE001 - docker raises APIError, ImageNotFound, connection errors
            self._save(phase="idle", **idle)
            if engine_lost(exc):  # dockerd went away after the check: nothing changed, the manifest waits
                return self._wait_for_engine(manifest, exc)
            self._status("failed", manifest, f"pull failed: {exc}")
            return "failed"
        try:
            stopped = self._wait_for_line(manifest, old)
            return stopped or self._start(manifest, old, idle)
        finally:
            if self.lock is not None:
                self.lock.release()

    def _judge(self, manifest: Manifest, container: Any) -> bool:
        """True when the manifest's release is the one `container` runs (None: the state file's); raises
        ManifestRefused when it may not be applied."""
        current = self._version_of(container)
        if manifest.version == current and self._runs_image_of(manifest, container):
            return True
        verify(manifest, self.keys, current, __version__, self.allow_downgrade)
        return False

    @staticmethod
    def engine_reason(exc: BaseException) -> str:
        """The status reason for an engine that did not answer (or answered with an error)."""
        import docker.errors

        text = str(exc) or type(exc).__name__
        text = text if len(text) <= 300 else text[:300] + "…"
        if isinstance(exc, docker.errors.APIError) and exc.response is not None:  # it answered, with an error
            return f"the container engine failed: {text}"
        return f"the container engine is not answering: {text}"

    def _wait_for_engine(self, manifest: Manifest, exc: Exception) -> str:
        """Nothing changed (a step recorded before the engine went away was undone): reported, and left to
        the source to take again."""
        reason = self.engine_reason(exc)
        said = _NUMBERS.sub("#", reason)  # one info line per distinct error, as the recovery logs
        level = logging.DEBUG if said == self._engine_said else logging.INFO
        self._engine_said = said
        self._status(WAITING_ENGINE, manifest, reason, level=level)
        return WAITING_ENGINE

    def _wait_for_line(self, manifest: Manifest, old: Any) -> str | None:
        """Hold the update lock (line idle, window open), or end the update: the final phase."""
        reason = self.cancelled()  # e.g. withdrawn by the server while the image was pulled
        if reason:
            verdict = LockVerdict(False, "canceled", reason)
        elif self.lock is None:
            verdict = LockVerdict(True)
        else:
            self._save(phase="waiting_line", manifest=manifest.model_dump(), old_id=old.id)
            verdict = self.lock.acquire(lambda why: self._status("waiting_line", manifest, why), self.cancelled)
        if verdict.ok:
            return None
        self._save(phase="idle", version=self.state().get("version"))
        self._status(verdict.phase, manifest, verdict.reason)
        return verdict.phase

    def _start(self, manifest: Manifest, old: Any, idle: dict[str, Any] | None = None) -> str:
        self._save(phase="starting", manifest=manifest.model_dump(), old_id=old.id)
        self._status("starting", manifest)
        try:
            stale = self._get(f"{self.name}-candidate")
            if stale is not None:
                stale.remove(force=True)
            candidate = self._clone(old, manifest.image)
        except Exception as exc:  # noqa: BLE001 - the old container still runs: nothing changed yet
            if engine_lost(exc):  # a candidate left created is removed by the next attempt, as a stale one
                self._save(phase="idle", **({"version": self.state().get("version")} if idle is None else idle))
                return self._wait_for_engine(manifest, exc)
            return self._rollback(manifest, old.id, f"starting the candidate failed: {exc}")
        try:
            # The camera device and the host port belong to one container at a time: stop the old one first.
            self._call(old.stop, timeout=20)
            if self.lock is not None:  # the daemon is down: the new one may take its shared lock again
                self.lock.release()
            self._call(candidate.start)
            self._save(phase="waiting_health", manifest=manifest.model_dump(), old_id=old.id,
                       candidate_id=candidate.id)
            verdict = self._wait_healthy(candidate)
        except AgentStopping:
            raise  # recorded: the next start finishes the swap
        except Exception as exc:  # the engine refused a step: the old container must run again
            if engine_lost(exc):  # the swap is half done: recorded, it is finished (`recover`) once the engine
                raise  # answers, the candidate committed if it turns healthy, instead of rolled back now
            return self._rollback(manifest, old.id, f"starting the candidate failed: {exc}")
        if verdict != "healthy":
            return self._rollback(manifest, old.id, f"candidate {verdict}")
        self._status("healthy", manifest)
        return self._commit(manifest, old.id, candidate.id)

    def _commit(self, manifest: Manifest, old_id: str, candidate_id: str) -> str:
        self._save(phase="committing", manifest=manifest.model_dump(), old_id=old_id, candidate_id=candidate_id)
        previous = self._call(self._get, f"{self.name}-previous")
        if previous is not None and previous.id != old_id:
            self._call(previous.remove, force=True)
        old = self._call(self._get, old_id)
        if old is not None and old.name != f"{self.name}-previous":
            self._call(old.rename, f"{self.name}-previous")  # kept, stopped, for a manual rollback
        candidate = self._call(self._get, candidate_id)
        if candidate is not None and candidate.name != self.name:
            self._call(candidate.rename, self.name)
        self._finish("committed", manifest, version=manifest.version, image=manifest.image)
        return "committed"

    def _rollback(self, manifest: Manifest, old_id: str, reason: str) -> str:
        candidate = self._call(self._get, f"{self.name}-candidate")
        if candidate is not None:
            self._call(candidate.remove, force=True)
        old = self._call(self._get, old_id)
        if old is not None:
            if old.name != self.name:
                self._call(old.rename, self.name)
            self._call(old.start)
        self._finish("rolled_back", manifest, reason, version=self.state().get("version"))
        return "rolled_back"

    def _finish(self, phase: str, manifest: Manifest, reason: str = "", **idle: Any) -> None:
        """End a swap: recorded as over with its outcome still to report, reported, then the note dropped.
        Killed in between, `recover()` reports it at the next start, so a source never loses the outcome
        (a DDI server would otherwise offer the action again and hear 'not newer' for a good commit)."""
        self._save(phase="idle", **idle, report={"phase": phase, "manifest": manifest.model_dump(), "reason": reason})
        self._status(phase, manifest, reason)
        self._save(phase="idle", **idle)

    def recover(self) -> str:
        """After a crash or power loss: finish or undo whatever step was under way. A stop (`stopping`) ends
        its waits and engine calls at once (`AgentStopping`), the state file left for the next start."""
        state = self.state()
        phase = state.get("phase", "idle")
        if phase == "idle":
            report = state.get("report")
            if not isinstance(report, dict):
                return "idle"
            # The swap ended but its outcome was not reported (killed in between): report it now.
            idle = {k: v for k, v in state.items() if k not in ("phase", "report")}
            self._finish(str(report["phase"]), Manifest.model_validate(report["manifest"]),
                         str(report.get("reason", "")), **idle)
            return str(report["phase"])
        manifest = Manifest.model_validate(state["manifest"])
        log.log(logging.WARNING if phase != self._recovery_logged else logging.DEBUG,
                "ota: recovering from an interrupted update (phase %s)", phase)
        self._recovery_logged = phase
        if phase in ("verified", "pulling", "waiting_line"):
            self._save(phase="idle", version=self._call(self.current_version))
            self._status("failed", manifest, f"interrupted while {phase}; nothing was changed")
            return "failed"
        if phase == "committing":
            return self._commit(manifest, state["old_id"], state["candidate_id"])
        # starting / waiting_health: the old container may be stopped and a candidate may exist.
        candidate = self._call(self._get, f"{self.name}-candidate")
        if candidate is not None:
            old = self._call(self._get, state["old_id"])
            if old is not None and old.status == "running":  # killed before it was stopped, or its restart
                self._call(old.stop, timeout=20)  # policy brought it back at boot: one daemon at a time
            if candidate.status != "running":
                self._call(candidate.start)
            if self._wait_healthy(candidate) == "healthy":
                self._status("healthy", manifest)
                return self._commit(manifest, state["old_id"], candidate.id)
        return self._rollback(manifest, state["old_id"], "interrupted while starting; candidate not healthy")
