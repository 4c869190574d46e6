"""The agent's loop when its releases come from a DDI server (`ota.hawkbit`): poll at the server's
interval (or the configured one), run one deployment at a time through the health-gated agent, and
report every step as feedback: `proceeding` with the phase, then `closed` with `success` or
`failure` and the reason (refused / rolled back / pull failed / waited for the line).

Durability: the action being worked on and, once known, its final feedback are written to
`ddi.json` (fsync + rename) before they are acted on. After a kill the agent's own `recover()`
finishes or undoes the swap and its final status is sent for the same action; an action that was
interrupted before anything changed is simply taken again; a final feedback that did not get through
is sent again (never recomputed) before the next poll, so a server that offers the action again because it
never got the answer gets the same answer. An action the server offers again after it took the closing feedback
is a new deployment of it (hawkBit never does that; goosebit does, its action id being its software's: a failed
release forced again, a release offered again after a rollback): taken like any (a release that runs already is
closed as success at once, nothing pulled), and a server that keeps offering it after each answer is answered at
the backoff (`retry_wait_s`, counted per offer in a row), not at every poll.
Failures of the server are retried with exponential backoff and never end the loop. A recovery that
fails (the Docker engine not answering yet) is retried with its own backoff while the loop goes on
polling at the server's interval (so the server does not see the device overdue) and sending configData
when asked, but answers no action until the swap is finished or undone; each failed attempt is counted
(`recovery_failures`, in the `recovering` status on MQTT) and logged as one line per distinct error,
rate-limited (`ota/recovery.py`, shared with the MQTT loop). An action the agent could not take because the
engine did not answer before anything changed (`waiting_engine`) stays open, and the server offers the action
again, which is taken again at its polling interval (below).

Each `proceeding` feedback of an action (its text, numbers folded) is sent once, at most MAX_TOLD_PER_ACTION of
them: a retry, or a restart (the texts told are kept in `ddi.json`), does not tell `received`, `verified`,
`pulling` or a `waiting_engine` reason again. hawkBit keeps at most 1000 status entries per action, then refuses
its `proceeding` feedback (releases that check every status, its closing one too); its own entries stay bounded
too: RETRIEVED for a fetch of the action's deploymentBase is added only after another entry, DOWNLOAD once per
download (once per process: the artifact is kept). A closing feedback is sent until the server takes it (one it
refused is not kept; one it kept whose answer was lost is answered 410 Gone the next time, which counts as sent),
or until it has refused it for good (another 4xx but those of `_NOT_FOR_GOOD`) MAX_REFUSED_CLOSING_TRIES times and
a poll then answers: then it is dropped, counted (`closings_dropped`, a `feedback_dropped` status on MQTT), and the
loop polls on.

An action's retries follow the server's polling interval, bounded to 5 s - 5 min for them (`retry_interval_s`):
one that waits for the engine comes at that interval (the server, healthy, keeps seeing the device on time,
and a cancel reaches it); one the server failed (its deploymentBase, artifact or closing feedback) backs off,
but never sooner than that interval once a poll named it (`retry_wait_s`; before, at start, the backoff alone).
The artifact, once downloaded and checked against the server's hash, is kept by that hash and reused by a retry
instead of downloaded again.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_runtime import __version__
from edge_runtime.core.supervise import RateLimitedLog
from edge_runtime.ota.agent import WAITING_ENGINE, AgentStopping, OtaAgent
from edge_runtime.ota.ddi.artifact import SWU_MANIFEST, ArtifactRefused, manifest_from_artifact
from edge_runtime.ota.ddi.client import ControllerBase, DdiClient, DdiError, Deployment
from edge_runtime.ota.recovery import DistinctErrors, Recovery, backoff_s, engine_gone

log = logging.getLogger(__name__)

DEFAULT_SLEEP_S = 300.0  # when the server names no interval
MAX_DOWNLOAD_TRIES = 3  # retryable download failures of one action before it is closed as failed
# An action's retries follow the server's polling interval, kept within these: a server asking for a poll
# every second does not get a failing device's retries as often, and one asking for hours still sees an
# update that waits (for the engine, say) taken again within minutes.
MIN_RETRY_INTERVAL_S, MAX_RETRY_INTERVAL_S = 5.0, 300.0
FINAL = {"committed": "success", "current": "success", "rolled_back": "failure", "refused": "failure",
         "failed": "failure"}
# An action's `proceeding` feedback is told once per distinct text (numbers folded, `_NUMBERS`): an action taken
# again (the engine not answering, a restart) repeats its steps, and hawkBit keeps at most 1000 status entries per
# action (`maxStatusEntriesPerAction`), then refuses its feedback (403; some releases the closing one too). Past
# this many distinct texts an action tells nothing more before its closing feedback (with hawkBit's RETRIEVED and
# DOWNLOAD entries, about 2 per feedback at most, well within the 1000).
MAX_TOLD_PER_ACTION = 100
TOLD_ACTIONS = 4  # the actions whose told feedback is kept (hawkBit offers one at a time; one replaced, then back)
# A closing feedback the server refuses for good (`refused_for_good`: a 4xx that a retry does not change, such as
# hawkBit's 403 for an action whose history is full) is tried this many times, then dropped, and only once a poll
# answers (`_refused`): the first try could meet a server mid-restart or a proxy's passing error, and the tries span
# the server's polling interval plus max(5 s, that interval) while the agent runs (5 s + 10 s after a restart,
# before any poll answered: the backoff alone), each try holding the polls back (the closing feedback goes before
# the next poll). A server (or a proxy's allowlist) that answers every request 403, the polls too, is not one that
# refuses this feedback: it is tried again at the backoff, never dropped, until a poll answers.
MAX_REFUSED_CLOSING_TRIES = 3
# 4xx answers that are not a refusal for good: 404/410 (the action is gone: the feedback counts as sent), 408, 425
# and 429 (try later), 409 and 423 (hawkBit's concurrent modification and locked entity: a retry passes), 421 (a
# connection to the wrong server), 401 and 407 (the device's or the proxy's credentials, which the operator fixes:
# the polls fail as well meanwhile, and dropping the result would only lose it).
_NOT_FOR_GOOD = frozenset({401, 404, 407, 408, 409, 410, 421, 423, 425, 429})
_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")  # addresses, ports, counts: the same step, not a new one
_ACTION_IN_HREF = re.compile(r"/deploymentBase/([^/?#]+)")


def poll_wait_s(interval_s: float, jitter: Callable[[], float] = random.random) -> float:
    """The polling interval plus up to 10 %: never sooner than the server asked, and devices that started
    together (a plant powering up) drift apart instead of polling, and starting a wave's pulls, in step."""
    return interval_s * (1.0 + 0.1 * jitter())


