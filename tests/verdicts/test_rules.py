"""Rules: validated config, conditions over verdict fields, confidence, debounce, cooldown, reload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edge_runtime.config import parse_config
from edge_runtime.config.rules import Rule, webhook_current
from edge_runtime.core.errors import ConfigError
from edge_runtime.verdicts.rules import RuleEngine


def rule(**kw: Any) -> Rule:
    return Rule.model_validate({"name": "r", "actions": [{"type": "alert"}], **kw})


def result(camera: str = "cam", **verdict: Any) -> dict[str, Any]:
    return {"camera": camera, "verdict": verdict, "timings_ms": {"total": 120.0}}


@pytest.mark.parametrize(("condition", "verdict", "fires"), [
    ({"field": "verdict.defect", "equals": True}, {"defect": True}, True),
    ({"field": "verdict.defect", "equals": True}, {"defect": 1}, False),  # JSON 1 is not true
    ({"field": "verdict.category", "in": ["scratch", "dent"]}, {"category": "dent"}, True),
    ({"field": "verdict.category", "in": ["scratch", "dent"]}, {"category": "none"}, False),
    ({"field": "verdict.confidence", "lt": 0.5}, {"confidence": 0.2}, True),
    ({"field": "verdict.confidence", "gt": 0.5}, {"confidence": 0.2}, False),
    ({"field": "verdict.confidence", "gt": 0.5}, {"confidence": "0.9"}, False),  # a string is no number
    ({"field": "verdict.notes", "regex": "left (edge|side)"}, {"notes": "scratch near the left edge"}, True),
    ({"field": "verdict.notes", "regex": "^right"}, {"notes": "scratch near the left edge"}, False),
    ({"field": "verdict.missing", "equals": None}, {"defect": True}, False),  # an absent field never matches
])
def test_conditions_compare_verdict_fields(condition: dict[str, Any], verdict: dict[str, Any], fires: bool) -> None:
    assert bool(RuleEngine([rule(when=[condition])]).evaluate(result(**verdict))) is fires


def test_fields_outside_the_verdict_can_be_tested() -> None:
    engine = RuleEngine([rule(when=[{"field": "timings_ms.total", "gt": 100}, {"field": "camera", "equals": "a"}])])
    assert engine.evaluate(result("a")) and not engine.evaluate(result("b"))


def test_confidence_threshold() -> None:
    engine = RuleEngine([rule(when=[{"field": "verdict.defect", "equals": True}], min_confidence=0.8)])
    assert not engine.evaluate(result(defect=True, confidence=0.79))
    assert engine.evaluate(result(defect=True, confidence=0.8))


def test_debounce_fires_on_n_of_the_last_m_results_of_each_camera() -> None:
    engine = RuleEngine([rule(when=[{"field": "verdict.defect", "equals": True}], debounce={"count": 2, "of": 3})])
    seen = [bool(engine.evaluate(result("a", defect=d))) for d in (True, False, True, False, False, True)]
    assert seen == [False, False, True, False, False, False]
    # Another camera has its own window: one defect there fires nothing.
    assert not engine.evaluate(result("b", defect=True))
    assert engine.evaluate(result("a", defect=True))  # a: [F, T, T] -> 2 of 3


def test_cooldown_limits_firings_per_camera() -> None:
    engine = RuleEngine([rule(cooldown_s=10)])
    assert engine.evaluate(result(), now=100.0)
    assert not engine.evaluate(result(), now=105.0)
    assert engine.evaluate(result("other"), now=105.0)
    assert engine.evaluate(result(), now=111.0)
    assert engine.status()["fired"] == {"r": 3}


def test_rules_apply_only_to_their_cameras() -> None:
    engine = RuleEngine([rule(cameras=["a"])])
    assert engine.evaluate(result("a")) and not engine.evaluate(result("b"))


def test_reload_keeps_the_window_of_unchanged_rules_and_resets_changed_ones() -> None:
    same = rule(name="same", debounce={"count": 2, "of": 2})
    changed = rule(name="changed", debounce={"count": 2, "of": 2})
    engine = RuleEngine([same, changed])
    engine.evaluate(result())
    engine.reload([same, changed.model_copy(update={"cooldown_s": 1.0})])
    assert [r.name for r in engine.evaluate(result())] == ["same"]


CONFIG = """\
rules:
  - name: scratch
    when:
      - field: verdict.category
        regex: "(unclosed"
    actions:
      - type: alert
