"""Rules that act on verdicts: validated `rules:` config models and the evaluator.

A rule fires when all its conditions hold for a result (fields by dotted path: `verdict.category`,
`camera`, `timings_ms.total`), its confidence threshold is met, and — with debounce — when it matched
on at least N of the last M results of that camera. Its actions are carried out by the wiring
(`verdicts.py`): an MQTT alert, a webhook, a second question on the same frame, a review mark.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Annotated, Any, Literal

import regex
from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator, model_validator

log = logging.getLogger(__name__)
_MISSING = object()
REGEX_TIMEOUT_S = 0.05  # per search at most; the `regex` engine checks it as it goes
REGEX_BUDGET_S = 0.1  # all regex searches of one verdict together (rules_budget.regex_s_per_verdict)
MIN_SEARCH_S = 0.001  # a configuration must leave each regex condition at least this share of the budget
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


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


_PATH = r"^[A-Za-z0-9_]{1,64}(\.[A-Za-z0-9_]{1,64}){0,4}$"


class Condition(_Model):
    """One test on a result field; exactly one operator."""

    field: str = Field(pattern=_PATH, description="Dotted path into the result, e.g. verdict.category.")
    equals: str | int | float | bool | None = Field(None, description="Field equals this value.")
    in_: list[str | int | float | bool] | None = Field(None, alias="in", max_length=256,
                                                       description="Field is one of these values.")
    lt: float | None = Field(None, description="Field is a number less than this.")
    gt: float | None = Field(None, description="Field is a number greater than this.")
    regex: str | None = Field(None, max_length=200, description="Field is a string this regex searches.")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _one_operator(self) -> Condition:
        given = [k for k in ("equals", "in_", "lt", "gt", "regex") if k in self.model_fields_set]
        if len(given) != 1:
            raise ValueError("give exactly one of equals, in, lt, gt, regex")
        return self

    @field_validator("regex")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                regex.compile(v)
            except regex.error as exc:
                raise ValueError(f"not a valid regular expression: {exc}") from None
        return v

    def holds(self, result: dict[str, Any], budget: RegexBudget | None = None) -> bool:
        value = lookup(result, self.field)
        if value is _MISSING:
            return False
        if "equals" in self.model_fields_set:
            return _same(value, self.equals)
        if self.in_ is not None:
            return any(_same(value, v) for v in self.in_)
        if self.regex is not None:
            return isinstance(value, str) and _search(self.regex, value[:10_000], self.field, budget)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False
        return value < self.lt if self.lt is not None else value > (self.gt if self.gt is not None else 0)


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


class Debounce(_Model):
    count: int = Field(ge=1, le=100, description="Fire when the conditions held this many times …")
    of: int = Field(ge=1, le=100, description="… within the last this many results of the camera.")

    @model_validator(mode="after")
    def _fits(self) -> Debounce:
        if self.count > self.of:
            raise ValueError("debounce.count cannot be larger than debounce.of")
        return self


class AlertAction(_Model):
    type: Literal["alert"] = Field(description="Publish on <prefix>/<camera>/alert (QoS 1, from the journal).")


class WebhookAction(_Model):
    type: Literal["webhook"] = Field(description="POST the alert to a URL, at least once.")
    url: HttpUrl = Field(description="POST the alert as JSON here, at least once (the outbox retries).")
    headers: dict[str, str] = Field(default_factory=dict, max_length=16,
                                    description="Extra request headers (e.g. an Authorization with ${ENV}).")
    timeout_s: float = Field(5, gt=0, le=60, description="Per-attempt timeout.")

    @field_validator("headers")
    @classmethod
    def _valid_headers(cls, v: dict[str, str]) -> dict[str, str]:
        # A header the HTTP client refuses at send time would fail every delivery, forever.
        for name, value in v.items():
            if not _HEADER_NAME.fullmatch(name):
                raise ValueError(f"header name {name[:40]!r} is not a valid HTTP header name")
            if any(c in value for c in "\r\n\0") or len(value) > 4096:
                raise ValueError(f"header {name!r}: the value has a line break or NUL, or is over 4096 characters")
        return v


_HEADER_NAME = regex.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}")


class ReaskAction(_Model):
    type: Literal["reask"] = Field(description="Ask a second question about the same frame.")
    prompt: str = Field(min_length=1, max_length=2000, description="Second question on the same frame; "
                        "its answer is attached to the firing.")
    # A re-ask is a second generation on the inspection thread, before the journal write: a rule that
    # fires on every frame would halve the line's throughput. Beyond this rate it is skipped and counted.
    max_per_minute: int = Field(6, ge=1, le=600, description="At most this many re-asks of this action "
                                "in any 60 s (all cameras together); more are skipped and counted.")


class ReviewAction(_Model):
    type: Literal["review"] = Field(description="Put the result in the review queue.")


Action = Annotated[AlertAction | WebhookAction | ReaskAction | ReviewAction, Field(discriminator="type")]


class Rule(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,48}$", description="Rule name (in results and metrics).")
    enabled: bool = Field(True, description="false keeps the rule but never evaluates it.")
    cameras: list[str] = Field(default_factory=list, description="Only these cameras (empty: all).")
    when: list[Condition] = Field(default_factory=list, max_length=32,
                                  description="Conditions that must all hold.")
    min_confidence: float | None = Field(None, ge=0, le=1, description="Also require confidence >= this.")
    confidence_field: str = Field("verdict.confidence", pattern=_PATH,
                                  description="Where the confidence is read for min_confidence.")
    debounce: Debounce | None = Field(None, description="Fire only when matched N of the last M results.")
    cooldown_s: float = Field(0, ge=0, le=86400, description="Least seconds between two firings per camera.")
    actions: list[Action] = Field(min_length=1, max_length=8, description="What happens when it fires.")


class RulesBudget(_Model):
    """What all rules together may cost (`rules_budget:`): the per-rule limits alone let 100 rules
    multiply every verdict's cost."""

    reasks_per_minute: int = Field(6, ge=1, le=600, description="Re-asks of all rules together in any 60 s; "
                                   "more are skipped and counted (edge_rule_reasks_budget_skipped).")
    reasks_per_verdict: int = Field(1, ge=1, le=8, description="Re-asks of all rules together for one verdict.")
    regex_s_per_verdict: float = Field(REGEX_BUDGET_S, ge=0.005, le=2, description="Seconds all regex "
                                       "conditions of one verdict may search together; once spent, the rest "
                                       "count as no match (counted: edge_rule_regex_budget_exhausted).")

    def check(self, rules: list[Rule]) -> None:
        """Refuse rules this budget cannot serve; the message starts with the key to change."""
        for i, rule in enumerate(rules):
            reasks = [(j, a) for j, a in enumerate(rule.actions) if isinstance(a, ReaskAction)]
            if len(reasks) > self.reasks_per_verdict:
                raise ValueError(f"rules.{i}.actions: {len(reasks)} re-asks, but rules_budget.reasks_per_verdict "
                                 f"is {self.reasks_per_verdict}; raise it or remove re-asks")
            for j, action in reasks:
                if action.max_per_minute > self.reasks_per_minute:
                    raise ValueError(f"rules.{i}.actions.{j}.max_per_minute: {action.max_per_minute} is above "
                                     f"rules_budget.reasks_per_minute ({self.reasks_per_minute}) and can never "
                                     "be reached; raise the budget or lower this")
        n = regex_conditions(rules)
        if n and self.regex_s_per_verdict / n < MIN_SEARCH_S:
            raise ValueError(f"rules_budget.regex_s_per_verdict: {self.regex_s_per_verdict} s shared by {n} regex "
                             f"conditions leaves each under {MIN_SEARCH_S * 1000:.0f} ms; raise it to at least "
                             f"{n * MIN_SEARCH_S:.3f} or use fewer regex conditions")


def validate_rules(rules: list[Rule]) -> list[Rule]:
    names = [r.name for r in rules]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"rule names must be unique; repeated: {', '.join(dupes)}")
    return rules


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
            matched = all(c.holds(result, budget) for c in rule.when) and self._confident(rule, result)
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


def regex_conditions(rules: list[Rule]) -> int:
    """Regex conditions of the enabled rules: what one verdict's regex budget is shared among."""
    return sum(1 for r in rules if r.enabled for c in r.when if c.regex is not None)