def retry_interval_s(interval_s: float) -> float:
    """The server's polling interval as an action's retries follow it (5 s - 5 min)."""
    return min(max(interval_s, MIN_RETRY_INTERVAL_S), MAX_RETRY_INTERVAL_S)


def retry_wait_s(failures: int, interval_s: float, jitter: Callable[[], float] = random.random) -> float:
    """The wait before an action the server failed is tried again: the backoff (5 s, 10 s … 5 min, ±20 %: a
    failing server is not asked again at every poll), but never sooner than the server's polling interval
    (`retry_interval_s`, plus up to 10 %: a fleet of devices does not come back sooner than asked, in step)."""
    return max(backoff_s(failures, jitter), poll_wait_s(retry_interval_s(interval_s), jitter))


def refused_for_good(exc: DdiError) -> bool:
    """Whether the server refused a feedback with a client error that trying again will not change."""
    return exc.status is not None and 400 <= exc.status < 500 and exc.status not in _NOT_FOR_GOOD


def final_feedback(phase: str, status: dict[str, Any]) -> tuple[str, list[str]]:
    """(finished, details) of the closing feedback for an agent's final phase."""
    reason = str(status.get("reason", ""))
    if phase == "committed":
        return "success", [f"committed {status.get('version', '')}".strip()]
    if phase == "current":  # the action's release runs already: installed, nothing to do
        return "success", [f"already running {status.get('version', '')}".strip()]
    if phase == "rolled_back":
        return "failure", [f"rolled back: {reason}"]
    if phase == "refused":
        return "failure", [f"refused: {reason}"]
    return "failure", [reason or "failed"]  # the agent's reasons start with what failed ("pull failed: …")