"""


@pytest.mark.parametrize(("text", "message"), [
    (CONFIG, "config.yaml:5: rules.0.when.0.regex: Value error, not a valid regular expression"),
    (CONFIG.replace('regex: "(unclosed"', "equals: 1\n        lt: 2"),
     "config.yaml:4: rules.0.when.0: Value error, give exactly one of equals, in, lt, gt, regex"),
    (CONFIG.replace('regex: "(unclosed"', "equals: 1").replace("type: alert", "type: email"),
     "config.yaml:7: rules.0.actions.0: Input tag 'email' found using 'type' does not match"),
    (CONFIG.replace('regex: "(unclosed"', "equals: 1").replace("type: alert", "type: webhook\n        url: ftp://x"),
     "config.yaml:7: rules.0.actions.0.webhook.url: URL scheme should be 'http' or 'https'"),
    (CONFIG.replace('regex: "(unclosed"', "equals: 1") + CONFIG.replace("rules:\n", "").replace(
        'regex: "(unclosed"', "equals: 2"),
     "config.yaml:1: rules: Value error, rule names must be unique; repeated: scratch"),
])
def test_a_wrong_rule_is_one_config_error_naming_its_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(text, "config.yaml")
    assert str(err.value).startswith(message), str(err.value)


def test_a_valid_rules_section_loads() -> None:
    cfg = parse_config(CONFIG.replace('regex: "(unclosed"', "equals: scratch"), "config.yaml")
    assert cfg.rules[0].when[0].equals == "scratch" and cfg.rules[0].actions[0].type == "alert"


def test_firings_of_results_that_never_reached_the_journal_do_not_pile_up(tmp_path: Path) -> None:
    from edge_runtime.config import EvidenceConfig
    from edge_runtime.core.result import FrameInfo, Result
    from edge_runtime.delivery.mqtt.outbox import MessageOutbox
    from edge_runtime.delivery.webhooks import WebhookOutbox
    from edge_runtime.verdicts.stage import VerdictServices

    services = VerdictServices(EvidenceConfig(enabled=False), [rule()], tmp_path, tmp_path / "j.sqlite3", set(),
                               lambda: None, webhooks=WebhookOutbox(tmp_path / "j.sqlite3"),
                               messages=MessageOutbox(tmp_path / "j.sqlite3"))
    for i in range(50):  # the journal write fails every time (disk full): after_journal never runs
        services.before_journal(None, Result(device="d", camera="c", frame=FrameInfo(i, 1, 1), verdict={},
                                             text="", model="m", timings_ms={}, prompt="p"))
    assert len(services._fired) == 1
    services.stop()


def test_a_catastrophic_regex_gives_up_without_stalling_other_threads() -> None:
    """`re` holds the GIL while a pattern like (a|aa)+$ backtracks: the whole daemon froze for 40 s."""
    import threading
    import time

    from edge_runtime.config.rules import Condition
    from edge_runtime.verdicts.rules import condition_holds

    condition = Condition.model_validate({"field": "prompt", "regex": "(a|aa)+$"})
    ticks = 0
    done = threading.Event()

    def heartbeat() -> None:  # stands for /healthz and the camera threads
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    beat = threading.Thread(target=heartbeat)
    beat.start()
    t0 = time.monotonic()
    try:
        assert condition_holds(condition, {"prompt": "a" * 60 + "!"}) is False  # timed out: no match
        elapsed = time.monotonic() - t0
    finally:
        done.set()
        beat.join()
    assert elapsed < 2.0, elapsed
    assert ticks >= 10, ticks  # the other thread kept running meanwhile


def test_webhook_headers_with_line_breaks_are_refused_by_the_config() -> None:
    text = CONFIG.replace('regex: "(unclosed"', "equals: 1").replace(
        "type: alert", 'type: webhook\n        url: http://127.0.0.1:9/\n        headers: {X-A: "a\\r\\nInjected: 1"}')
    with pytest.raises(ConfigError, match="line break"):
        parse_config(text, "config.yaml")


def test_a_queued_webhook_is_current_only_while_its_rule_action_still_posts_to_its_url() -> None:
    text = CONFIG.replace('regex: "(unclosed"', "equals: 1").replace(
        "type: alert", "type: webhook\n        url: http://127.0.0.1:9/hook")
    rules = parse_config(text, "config.yaml").rules
    source = f"{rules[0].name}:0"
    assert webhook_current(rules, source, "http://127.0.0.1:9/hook")
    assert not webhook_current(rules, source, "http://127.0.0.1:9/old")  # the URL was corrected since
    assert not webhook_current(rules, "removed:0", "http://127.0.0.1:9/hook")  # the rule is gone
    assert not webhook_current(rules, f"{rules[0].name}:7", "http://127.0.0.1:9/hook")
