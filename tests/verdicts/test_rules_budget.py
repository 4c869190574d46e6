"""Rules share one budget: regex time per verdict over all rules, and re-asks per minute over all
rules (the per-rule limits alone let 100 rules multiply a verdict's cost)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from edge_runtime.config import EvidenceConfig, parse_config
from edge_runtime.config.rules import Rule, RulesBudget
from edge_runtime.core.errors import ConfigError
from edge_runtime.delivery.mqtt.outbox import MessageOutbox
from edge_runtime.delivery.webhooks import WebhookOutbox
from edge_runtime.verdicts.rules import RuleEngine
from edge_runtime.verdicts.stage import VerdictServices

CATASTROPHIC = r"(a+)+$"


def result(prompt: str) -> dict[str, object]:
    return {"camera": "cam", "prompt": prompt, "verdict": {"defect": True}}


def test_100_catastrophic_regexes_stay_within_the_verdict_budget() -> None:
    rules = [Rule.model_validate({"name": f"r{i}", "when": [{"field": "prompt", "regex": CATASTROPHIC}],
                                  "actions": [{"type": "review"}]}) for i in range(100)]
    engine = RuleEngine(rules, regex_budget_s=0.1)
    engine.evaluate(result("a" * 10 + "!"))  # warm up (compiles the pattern)
    t0 = time.perf_counter()
    fired = engine.evaluate(result("a" * 199 + "!"))
    took = time.perf_counter() - t0
    assert fired == []
    assert took < 0.3, f"100 catastrophic regexes took {took:.2f} s (budget 0.1 s)"
    status = engine.status()
    assert status["regex_timeouts"] + status["regex_budget_exhausted"] >= 50, status


def test_a_cheap_regex_after_a_catastrophic_one_still_gets_its_share() -> None:
    rules = [Rule.model_validate({"name": "bad", "when": [{"field": "prompt", "regex": CATASTROPHIC}],
                                  "actions": [{"type": "review"}]}),
             Rule.model_validate({"name": "good", "when": [{"field": "prompt", "regex": "a!"}],
                                  "actions": [{"type": "review"}]})]
    engine = RuleEngine(rules, regex_budget_s=0.1)
    assert [r.name for r in engine.evaluate(result("a" * 199 + "!"))] == ["good"]


def reask_rules(n: int, actions: int, per_action: int) -> list[Rule]:
    return [Rule.model_validate({"name": f"r{i}", "actions": [
        {"type": "reask", "prompt": f"q{j}", "max_per_minute": per_action} for j in range(actions)]})
        for i in range(n)]


class Second:
    def inspect(self, frame: np.ndarray, *, camera: str = "api", prompt: str | None = None) -> Any:
        return SimpleNamespace(verdict={"ok": True}, text="{}")


def test_re_asks_of_all_rules_together_stay_within_rules_budget(tmp_path: Path) -> None:
    from tests.verdicts.test_side_effects import make_result

    db = tmp_path / "j.sqlite3"
    services = VerdictServices(EvidenceConfig(enabled=False), reask_rules(10, 8, 600), tmp_path, db, set(),
                               lambda: Second(), webhooks=WebhookOutbox(db), messages=MessageOutbox(db),
                               budget=RulesBudget(reasks_per_minute=6, reasks_per_verdict=8))
    image = np.full((8, 8, 3), 1, np.uint8)
    try:
        for i in range(20):
            services.before_journal(image, make_result(i))
        status = services.status()["rules"]
        assert status["reasks"] == 6, status
        assert status["reasks_budget_skipped"] == status["reasks_skipped"] == 20 * 80 - 6, status
    finally:
        services.stop()


BASE = "rules:\n"


def rule_yaml(i: int, reask: str = "", regexes: int = 0) -> str:
    when = "".join(f"      - {{field: prompt, regex: 'x{j}'}}\n" for j in range(regexes))
    return (f"  - name: r{i}\n" + (f"    when:\n{when}" if when else "") +
            f"    actions:\n      - {{type: reask, prompt: p{reask}}}\n")


def test_a_configuration_the_budget_cannot_meet_is_refused_naming_the_key() -> None:
    ok = parse_config(BASE + rule_yaml(0))
    assert ok.rules_budget.reasks_per_minute == 6 and ok.rules_budget.regex_s_per_verdict == 0.1
    # A re-ask action allowed more per minute than all rules together may ask.
    with pytest.raises(ConfigError, match=r"rules\.0\.actions\.0\.max_per_minute.*rules_budget\.reasks_per_minute"):
        parse_config(BASE + rule_yaml(0, reask=", max_per_minute: 7"))
    # Raising the budget makes it acceptable.
    parse_config("rules_budget: {reasks_per_minute: 7}\n" + BASE + rule_yaml(0, reask=", max_per_minute: 7"))
    # More regex conditions than the per-verdict budget can give 1 ms each.
    many = BASE + "".join(rule_yaml(i, regexes=30) for i in range(4))
    with pytest.raises(ConfigError, match=r"rules_budget\.regex_s_per_verdict"):
        parse_config(many)
    parse_config("rules_budget: {regex_s_per_verdict: 0.2}\n" + many)
    # More re-ask actions in one rule than one verdict may ask.
    two = BASE + "  - name: r\n    actions:\n" + "".join(f"      - {{type: reask, prompt: p{j}}}\n" for j in range(3))
    with pytest.raises(ConfigError, match=r"rules\.0\.actions.*rules_budget\.reasks_per_verdict"):
        parse_config(two)


def test_re_asks_wait_while_the_governor_throttles_and_resume_at_full_rate(tmp_path: Path) -> None:
    from edge_runtime.core.governor_gate import GateDecision
    from tests.verdicts.test_side_effects import make_result

    services = VerdictServices(EvidenceConfig(enabled=False), reask_rules(1, 1, 60), tmp_path,
                               tmp_path / "j.sqlite3", set(), lambda: Second(),
                               webhooks=WebhookOutbox(tmp_path / "j.sqlite3"),
                               messages=MessageOutbox(tmp_path / "j.sqlite3"))
    decision = GateDecision(rate_factor=0.5)
    services.gate = lambda: decision
    image = np.full((8, 8, 3), 1, np.uint8)
    try:
        throttled = make_result(0)
        services.before_journal(image, throttled)
        assert throttled.rules is not None and throttled.rules[0]["reask"]["skipped"] == "governor: rate x0.5"
        decision = GateDecision(paused=True)
        services.before_journal(image, make_result(1))
        decision = GateDecision()
        asked = make_result(2)
        services.before_journal(image, asked)
        assert asked.rules is not None and asked.rules[0]["reask"]["verdict"] == {"ok": True}
        status = services.status()["rules"]
        assert status["reasks"] == 1 and status["reasks_governor_skipped"] == 2, status
    finally:
        services.stop()