class DdiSource:
    """One device's DDI loop around one `OtaAgent` (which it owns while it runs)."""

    def __init__(self, client: DdiClient, agent: OtaAgent, state_path: Path,
                 config_data: Callable[[], dict[str, str]], stop: threading.Event,
                 poll_override_s: float | None = None, publish: Callable[[dict[str, Any]], None] | None = None,
                 sleep: Callable[[float], bool] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.agent = agent
        self.state_path = state_path
        self.config_data = config_data
        self.stop = stop
        self.poll_override_s = poll_override_s
        self.mirror = publish  # the MQTT status topic, when there is one
        self._sleep = sleep or stop.wait
        self._clock = clock
        self.interval_s = poll_override_s or DEFAULT_SLEEP_S
        self._interval_known = poll_override_s is not None  # configured, or named by a poll that answered
        self.failures = 0
        self._next_poll_at = -math.inf  # when the server may be polled again (while a recovery fails)
        self._errors = DistinctErrors(log)
        self._recovery = Recovery(agent, self._mirror, self._errors, "polling the server meanwhile",
                                  self._tell_recovery_failed)
        self._recovering = False
        self._download_tries: dict[str, int] = {}
        # A closed action the server offers again (`_deploy`), and how many times in a row it did; reset by a poll
        # that offers it no more.
        self._again: tuple[str, int] | None = None
        self._artifact: tuple[str, bytes] | None = None  # the last artifact downloaded: (its hash, its bytes)
        self._cancels_answered: set[str] = set()
        self._cancel_reason: str | None = None
        self._cancel_id: str | None = None  # the cancelAction that stopped the running action, if any
        # The `proceeding` feedback told to the server, per action (`_tell`): kept in ddi.json with the action, so
        # neither a retry (every 5 s - 5 min while the engine does not answer) nor a restart tells a step again.
        told = self.state().get("told")
        self._told: dict[str, list[str]] = {
            str(a): [str(t) for t in said] for a, said in told.items() if isinstance(said, list)
        } if isinstance(told, dict) else {}
        self._last_check = 0.0
        self._warn = RateLimitedLog(log, 600)
        self.closings_dropped = 0  # closing feedbacks the server refused for good, dropped (`_flush_final`)
        self._polled: ControllerBase | None = None  # the poll `_refused` made before it dropped one, for this step
        agent.publish_cb = self._on_status
        agent.stopping = stop  # ends a swap's health wait and engine calls (recorded: the next start goes on)
        state_path.parent.mkdir(parents=True, exist_ok=True)

    @property
    def recovery_failures(self) -> int:
        """Failed recovery attempts in a row (reset when one succeeds)."""
        return self._recovery.failures

    # ---- state --------------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        try:
            value = json.loads(self.state_path.read_text())
            return value if isinstance(value, dict) else {}
        except (OSError, ValueError):
            return {}

    def _save(self, **state: Any) -> None:
        """Write ddi.json: `state` (the action) and the feedback told per action."""
        if self._told:
            state["told"] = self._told
        tmp = self.state_path.with_suffix(".tmp")
        with tmp.open("w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.state_path)

    # ---- the loop -------------------------------------------------------------------------------------

    def run(self) -> None:
        """Until `stop`: recover, then poll, act, sleep. No exception ends it."""
        pending = not self._recover()  # then the first poll comes at once, the next attempt after its backoff
        while not self.stop.is_set():
            try:
                wait = self._while_recovering() if pending else self.step()
                self._errors.clear("step")
            except AgentStopping:  # mid-swap: recorded (state.json, ddi.json); the next start reports it
                log.info("ota: stopping during an update; it is finished or undone, and reported, at the next start")
                break
            except Exception as exc:  # noqa: BLE001 - no exception may end the loop
                self.failures += 1
                wait = backoff_s(self.failures)
                if not engine_gone(self.agent, exc, "the recovery finishes or undoes it once the engine answers "
                                   "(retried with backoff, polling meanwhile), and the action is reported then",
                                   log):
                    self._errors.log("step", exc, "ota: DDI step failed: %s (%d in a row); the agent goes on",
                                     self.failures, level=logging.ERROR, first_traceback=True)
            pending = False
            self._sleep(wait)

    def step(self) -> float:
        """One poll and what it asks for; returns the seconds to sleep before the next."""
        # A recovery that failed (the engine was not answering yet) or a swap an error interrupted: retried
        # with backoff, polling meanwhile, and finished before any action is answered.
        if self.agent.state().get("phase", "idle") != "idle":
            if not self._recover():
                return 0.0 if self.stop.is_set() else self._while_recovering()
            if self._clock() < self._next_poll_at:  # its outcome went out with the recovery; the poll when due
                return self._next_poll_at - self._clock()
        wait = self._poll_and_act()
        self._next_poll_at = self._clock() + wait
        return wait

    def _while_recovering(self) -> float:
        """Poll when the last poll's wait is over (the server must not see the device overdue), send
        configData when asked; answer no action. Returns the wait until the next recovery attempt or poll."""
        now = self._clock()
        if now >= self._next_poll_at:
            try:
                base = self.client.poll()
            except DdiError as exc:
                self._next_poll_at = now + self._failed("polling", exc)
            else:
                self.failures = 0
                self._set_interval(base)
                if base.config_data_href:
                    self._send_config_data()
                self._next_poll_at = now + poll_wait_s(self.interval_s)
        return max(0.0, min(self._recovery.wait_s(), self._next_poll_at - now))

    def _set_interval(self, base: ControllerBase) -> None:
        self.interval_s = self.poll_override_s or base.sleep_s or DEFAULT_SLEEP_S
        self._interval_known = True

    def _retry_wait_s(self) -> float:
        """`retry_wait_s` once the server's interval is known; before (no poll answered yet, the interval the
        300 s default) the backoff alone, as for a failed poll: a closing feedback refused at start is sent
        again after 5 s, 10 s, 20 s …, not after ~5 min."""
        return retry_wait_s(self.failures, self.interval_s) if self._interval_known else backoff_s(self.failures)

    def _poll_and_act(self) -> float:
        self._polled = None
        if not self._flush_final():
            self.failures += 1
            return self._retry_wait_s()
        try:
            base = self._polled if self._polled is not None else self.client.poll()  # `_refused` polled: this step's
        except DdiError as exc:
            return self._failed("polling", exc)
        self._set_interval(base)
        if self._again is not None and (base.cancel_href or not base.deployment_href
                                        or not _offers(base, self._again[0])):
            self._again = None  # the server took the last answer to the action it offered again
        if base.config_data_href:
            self._send_config_data()
        try:
            if base.cancel_href:
                self._answer_cancel(base.cancel_href)
            elif base.deployment_href and self._deploy(base.deployment_href) == WAITING_ENGINE:
                # The engine did not answer before anything changed: the action stays open (the server offers
                # it again) and is taken again at the next poll, at the server's interval (within 5 s - 5 min;
                # the server is healthy and must not see the device overdue), counted with the failures.
                self.failures += 1
                return poll_wait_s(retry_interval_s(self.interval_s))
        except DdiError as exc:  # counted with the polls: a base that answers must not reset the backoff
            return self._failed("the action", exc, of_action=True)
        self.failures = 0
        if self._again is not None and (self.state().get("action") or {}).get("final"):
            # A closed action offered again, answered again: the next poll at the backoff for as many offers in a
            # row (5 s, 10 s … 5 min, never sooner than the server's interval), so a server that keeps offering
            # it whatever the device answers gets neither a feedback nor a swap at every poll.
            return retry_wait_s(self._again[1], self.interval_s)
        return poll_wait_s(self.interval_s)

    def _failed(self, what: str, exc: DdiError, of_action: bool = False) -> float:
        """Counted; the wait before the next try (a poll that failed: the backoff alone, the interval of a
        server that does not answer being unknown; the action's: `_retry_wait_s`)."""
        self.failures += 1
        wait = self._retry_wait_s() if of_action else backoff_s(self.failures)
        self._warn.log(logging.WARNING, "ota: DDI %s failed: %s (%d in a row; next try in %.0f s)",
                       what, exc, self.failures, wait)
        return wait

    # ---- one deployment ---------------------------------------------------------------------------------

    def _deploy(self, href: str) -> str | None:
        """The action's final phase (the agent's), or None while it is not handed to the agent."""
        deployment = self.client.deployment(href)
        action = deployment.action_id
        known = self.state().get("action") or {}
        if known.get("id") == action and known.get("final"):
            if not known.get("sent"):  # dropped (`_refused`): left to the operator; unsent ones go before a poll
                return None
            # Closed here, and the server, which took the closing feedback (or answered that it had it), offers
            # it again: a deployment it wants applied, and answered. hawkBit never offers a closed action again;
            # goosebit does, its action id being its software's (a failed release forced again, a release
            # offered again after a rollback). Taken as a new one: a release that runs already is closed as
            # success at once (`current`, nothing pulled), a failed one is tried again.
            again = self._again[1] + 1 if self._again is not None and self._again[0] == action else 1
            self._again = (action, again)
            final = known["final"]
            log.info("ota: the server offers action %s again after it was closed (%s: %s); taken as a new "
                     "deployment (%d in a row)", action, final.get("finished"), "; ".join(final.get("details") or []),
                     again)
            known = {}
        # Outside its maintenance window hawkBit sends `update: skip` too: the window decides first, and
        # only a `skip` without a closed window is a download-only assignment.
        if deployment.maintenance_window == "unavailable":  # the server's own window is closed
            if known.get("id") != action:
                self._save(action={"id": action})
                self._proceeding(action, ["waiting for the server's maintenance window"])
            return None
        if deployment.update == "skip":  # hawkBit's download-only assignment
            self._close(action, "failure", ["refused: download-only actions are not supported; "
                                            "assign the distribution set as forced or soft"])
            return None
        self._save(action={"id": action})
        body = self._download(deployment)
        if body is None:
            return None
        self._cancel_reason = None
        self.agent.cancelled = lambda: self._cancel_check(action)
        try:
            phase = self.agent.handle(body)  # every status comes back through `_on_status`
        finally:
            self.agent.cancelled = lambda: None
        return phase

    def _download(self, deployment: Deployment) -> bytes | None:
        action = deployment.action_id
        ours = [a for a in deployment.artifacts if a.filename.endswith((".json", ".swu"))] or deployment.artifacts
        if not ours:
            self._close(action, "failure", ["refused: the deployment has no artifact"])
            return None
        artifact = ours[0]
        key = f"sha256:{artifact.sha256}" if artifact.sha256 else f"sha1:{artifact.sha1}" if artifact.sha1 else None
        try:
            if key is not None and self._artifact is not None and self._artifact[0] == key:
                return manifest_from_artifact(self._artifact[1])  # checked against this hash when downloaded
            self._proceeding(action, [f"downloading {artifact.filename}"])
            data = self.client.download(artifact)  # checked against the server's hash
            if key is not None:
                self._artifact = (key, data)  # one kept: a retry (the engine not answering) reuses it
            return manifest_from_artifact(data)
        except ArtifactRefused as exc:
            self._close(action, "failure", [f"refused: {exc} (expected a signed manifest or a .swu with "
                                            f"{SWU_MANIFEST})"])
        except DdiError as exc:
            tries = self._download_tries.get(action, 0) + 1
            self._download_tries[action] = tries
            if exc.retry and tries < MAX_DOWNLOAD_TRIES:
                raise  # back off; the action is offered again at the next poll
            prefix = "refused" if not exc.retry else "download failed"
            self._close(action, "failure", [f"{prefix}: {exc}"])
        return None

    # ---- cancel -----------------------------------------------------------------------------------------

    def _cancel_check(self, action: str) -> str | None:
        """Asked by the agent about once a second until the swap starts: has the server cancelled or
        withdrawn the action? Polls at most once per interval."""
        if self.stop.is_set():  # SIGTERM while waiting for the line: the server offers it again after the restart
            return "the agent is stopping; the update is taken again when it starts"
        if self._cancel_reason or time.monotonic() - self._last_check < min(self.interval_s, 30.0):
            return self._cancel_reason
        self._last_check = time.monotonic()
        try:
            base = self.client.poll()
            if base.cancel_href:
                cancel = self.client.cancel_action(base.cancel_href)
                if cancel.stop_id == action:
                    self._cancel_reason = f"cancelled by the server (cancelAction {cancel.action_id})"
                    self._cancel_id = cancel.action_id
            elif not _offers(base, action):
                self._cancel_reason = "withdrawn by the server (no longer offered)"
                self._cancel_id = None
        except DdiError as exc:
            self._warn.log(logging.WARNING, "ota: DDI poll while waiting failed: %s", exc)
        return self._cancel_reason

    def _answer_cancel(self, href: str) -> None:
        cancel = self.client.cancel_action(href)
        if cancel.action_id in self._cancels_answered:
            return
        known = self.state().get("action") or {}
        if known.get("id") == cancel.stop_id and known.get("final"):
            # Too late: the update finished (and was reported). DDI's answer for that is `rejected`.
            self.client.feedback(cancel.action_id, "rejected", "none", ["the update had already finished"],
                                 cancel=True)
        else:  # nothing of it runs here (a running one is cancelled through `_cancel_check`)
            self.client.feedback(cancel.action_id, "closed", "success", ["cancelled; nothing was changed"],
                                 cancel=True)
            self._told.pop(cancel.stop_id, None)  # over (a server that reuses its id offers it afresh)
            if known.get("id") == cancel.stop_id:
                self._save()
        self._cancels_answered.add(cancel.action_id)

    # ---- feedback ---------------------------------------------------------------------------------------

    def _on_status(self, status: dict[str, Any]) -> None:
        """The agent's publish callback: mirrored to MQTT, and turned into DDI feedback."""
        if self.mirror is not None:
            self.mirror(status)
        known = self.state().get("action") or {}
        action = known.get("id")
        if action is None or known.get("final"):  # no action, or its outcome is already recorded
            return
        phase = str(status.get("phase"))
        if self._recovering and phase == "failed":  # interrupted before anything changed: take it again
            self._save()
            self._proceeding(action, ["the agent was interrupted before anything changed; trying again"])
            return
        if phase == "canceled":
            return self._cancelled(action, status)
        if phase in FINAL:
            finished, details = final_feedback(phase, status)
            return self._close(action, finished, details)
        detail = phase + (f": {status['reason']}" if status.get("reason") else
                          f" {status['version']}" if status.get("version") else "")
        self._proceeding(action, [detail])

    def _cancelled(self, action: str, status: dict[str, Any]) -> None:
        cancel_id = self._cancel_id
        if not self.stop.is_set():  # cancelled or withdrawn by the server; a stop takes it again after the restart
            self._told.pop(action, None)
        self._save()  # the action is over on this device
        if cancel_id is not None:
            try:
                self.client.feedback(cancel_id, "closed", "success", [f"cancelled before the swap: "
                                                                      f"{status.get('reason', '')}"], cancel=True)
                self._cancels_answered.add(cancel_id)
            except DdiError as exc:
                self._warn.log(logging.WARNING, "ota: confirming the cancel failed: %s", exc)

    def _proceeding(self, action: str, details: list[str]) -> None:
        """A step of the action, told to the server once (`_tell`)."""
        if not self._tell(action, details):
            return
        try:  # intermediate steps are best effort: the closing feedback is the one that must arrive
            self.client.feedback(action, "proceeding", "none", details)
        except DdiError as exc:
            self._warn.log(logging.WARNING, "ota: DDI feedback for action %s failed: %s", action, exc)

    def _tell(self, action: str, details: list[str]) -> bool:
        """Whether this `proceeding` feedback is to be sent: the first time for this action of this text, numbers
        folded (`received`, `verified 2.0.0`, each distinct `waiting_engine` reason…), at most MAX_TOLD_PER_ACTION
        texts. Recorded in ddi.json before it is sent (the attempt counts: a feedback that did not get through is
        not sent again; the steps are best effort), until the action is closed or cancelled. Every attempt still
        goes to the MQTT status topic; the details carry no attempt count (it would be folded anyway)."""
        said = _NUMBERS.sub("#", "; ".join(details))
        told = self._told.pop(action, [])
        self._told[action] = told  # the most recent last; the oldest forgotten past TOLD_ACTIONS
        for old in list(self._told)[:-TOLD_ACTIONS]:
            del self._told[old]
        if said in told:
            return False
        if len(told) >= MAX_TOLD_PER_ACTION:
            self._warn.log(logging.WARNING, "ota: action %s told the server %d distinct steps; the next ones are not "
                           "sent (hawkBit keeps at most 1000 status entries per action), its closing feedback is",
                           action, len(told))
            return False
        told.append(said)
        try:
            state = self.state()
            state.pop("told", None)
            self._save(**state)
        except OSError as exc:  # told anyway: a restart may tell it again
            self._warn.log(logging.WARNING, "ota: recording the feedback told for action %s failed: %s", action, exc)
        return True

    def _close(self, action: str, finished: str, details: list[str]) -> None:
        # Its steps told are forgotten with it: a server that reuses action ids (goosebit's is the software's)
        # hears every step of a later deployment under the same id.
        self._told.pop(action, None)
        self._download_tries.pop(action, None)  # offered again (goosebit), its download is tried afresh
        self._save(action={"id": action, "final": {"finished": finished, "details": details}, "sent": False})
        self._flush_final()

    def _flush_final(self) -> bool:
        """Send a recorded closing feedback that has not got through; False while it cannot."""
        known = self.state().get("action") or {}
        final = known.get("final")
        if not final or known.get("sent") or known.get("dropped"):
            return True
        try:
            self.client.feedback(known["id"], "closed", final["finished"], final["details"])
        except DdiError as exc:
            if exc.status in (404, 410):  # the server forgot the action: nothing left to tell it
                log.warning("ota: action %s is gone on the server; its result (%s) stays in the log",
                            known["id"], final["finished"])
            elif refused_for_good(exc):
                return self._refused(known, exc)
            else:
                self._warn.log(logging.WARNING, "ota: closing action %s failed: %s (will retry)", known["id"], exc)
                return False
        self._save(action={**known, "sent": True})
        log.info("ota: action %s closed: %s (%s)", known["id"], final["finished"], "; ".join(final["details"]))
        return True

    def _refused(self, known: dict[str, Any], exc: DdiError) -> bool:
        """A closing feedback refused for good (`refused_for_good`): tried again at the backoff, then dropped after
        MAX_REFUSED_CLOSING_TRIES, once a poll answers (False until then; that poll is the step's, `_poll_and_act`):
        a server that answers the poll 403 as well refuses everything (a proxy's allowlist, missing permissions),
        not this feedback, and it is kept. Dropped, it is never sent again, nor after a restart, and the
        loop polls on; the action stays recorded with its outcome (`dropped`: the server's status), so a server
        that still offers it (hawkBit keeps an action open until it takes its closing feedback) does not get it
        installed again: it waits for the operator to close it there (force quit)."""
        action, final = known["id"], known["final"]
        tries = int(known.get("refusals", 0)) + 1
        if tries < MAX_REFUSED_CLOSING_TRIES:
            self._save(action={**known, "refusals": tries})
            self._warn.log(logging.WARNING, "ota: the server refused closing action %s: %s (try %d of %d)",
                           action, exc, tries, MAX_REFUSED_CLOSING_TRIES)
            return False
        try:  # a server that refuses everything (a proxy's allowlist, missing permissions) has not refused *this*
            self._polled = self.client.poll()
        except DdiError as poll_exc:
            self._save(action={**known, "refusals": tries})
            self._warn.log(logging.WARNING, "ota: the server refused closing action %s: %s (try %d), and the poll "
                           "failed too (%s): kept, tried again at the backoff", action, exc, tries, poll_exc)
            return False
        self._set_interval(self._polled)
        self._save(action={**known, "refusals": tries, "dropped": exc.status})
        self.closings_dropped += 1
        log.warning("ota: the server refused closing action %s with HTTP %s %d times (%s); its closing feedback "
                    "(%s: %s) is dropped and the agent polls on; close the action on the server (force quit)",
                    action, exc.status, tries, exc, final["finished"], "; ".join(final["details"]))
        self._mirror({"phase": "feedback_dropped", "ts": time.time(), "agent": __version__, "action": action,
                      "status": exc.status, "finished": final["finished"], "details": final["details"],
                      "closings_dropped": self.closings_dropped})
        return True

    def _send_config_data(self) -> None:
        try:
            data = self.config_data()
        except Exception as exc:  # noqa: BLE001 - e.g. the engine, asked for the running version, is down
            self._errors.log("configData", exc, "ota: configData not sent (the server asks again): %s")
            return
        self._errors.clear("configData")
        try:
            self.client.config_data(data)
        except DdiError as exc:  # the server keeps asking until it has them
            self._warn.log(logging.WARNING, "ota: sending configData failed: %s", exc)

    def _recover(self) -> bool:
        """The agent's crash recovery (`Recovery.attempt`), its statuses going to the action it belonged to."""
        self._recovering = True
        try:
            if not self._recovery.attempt():
                return False
        finally:
            self._recovering = False
        known = self.state().get("action") or {}
        if known and not known.get("final"):
            self._save()  # killed before the agent recorded a step: the server offers the action again
        return True

    def _mirror(self, status: dict[str, Any]) -> None:
        if self.mirror is not None:
            self.mirror(status)

    def _tell_recovery_failed(self, reason: str, first: bool) -> None:
        known = self.state().get("action") or {}
        if first and known.get("id") and not known.get("final"):  # the server hears each distinct error once
            self._proceeding(known["id"], [f"recovering the interrupted update failed: {reason} (retrying)"])


def _offers(base: ControllerBase, action: str) -> bool:
    if base.deployment_href is None:
        return False
    m = _ACTION_IN_HREF.search(base.deployment_href)
    return m is None or m.group(1) == action
