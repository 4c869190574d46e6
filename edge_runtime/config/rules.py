"""The `rules:` and `rules_budget:` sections: what a rule tests, what it does, and what all rules
together may cost. Validated at load; the evaluator is `verdicts/rules.py`."""

from __future__ import annotations

from typing import Annotated, Literal

import regex
from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator, model_validator

from edge_runtime.config.base import check_regex

REGEX_TIMEOUT_S = 0.05  # per search at most; the `regex` engine checks it as it goes
REGEX_BUDGET_S = 0.1  # all regex searches of one verdict together (rules_budget.regex_s_per_verdict)
MIN_SEARCH_S = 0.001  # a configuration must leave each regex condition at least this share of the budget


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
        return check_regex(v)


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


def regex_conditions(rules: list[Rule]) -> int:
    """Regex conditions of the enabled rules: what one verdict's regex budget is shared among."""
    return sum(1 for r in rules if r.enabled for c in r.when if c.regex is not None)


def webhook_action(rules: list[Rule], source: str) -> WebhookAction | None:
    """The rule action (`<rule>:<index>`) that queued a webhook, in the running config; None when that rule
    or action is gone (or is no longer a webhook)."""
    name, _, index = source.rpartition(":")
    for rule in rules:
        if rule.name == name and index.isdigit() and int(index) < len(rule.actions):
            action = rule.actions[int(index)]
            return action if isinstance(action, WebhookAction) else None
    return None


def webhook_headers(rules: list[Rule], source: str) -> dict[str, str]:
    """Headers of the rule action that queued a webhook, from the running config (secrets are not written
    to the outbox). A rule removed since then sends none."""
    action = webhook_action(rules, source)
    return dict(action.headers) if action is not None else {}


def webhook_current(rules: list[Rule], source: str, url: str) -> bool:
    """Whether the running config still has the rule action that queued a webhook, with the same URL: only
    then can a fix there (a header, the receiver's own) deliver a row its receiver refuses now."""
    action = webhook_action(rules, source)
    return action is not None and str(action.url) == url
