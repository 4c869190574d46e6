"""What happens to a verdict around the journal: evidence, rules and their actions, review.

`before_journal` runs on the inspection worker between the verdict and its journal row, so the row
(and every MQTT/REST copy of it) already carries `evidence`, `rules` and a pending `review`.
`in_journal` stages the side effects of fired rules (MQTT alerts, webhooks, review marks) on the
journal's connection, inside the transaction of the result row: all are durable or none is (the
outbox pattern). `after_journal` wakes the MQTT outbox once that transaction committed; the webhook
outbox is a sink of its own (`delivery/webhooks.py`), told of the committed result by the pipeline.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edge_runtime.config import EvidenceConfig
from edge_runtime.config.rules import AlertAction, ReaskAction, ReviewAction, Rule, RulesBudget, WebhookAction
from edge_runtime.core.device import EvidenceFile
from edge_runtime.core.errors import EdgeRuntimeError
from edge_runtime.core.governor_gate import GateDecision, OpenGate
from edge_runtime.core.result import Result, utc_now
from edge_runtime.verdicts.database import is_full
from edge_runtime.verdicts.evidence import EvidenceStore
from edge_runtime.verdicts.messages import MessageQueue
from edge_runtime.verdicts.region_marks import crop_offset, draw_regions
from edge_runtime.verdicts.review import ReviewStore
from edge_runtime.verdicts.rules import RuleEngine

log = logging.getLogger(__name__)
RETENTION_EVERY_S = 60.0


def full_frame(image: np.ndarray) -> np.ndarray:
    """The camera frame an ROI crop was cut from: capture crops by slicing, so the crop is a view
    whose `base` is the whole frame. Anything else (an upload, a copy) is its own full frame."""
    base = image.base
    if isinstance(base, np.ndarray) and base.ndim == image.ndim and base.shape[-1:] == image.shape[-1:] \
            and base.shape[0] >= image.shape[0] and base.shape[1] >= image.shape[1]:
        return base
    return image


@dataclass
class _Staged:
    """What one journal transaction queued, applied (counters, wake-ups) only after its commit."""

    messages: int = 0
    errors: int = 0


class WebhookQueue(Protocol):
    """The webhook outbox as the verdict stage stages into it (`delivery/webhooks.WebhookOutbox`): rows
    on the journal's transaction, tagged with the result's id. The outbox is a sink: the pipeline tells
    it of the committed result (its wake-up); like the MQTT outbox, the stage closes it when it stops."""

    def stage(self, db: sqlite3.Connection, url: str, body: dict[str, Any], key: str, source: str = "",
              timeout_s: float = 5.0, *, result_id: str | None = None) -> int: ...

    def close(self) -> None: ...


class Reasker(Protocol):
    """What a re-ask needs of the loaded model (`inference/inspector.py:Inspector`)."""

    def inspect(self, frame: np.ndarray, *, camera: str = "api", prompt: str | None = None) -> Result: ...


class VerdictServices:
    """Evidence store, rule engine, reviews, and the outboxes (MQTT messages, webhooks) it stages into."""

    def __init__(self, evidence: EvidenceConfig, rules: list[Rule], data_dir: Path, db_path: Path,
                 faults: set[str], get_inspector: Callable[[], Reasker | None], *, webhooks: WebhookQueue,
                 messages: MessageQueue, evidence_overlay: Callable[[np.ndarray, Result], np.ndarray] | None = None,
                 gate: Callable[[], GateDecision] | None = None,
                 keep_undelivered: bool = True, budget: RulesBudget | None = None) -> None:
        self.evidence_cfg = evidence
        self.evidence: EvidenceStore | None = None
        # Draws over the evidence image before it is kept (the anomaly gate's heat map); None: as captured.
        self.evidence_overlay = evidence_overlay
        if evidence.enabled:
            root = evidence.path or data_dir / "evidence"
            try:
                self.evidence = EvidenceStore(evidence, root, db_path, faults, keep_undelivered=keep_undelivered)
            except OSError as exc:  # a config mistake: one clear line, not a traceback
                raise EdgeRuntimeError(f"evidence.path {root}: cannot be used ({exc.strerror or exc})") from None
        self.budget = budget or RulesBudget()
        self.engine = RuleEngine(rules, self.budget.regex_s_per_verdict)
        self.messages = messages  # alerts and reviews for MQTT; built by the wiring (delivery/ sends both)
        self.webhooks = webhooks
        self.reviews = ReviewStore(db_path, self.messages)
        self.get_inspector = get_inspector
        # The governor's gate: a re-ask is a second inference on the inspection thread, so it is
        # skipped (and recorded) while the governor holds the device below its full rate.
        self.gate = gate or OpenGate().decision
        self.reasks = 0
        self.reasks_skipped = 0  # all skipped re-asks: over a rule's reask.max_per_minute or over rules_budget
        self.clock: Callable[[], float] = time.monotonic  # the re-ask window's clock
        self._reask_times: dict[tuple[str, int], deque[float]] = {}  # (rule, action) -> latest re-asks
        self.reasks_budget_skipped = 0  # the part of reasks_skipped over rules_budget (all rules together)
        self.reasks_governor_skipped = 0  # the part of reasks_skipped while the governor throttled
        self._budget_times: deque[float] = deque(maxlen=self.budget.reasks_per_minute)
        self.action_errors = 0
        self._fired: dict[str, list[Rule]] = {}  # result id -> rules, from before to after the journal
        self._staged: tuple[str, _Staged] = ("", _Staged())  # what the last journal transaction queued
        self._lock = threading.Lock()
        self._retention_at = time.monotonic()

    # ---- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        if self.evidence is not None:
            self.evidence.apply_retention()

    def stop(self) -> None:
        self.webhooks.close()
        self.messages.close()
        self.reviews.close()
        if self.evidence is not None:
            self.evidence.close()

    def reload(self, rules: list[Rule], budget: RulesBudget | None = None) -> None:
        self.engine.reload(rules)
        with self._lock:
            if budget is not None:
                self.budget = budget
                self.engine.regex_budget_s = budget.regex_s_per_verdict
                if self._budget_times.maxlen != budget.reasks_per_minute:
                    self._budget_times = deque(self._budget_times, maxlen=budget.reasks_per_minute)
            names = {r.name for r in rules}
            self._reask_times = {k: v for k, v in self._reask_times.items() if k[0] in names}
        log.info("rules: %d loaded", len(rules))

    # ---- around the journal --------------------------------------------------------------------------

    def before_journal(self, image: np.ndarray | None, result: Result) -> None:
        """Keep the evidence, evaluate the rules, run re-asks; never raises."""
        if self.evidence is not None and image is not None:
            try:
                kept = full_frame(image) if self.evidence_cfg.full_frame else image
                offset = crop_offset(image, kept)  # where the model's crop lies in the kept image
                if self.evidence_overlay is not None:  # the anomaly gate's heat map (inference/anomaly/step.py)
                    kept = self.evidence_overlay(kept, result)
                if result.regions and self.evidence_cfg.draw_regions:  # an inspection program's regions
                    kept = draw_regions(kept, result.regions, offset)
                result.evidence = self.evidence.save(kept, result.id, result.verdict)
            except Exception:  # evidence is an extra: the verdict goes on without it
                log.exception("evidence: saving %s failed", result.id)
        try:
            fired = self.engine.evaluate(result.to_dict())
        except Exception:  # a rule bug must not lose the verdict
            log.exception("rules: evaluation failed")
            return
        if not fired:
            return
        records = []
        asked = 0  # re-asks of this verdict, all rules together (rules_budget.reasks_per_verdict)
        for rule in fired:
            record: dict[str, Any] = {"name": rule.name, "actions": [a.type for a in rule.actions]}
            for i, action in enumerate(rule.actions):
                if isinstance(action, ReaskAction) and image is not None:
                    refused = self._reask_refused(rule, i, action, asked)
                    if refused is None:
                        asked += 1
                    record["reask"] = (self._reask(image, result, action) if refused is None
                                       else {"prompt": action.prompt, "skipped": refused})
                if isinstance(action, ReviewAction) and result.review is None:
                    result.review = {"state": "pending", "reason": rule.name, "ts": utc_now()}
            records.append(record)
        result.rules = records
        with self._lock:
            # The worker runs before -> journal -> after for one result at a time; replacing (not adding)
            # keeps this bounded when a journal write fails (disk full) and `after` never comes.
            self._fired = {result.id: fired}

    def in_journal(self, db: sqlite3.Connection, result: Result) -> None:
        """Stage the alerts, webhooks and review marks of the rules that fired, on the journal's
        connection inside the transaction that writes the result: they are durable exactly when the
        result is, so a crash after the commit cannot lose them. A full disk propagates (the journal
        rolls everything back and reports StorageFull); any other failure of one action is rolled back
        to its savepoint and counted, and the result and the other actions go on. A failure that makes
        SQLite roll back the whole transaction propagates: the journal then stores the result alone."""
        with self._lock:
            fired = self._fired.get(result.id, [])
        staged = _Staged()
        try:
            if fired:
                payload = self._alert(result)
                for rule in fired:
                    self._stage(db, rule, result, payload, staged)
        finally:  # counted in after_journal, also when the journal retries the result alone
            with self._lock:
                self._staged = (result.id, staged)

    def after_journal(self, result: Result) -> None:
        """The result and its side effects are committed: wake the MQTT outbox (the webhook outbox
        hears of it as a sink, verdicts/pipeline.py), apply retention now and then."""
        with self._lock:
            self._fired.pop(result.id, None)
            staged_id, staged = self._staged
            self._staged = ("", _Staged())
        if staged_id == result.id:
            self.action_errors += staged.errors
            if staged.messages:
                self.messages.notify()
        if time.monotonic() - self._retention_at > RETENTION_EVERY_S:
            self._retention_at = time.monotonic()
            try:
                if self.evidence is not None:
                    self.evidence.apply_retention()
                self.reviews.apply_retention()
            except Exception:  # retention runs again in a minute
                log.exception("evidence: retention failed")

    def _stage(self, db: sqlite3.Connection, rule: Rule, result: Result, payload: dict[str, Any],
               staged: _Staged) -> None:
        body = {**payload, "rule": rule.name}
        for i, action in enumerate(rule.actions):
            if not isinstance(action, (AlertAction, WebhookAction, ReviewAction)):
                continue
            db.execute("SAVEPOINT action")
            try:
                if isinstance(action, AlertAction):
                    self.messages.stage(db, f"{result.camera}/alert",
                                        json.dumps(body, separators=(",", ":"), ensure_ascii=False))
                    staged.messages += 1
                elif isinstance(action, WebhookAction):
                    self.webhooks.stage(db, str(action.url), body, key=f"{result.id}:{rule.name}:{i}",
                                        source=f"{rule.name}:{i}", timeout_s=action.timeout_s, result_id=result.id)
                else:
                    self.reviews.stage_pending(db, result.id, rule.name, utc_now())
            except sqlite3.Error as exc:
                if is_full(exc):
                    raise  # the whole transaction fails: the verdict is not journaled, nothing is sent
                self._drop_action(db, staged, action, rule)
            except Exception:  # noqa: BLE001 - logged there; one failed action (an oversized alert) must not stop the others
                self._drop_action(db, staged, action, rule)
            else:
                db.execute("RELEASE action")

    @staticmethod
    def _drop_action(db: sqlite3.Connection, staged: _Staged, action: Any, rule: Rule) -> None:
        staged.errors += 1
        log.exception("rules: action %s of %s failed", action.type, rule.name)
        if not db.in_transaction:
            raise  # SQLite rolled the whole transaction back: the journal keeps the result alone
        db.execute("ROLLBACK TO action")
        db.execute("RELEASE action")

    @staticmethod
    def _alert(result: Result) -> dict[str, Any]:
        payload = {"result_id": result.id, "device": result.device, "camera": result.camera, "ts": result.ts,
                   "verdict": result.verdict, "evidence": result.evidence, "rules": result.rules}
        if result.regions is not None:  # an inspection program's: which region failed is the alert's point
            payload["regions"] = result.regions
        return payload

    def _reask_allowed(self, rule: Rule, index: int, action: ReaskAction) -> bool:
        return self._reask_refused(rule, index, action, 0) is None

    def _reask_refused(self, rule: Rule, index: int, action: ReaskAction, asked: int) -> str | None:
        """Why this re-ask is skipped, or None to ask: a sliding 60 s window per re-ask action (at most
        `max_per_minute`, over all cameras), then the budget of all rules together (per verdict and a
        sliding 60 s window). A re-ask is recorded in a window only when it is asked."""
        decision = self.gate()
        if decision.paused or decision.rate_factor < 1.0:
            with self._lock:
                self.reasks_skipped += 1
                self.reasks_governor_skipped += 1
            return "governor: " + ("paused" if decision.paused else f"rate x{decision.rate_factor:g}")
        now = self.clock()
        with self._lock:
            window = self._reask_times.get((rule.name, index))
            if window is None or window.maxlen != action.max_per_minute:  # new, or changed by a reload
                window = self._reask_times[(rule.name, index)] = deque(maxlen=action.max_per_minute)
            if len(window) == window.maxlen and now - window[0] < 60.0:
                self.reasks_skipped += 1
                return f"rate limit: {action.max_per_minute} per minute"
            total = self._budget_times
            if asked >= self.budget.reasks_per_verdict:
                self.reasks_skipped += 1
                self.reasks_budget_skipped += 1
                return f"rules_budget.reasks_per_verdict: {self.budget.reasks_per_verdict}"
            if total.maxlen is not None and len(total) == total.maxlen and now - total[0] < 60.0:
                self.reasks_skipped += 1
                self.reasks_budget_skipped += 1
                return f"rules_budget.reasks_per_minute: {self.budget.reasks_per_minute} per minute"
            window.append(now)
            total.append(now)
            return None

    def _reask(self, image: np.ndarray, result: Result, action: ReaskAction) -> dict[str, Any]:
        """A second question on the same frame, answered now on this (the inspection) thread."""
        t0 = time.perf_counter()
        try:
            inspector = self.get_inspector()
            if inspector is None:
                raise EdgeRuntimeError("no model is loaded")
            second = inspector.inspect(image, camera=result.camera, prompt=action.prompt)
        except Exception as exc:  # noqa: BLE001 - the first verdict stands; the failure is recorded
            return {"prompt": action.prompt, "error": f"{type(exc).__name__}: {exc}"}
        self.reasks += 1
        return {"prompt": action.prompt, "verdict": second.verdict, "text": second.text,
                "ms": round((time.perf_counter() - t0) * 1000, 1)}

    # ---- reporting -----------------------------------------------------------------------------------

    def evidence_file(self, result_id: str, thumbnail: bool = False) -> EvidenceFile | None:
        """A result's kept image (or its thumbnail); None when none was kept, it is gone (the route reads
        the result next, which marks it: `evidence_removal`) or evidence is off. OSError for a file that
        cannot be read or a thumbnail that cannot be made again (a full disk)."""
        store = self.evidence
        found = store.lookup(result_id) if store is not None else None
        if store is None or found is None:
            return None
        if not thumbnail:
            return EvidenceFile(found.path, found.sha256)
        try:
            return EvidenceFile(store.thumbnail(found), found.sha256 + "-t")
        except FileNotFoundError:  # the image went between the lookup and the thumbnail
            return None

    def evidence_removal(self, result_id: str) -> dict[str, Any] | None:
        """The removal (`{at, why}`) of the image a journaled result links, found missing now (marked in
        its row when that can be written); None when it is there, or evidence is off. A read: a store
        that cannot be read now is logged and taken as "nothing found"."""
        if self.evidence is None:
            return None
        try:
            return self.evidence.found_missing(result_id)
        except (sqlite3.Error, OSError) as exc:
            log.warning("evidence: could not check the image of result %s (%s)", result_id, exc)
            return None

    def status(self) -> dict[str, Any]:
        return {
            "evidence": self.evidence.status() if self.evidence is not None else {"enabled": False},
            "rules": {**self.engine.status(), "reasks": self.reasks,
                      "reasks_skipped": self.reasks_skipped, "reasks_budget_skipped": self.reasks_budget_skipped,
                      "reasks_governor_skipped": self.reasks_governor_skipped,
                      "action_errors": self.action_errors,
                      "alerts_backlog": self.messages.backlog(),
                      "messages_dropped": self.messages.dropped_unsent},
            "reviews": self.reviews.counts(),
        }
