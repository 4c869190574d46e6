"""Output rails fail closed on what they could not check: a long field, a schema's patterns, a schema
that never ends. The evaluator on its own (`api/rails/engine.Rails`), on answers a test could not make the
demo model write (10,000 characters of one field, arrays of hostile strings)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from edge_runtime.api.rails.engine import Rails, ReaskWindow
from edge_runtime.api.rails.request import Answer, RailRefused, RailRequest, TextPart
from edge_runtime.config import RailsConfig


def rails(**section: Any) -> tuple[Rails, list[tuple[str, ...]]]:
    fired: list[tuple[str, ...]] = []
    return Rails(RailsConfig.model_validate(section), ReaskWindow(), lambda *a: fired.append(a)), fired


def test_a_when_regex_reads_the_whole_field_not_its_first_10000_characters() -> None:
    rail, _ = rails(output=[{"name": "secret", "when": [{"field": "notes", "regex": "hunter2"}]}])
    short = Answer(json.dumps({"notes": "seam ok hunter2"}))
    long = Answer(json.dumps({"notes": "x" * 20_000 + " hunter2"}))  # within max_scan_chars (65,536)
    for answer in (short, long):
        with pytest.raises(RailRefused) as caught:
            rail.check_output(answer, None, "req-1")
        assert caught.value.code == "rail_output_secret"
    clean = Answer(json.dumps({"notes": "x" * 20_000}))
    assert rail.check_output(clean, None, "req-2") is clean


def test_a_when_filter_redacts_a_match_past_10000_characters() -> None:
    rail, fired = rails(output=[{"name": "secret", "when": [{"field": "notes", "regex": "hunter2"}],
                                 "action": "filter", "replacement": "***"}])
    sent = rail.check_output(Answer(json.dumps({"notes": "x" * 20_000 + " hunter2", "defect": True})), None, "r")
    assert json.loads(sent.text) == {"notes": "***", "defect": True}
    assert [f[:2] for f in fired] == [("rail_output_secret", "filter")]


# `(a|a)+$` backtracks exponentially on `aaa…!` and the regex engine overshoots its time limit ~3x.
HOSTILE = {"type": "array", "items": {"anyOf": [{"type": "string", "pattern": "^(a|a)+$"}, {"type": "string"}]}}


def test_schema_patterns_share_the_requests_regex_budget() -> None:
    """40 strings each given their own 50 ms limit took ~5 s and passed; within the 250 ms budget the
    check runs out and refuses."""
    rail, _ = rails(output=[{"name": "shape", "json_schema": HOSTILE}], regex_budget_ms=250)
    started = time.monotonic()
    with pytest.raises(RailRefused) as caught:
        rail.check_output(Answer(json.dumps(["a" * 30 + "!"] * 40)), None, "req-3")
    took = time.monotonic() - started
    assert caught.value.code == "rail_output_shape" and "did not finish" in str(caught.value)
    assert took < 2.0, f"the schema check took {took:.2f} s against a 0.25 s budget"


def test_a_schema_pattern_that_did_not_finish_is_not_a_pass_under_not() -> None:
    """`not: {pattern}` passed every answer whose search timed out (a timeout was "no match")."""
    schema = {"type": "array", "items": {"not": {"type": "string", "pattern": "^(a|a)+$"}}}
    rail, _ = rails(output=[{"name": "shape", "json_schema": schema}])
    with pytest.raises(RailRefused) as caught:
        rail.check_output(Answer(json.dumps(["a" * 30 + "!"])), None, "req-4")
    assert "did not finish" in str(caught.value)
    ok = Answer(json.dumps(["b"]))
    assert rail.check_output(ok, None, "req-5") is ok


def test_a_schema_that_refers_to_itself_refuses_instead_of_raising() -> None:
    rail, _ = rails(output=[{"name": "loop", "json_schema": {"$ref": "#"}}])
    with pytest.raises(RailRefused) as caught:  # was a RecursionError: a 500 on every answer
        rail.check_output(Answer('{"a": 1}'), None, "req-6")
    assert caught.value.code == "rail_output_loop" and caught.value.status == 422


@pytest.mark.parametrize("text", ["sab\u200botage the line", "ｓａｂｏｔａｇｅ the line", "sab\u00adotage",
                                  "pass\u200dword: x", "ｐａｓｓｗｏｒｄ: x"])
def test_input_words_and_regexes_see_through_zero_width_and_fullwidth_text(text: str) -> None:
    rail, _ = rails(input=[{"name": "banned", "words": ["sabotage"]}, {"name": "pw", "regex": "(?i)password"}])
    with pytest.raises(RailRefused) as caught:
        rail.check_input(RailRequest("r", [TextPart("messages.0.content", "user", text)], 0, "m", "text", None))
    assert caught.value.code in ("rail_input_banned", "rail_input_pw") and caught.value.field == "messages.0.content"
    fine = RailRequest("r", [TextPart("messages.0.content", "user", "ｃｈｅｃｋ the seam\u200b")], 0, "m", "text", None)
    assert rail.check_input(fine).texts == {}


def test_output_rails_see_through_zero_width_text_and_a_filter_that_cannot_redact_it_refuses() -> None:
    rail, _ = rails(output=[{"name": "leak", "regex": "hunter2"}])
    with pytest.raises(RailRefused) as caught:
        rail.check_output(Answer("the password is hunter\u200b2"), None, "r")
    assert caught.value.code == "rail_output_leak"
    rail, _ = rails(output=[{"name": "leak", "regex": "hunter2", "action": "filter"}])
    assert rail.check_output(Answer("it is hunter2"), None, "r").text == "it is [redacted]"
    with pytest.raises(RailRefused) as caught:  # the raw text has no match to redact: never sent as is
        rail.check_output(Answer("it is ｈｕｎｔｅｒ2"), None, "r")
    assert "still breaks the rail after redaction" in str(caught.value)
    clean = Answer("ｃｈｅｃｋ the seam")
    assert rail.check_output(clean, None, "r") is clean


def test_a_reasked_answer_carries_its_own_finish_reason_and_both_usages() -> None:
    from edge_runtime.api.rails.http import checked_chat
    from edge_runtime.inference.llm.feed import Generation

    def gen(text: str, finish: str, tokens: int) -> Generation:
        return Generation(text, tokens, 10, 0.0, 0.0, finish, 0)
    rail, _ = rails(output=[{"name": "scrap", "regex": "scrap", "action": "reask", "reask": {"prompt": "again"}}])
    asked: list[str] = []

    def regenerate(instruction: str) -> Generation:
        asked.append(instruction)
        return gen("keep", "stop", 2)
    text, usage, finish = checked_chat(rail, gen("scrap scrap scr", "length", 8), regenerate, "r")
    assert (text, finish, asked) == ("keep", "stop", ["again"])  # the first one's "length" was sent
    assert usage == {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30}
