"""The rules' evaluator: a rule fires when all its conditions hold for a result (fields by dotted path:
`verdict.category`, `camera`, `timings_ms.total`), its confidence threshold is met, and — with
debounce — when it matched on at least N of the last M results of that camera. Its actions are
carried out by the verdict stage (`verdicts/stage.py`): an MQTT alert, a webhook, a second question on the
same frame, a review mark. The rules themselves are config (`config/rules.py`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

import regex

from edge_runtime.config.rules import REGEX_BUDGET_S, REGEX_TIMEOUT_S, Condition, Rule, regex_conditions

log = logging.getLogger(__name__)
_MISSING = object()
_timeouts_logged: dict[str, float] = {}


class RegexBudget:
    """The regex time one verdict may spend over all rules. Each search gets at most its fair share of
    what is left (left / conditions still to come) and never over REGEX_TIMEOUT_S, so the total stays
    within `total_s` and one catastrophic pattern cannot starve the conditions after it."""

    def __init__(self, total_s: float, conditions: int) -> None:
        self.deadline = time.monotonic() + total_s
        self.left = max(conditions, 1)
        self.exhausted = 0  # conditions counted as no match because the budget was spent
        self.timeouts = 0

    def timeout(self) -> float | None:
        """This search's time limit, or None when the budget is spent (the condition is no match)."""
        remaining = self.deadline - time.monotonic()
        share = min(REGEX_TIMEOUT_S, remaining / max(self.left, 1))
        self.left = max(self.left - 1, 1)
        if share < 1e-4:
            self.exhausted += 1
            return None
        return share


def condition_holds(cond: Condition, result: dict[str, Any], budget: RegexBudget | None = None) -> bool:
    """Whether one condition holds for a result (a missing field never holds)."""
    value = lookup(result, cond.field)
    if value is _MISSING:
        return False
    if "equals" in cond.model_fields_set:
        return _same(value, cond.equals)
    if cond.in_ is not None:
        return any(_same(value, v) for v in cond.in_)
    if cond.regex is not None:
        return isinstance(value, str) and _search(cond.regex, value[:10_000], cond.field, budget)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    return value < cond.lt if cond.lt is not None else value > (cond.gt if cond.gt is not None else 0)


def _search(pattern: str, text: str, field: str, budget: RegexBudget | None = None) -> bool:
    """A regex search that cannot stall the daemon: Python's `re` holds the GIL for as long as a
    catastrophic pattern backtracks (every thread stops, /healthz included). The `regex` engine
    releases the GIL (`concurrent`) and gives up after a time limit; a search that times out is false.
    With a budget, the limit is the search's share of the verdict's regex budget; a spent budget is false."""
    limit = REGEX_TIMEOUT_S if budget is None else budget.timeout()
    if limit is None:
        _log_once("budget", "rules: the regex budget of this verdict was spent; regex %r on %s and the "
                  "regex conditions after it count as no match (rules_budget.regex_s_per_verdict)", pattern, field)
        return False
    try:
        return regex.search(pattern, text, timeout=limit, concurrent=True) is not None
    except TimeoutError:
        if budget is not None:
            budget.timeouts += 1
        _log_once(pattern, "rules: the regex %r on %s took over %.3f s and counts as no match; simplify it",
                  pattern, field, limit)
        return False


def _log_once(key: str, message: str, *args: Any) -> None:
    """One line a minute per key (a pattern, or the spent budget); bounded: at most 256 keys."""
    now = time.monotonic()
    if now - _timeouts_logged.get(key, -1e9) > 60:
        if len(_timeouts_logged) >= 256:
            _timeouts_logged.clear()
        _timeouts_logged[key] = now
        log.warning(message, *args)


def _same(a: Any, b: Any) -> bool:
    # JSON true must not equal 1: compare booleans only with booleans.
    return (isinstance(a, bool) == isinstance(b, bool)) and a == b


def lookup(data: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(data, dict) or part not in data:
            return _MISSING
        data = data[part]
    return data


class RuleEngine:
    """Evaluates every rule on every result; keeps each camera's debounce window. Thread-safe."""

    def __init__(self, rules: list[Rule], regex_budget_s: float = REGEX_BUDGET_S) -> None:
        self._lock = threading.Lock()
        self.regex_budget_s = regex_budget_s
        self.regex_exhausted = 0  # regex conditions counted as no match: the verdict's budget was spent
        self.regex_timeouts = 0  # regex searches that ran out of their share
        self.rules: list[Rule] = []
        self._history: dict[tuple[str, str], deque[bool]] = {}
        self._last_fired: dict[tuple[str, str], float] = {}
        self.fired: dict[str, int] = {}
        self.reload(rules)

    def reload(self, rules: list[Rule]) -> None:
        """New rules (SIGHUP); an unchanged rule keeps its debounce window and counters."""
        with self._lock:
            old = {r.name: r for r in self.rules}
            keep = {r.name for r in rules if old.get(r.name) == r}
            self._history = {k: v for k, v in self._history.items() if k[0] in keep}
            self._last_fired = {k: v for k, v in self._last_fired.items() if k[0] in keep}
            self.rules = list(rules)
            for r in rules:
                self.fired.setdefault(r.name, 0)

    def evaluate(self, result: dict[str, Any], now: float | None = None) -> list[Rule]:
        """The rules that fire for this result (in config order); updates windows and counters."""
        now = time.monotonic() if now is None else now
        camera = str(result.get("camera", ""))
        fired: list[Rule] = []
        with self._lock:
            budget = RegexBudget(self.regex_budget_s, regex_conditions(self.rules))
            try:
                self._evaluate(result, camera, now, budget, fired)
            finally:
                self.regex_exhausted += budget.exhausted
                self.regex_timeouts += budget.timeouts
        return fired

    def _evaluate(self, result: dict[str, Any], camera: str, now: float, budget: RegexBudget,
                  fired: list[Rule]) -> None:
        for rule in self.rules:
            if not rule.enabled or (rule.cameras and camera not in rule.cameras):
                continue
            matched = all(condition_holds(c, result, budget) for c in rule.when) and self._confident(rule, result)
            key = (rule.name, camera)
            if rule.debounce is not None:
                window = self._history.setdefault(key, deque(maxlen=rule.debounce.of))
                window.append(matched)
                matched = matched and sum(window) >= rule.debounce.count
            if not matched:
                continue
            last = self._last_fired.get(key)
            if last is not None and now - last < rule.cooldown_s:
                continue
            self._last_fired[key] = now
            self.fired[rule.name] = self.fired.get(rule.name, 0) + 1
            fired.append(rule)

    @staticmethod
    def _confident(rule: Rule, result: dict[str, Any]) -> bool:
        if rule.min_confidence is None:
            return True
        value = lookup(result, rule.confidence_field)
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= rule.min_confidence

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"rules": [r.name for r in self.rules], "fired": dict(self.fired),
                    "regex_budget_exhausted": self.regex_exhausted, "regex_timeouts": self.regex_timeouts}
