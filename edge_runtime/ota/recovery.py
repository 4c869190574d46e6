"""The agent's crash recovery, retried until it succeeds, for both sources (the MQTT loop in
`service.py` and the DDI loop in `ddi/runner.py`); and `EngineWait`, the MQTT loop's manifest that waits
for the engine.

`OtaAgent.recover()` finishes or undoes a swap that was interrupted; it needs the Docker engine, which at
boot may not answer yet (or answers with an error). A failed attempt is counted, published as a
`recovering` status (reason, `recovery_failures`, the interrupted phase) and logged as one line per
distinct error, rate-limited; the source retries after `backoff_s(failures)` and answers no release
until an attempt succeeds.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable
from typing import Any

from edge_runtime import __version__
from edge_runtime.core.supervise import RateLimitedLog
from edge_runtime.ota.agent import WAITING_ENGINE, AgentStopping, OtaAgent, engine_lost
from edge_runtime.ota.manifest import Manifest, parse, version_key

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 300.0
REPEAT_LOG_S = 600.0  # a failure that repeats is logged again, with its count, at most this often
MAX_DISTINCT_ERRORS = 16  # distinct errors logged each at once; more share one rate limit


def backoff_s(failures: int, jitter: Callable[[], float] = random.random) -> float:
    """5 s, 10 s, 20 s … up to 5 min, ±20 % so a fleet that lost its server does not return in step."""
    base = min(5.0 * 2 ** max(failures - 1, 0), MAX_BACKOFF_S)
    return base * (0.8 + 0.4 * jitter())


def describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "…"


_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")


class DistinctErrors:
    """A failure that repeats: each distinct error (per kind) is logged at once, one line, then at most
    once per REPEAT_LOG_S with the count of the lines left out (`RateLimitedLog`)."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._logs: dict[tuple[str, str], RateLimitedLog] = {}
        self._overflow = RateLimitedLog(logger, REPEAT_LOG_S)

    def log(self, kind: str, exc: BaseException, msg: str, *args: Any, level: int = logging.WARNING,
            first_traceback: bool = False) -> bool:
        """`msg` gets the error's text as its first argument; True when this error of this kind is new."""
        # Addresses and numbers in the text (docker-py's "<... object at 0x7f...>", ports, counts) change
        # from one attempt to the next: the same failure must count as one error, not a new one each time.
        key = (kind, _NUMBERS.sub("#", f"{type(exc).__name__}: {describe(exc)}"))
        limiter = self._logs.get(key)
        new = limiter is None and len(self._logs) < MAX_DISTINCT_ERRORS  # past that, all share one limit
        if new:
            limiter = self._logs[key] = RateLimitedLog(self.logger, REPEAT_LOG_S)
        elif limiter is None:
            limiter = self._overflow
        limiter.log(level, msg, describe(exc), *args, exc_info=new and first_traceback)
        if new and not first_traceback:
            self.logger.debug("ota: %s failed", kind, exc_info=exc)
        return new

    def clear(self, kind: str) -> None:
        """The failure ended: its errors are logged at once if they come back."""
        self._logs = {k: v for k, v in self._logs.items() if k[0] != kind}


def engine_gone(agent: OtaAgent, exc: BaseException, then: str, logger: logging.Logger = log) -> bool:
    """An update that `handle()` left because the engine stopped answering mid-swap (`engine_lost`, the swap
    still recorded: once the old container is being stopped it is not rolled back without an engine) is an
    expected condition the recovery takes over, not a bug: one WARNING line naming the engine's error and
    `then` (what the source does next), the traceback at DEBUG. False for any other error, which the caller
    logs as the bug it is (ERROR, with its traceback)."""
    state = agent.state()
    phase = state.get("phase", "idle")
    if phase == "idle" or not engine_lost(exc):
        return False
    manifest = state.get("manifest")
    version = manifest.get("version") if isinstance(manifest, dict) else None
    logger.warning("ota: %s, during the update to %s (phase %s); %s", agent.engine_reason(exc), version or "?",
                   phase, then)
    logger.debug("ota: the engine's error", exc_info=exc)
    return True


class Recovery:
    """One agent's crash recovery, attempted until it succeeds (`attempt()`; the caller waits `wait_s()`
    between attempts). `meanwhile` says in the log what the source does while it fails; `on_failure`
    (reason, whether the error is new) lets a source tell its server."""

    def __init__(self, agent: OtaAgent, publish: Callable[[dict[str, Any]], None] | None,
                 errors: DistinctErrors | None = None, meanwhile: str = "",
                 on_failure: Callable[[str, bool], None] | None = None) -> None:
        self.agent = agent
        self.publish = publish
        self.errors = errors or DistinctErrors(log)
        self.meanwhile = meanwhile
        self.on_failure = on_failure
        self.failures = 0  # failed attempts in a row (reset when one succeeds)

    def attempt(self) -> bool:
        """Run the agent's `recover()`. False when it failed and the agent is still mid-swap: counted,
        published, logged once per distinct error."""
        try:
            self.agent.recover()
            error: Exception | None = None
        except AgentStopping:  # the agent stops: no failure; the state file has the step for the next start
            log.info("ota: stopping during the recovery of an interrupted update; it goes on at the next start")
            return False
        except Exception as exc:  # noqa: BLE001 - docker raises APIError, connection errors, timeouts
            error = exc
        if self.agent.state().get("phase", "idle") != "idle":
            self._failed(error or RuntimeError("the agent is still mid-swap after its recovery"))
            return False
        if error is not None:  # the swap is over, but reporting its outcome failed: reported at the next start
            self.errors.log("report", error, "ota: reporting the recovered update failed: %s", first_traceback=True)
        if self.failures:
            log.info("ota: the interrupted update was recovered after %d failed attempts", self.failures)
            self.failures = 0
            self.errors.clear("recovery")
        return True

    def wait_s(self) -> float:
        """How long to wait before the next attempt."""
        return backoff_s(self.failures)

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        reason = describe(exc)
        first = self.errors.log("recovery", exc, "ota: recovering the interrupted update failed: %s (attempt %d; "
                                "retrying with backoff%s)", self.failures,
                                f", {self.meanwhile}" if self.meanwhile else "")
        state = self.agent.state()
        manifest = state.get("manifest")
        manifest = manifest if isinstance(manifest, dict) else {}
        status = {"phase": "recovering", "ts": time.time(), "agent": __version__, "reason": reason,
                  "recovery_failures": self.failures, "interrupted": state.get("phase")}
        status.update({k: manifest[k] for k in ("version", "image") if k in manifest})
        if self.publish is not None:
            self.publish(status)
        if self.on_failure is not None:
            self.on_failure(reason, first)


class EngineWait:
    """The MQTT loop's manifest (from the topics or the URL) that `OtaAgent.handle` could not take because
    the engine did not answer (`waiting_engine`: no swap under way, nothing recorded or changed). It is kept
    and taken again once the engine answers, asked with backoff (`backoff_s`) and never sooner; each failed
    attempt is a `waiting_engine` status with `engine_failures` (the attempts in a row, the manifest's own
    the first) and the log has one line per distinct error. One manifest waits: one that also waits replaces
    it when its version is newer (an older or equal one would be refused after it as not newer) or always
    with allow_downgrade; a manifest refused for its content, or answered `current`, leaves it waiting."""

    def __init__(self, agent: OtaAgent, errors: DistinctErrors | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.agent = agent
        self.errors = errors or DistinctErrors(log)
        self.clock = clock
        self.payload: bytes | None = None
        self.manifest: Manifest | None = None
        self.failures = 0  # attempts in a row the engine did not answer
        self.next_at = 0.0

    def due(self) -> bool:
        return self.payload is not None and self.clock() >= self.next_at

    def take(self, payload: bytes) -> str:
        """Hand a manifest to the agent; keep it if it waits for the engine. Returns the agent's phase."""
        phase = self.agent.handle(payload)
        if phase != WAITING_ENGINE:
            if phase not in ("refused", "current"):  # these two may come from the state file, the engine down
                self._answered()
            return phase
        manifest = parse(payload)
        if self.manifest is None or self.agent.allow_downgrade or _newer(manifest, self.manifest):
            self.payload, self.manifest = payload, manifest
        elif payload != self.payload:
            log.info("ota: %s waits for the engine behind %s, which is newer and is taken first",
                     manifest.version, self.manifest.version)
        self.failures += 1
        self.next_at = self.clock() + backoff_s(self.failures)
        return phase

    def attempt(self) -> str | None:
        """Ask the engine; once it answers, hand the waiting manifest to the agent again (its phase).
        None while the engine does not answer: counted, published, logged once per distinct error."""
        if self.payload is None:
            return None
        try:
            self.agent.check_engine()
        except Exception as exc:  # noqa: BLE001 - docker raises DockerException, APIError, connection errors
            self.failures += 1
            self.next_at = self.clock() + backoff_s(self.failures)
            assert self.manifest is not None
            self.errors.log("engine", exc, "ota: the container engine is not answering: %s (attempt %d; "
                            "%s waits, retrying with backoff)", self.failures, self.manifest.version)
            status = self.agent.status_message(WAITING_ENGINE, self.manifest, self.agent.engine_reason(exc))
            status["engine_failures"] = self.failures
            self.agent.publish_cb(status)
            return None
        payload, self.payload, self.manifest = self.payload, None, None
        log.info("ota: the container engine answers again after %d failed attempts; taking the manifest that "
                 "waited", self.failures)
        self._answered()
        return self.take(payload)

    def _answered(self) -> None:
        self.failures = 0
        self.errors.clear("engine")


def _newer(manifest: Manifest, than: Manifest) -> bool:
    try:
        return bool(version_key(manifest.version) > version_key(than.version))
    except ValueError:  # not semantic versions (refused by verify, unless allowed): the later one wins
        return True
