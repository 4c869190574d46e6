"""A re-ask runs a second generation on the inspection thread before the journal write, so it is rate
bounded per action: a rule that fires on every frame cannot double the line's generation work."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_runtime.config.rules import Rule
from edge_runtime.inference.inspector import Inspector
from tests.verdicts.test_side_effects import Line, make_result


def test_a_rule_that_fires_on_every_frame_re_asks_at_most_max_per_minute(tmp_path: Path,
                                                                          inspector: Inspector) -> None:
    line = Line(tmp_path / "j.sqlite3", inspector=inspector,
                actions=[{"type": "reask", "prompt": "Is a part missing?", "max_per_minute": 2}])
    image = np.full((64, 64, 3), 128, np.uint8)
    try:
        results = [make_result(i) for i in range(5)]
        for r in results:
            line.deliver(r, image)
        asked = [r.rules[0]["reask"] for r in results]  # type: ignore[index]
        assert ["verdict" in a for a in asked] == [True, True, False, False, False]
        assert asked[2]["skipped"] == "rate limit: 2 per minute"
        status = line.services.status()["rules"]
        assert status["reasks"] == 2 and status["reasks_skipped"] == 3
    finally:
        line.close()


def test_reask_max_per_minute_is_validated() -> None:
    from pydantic import ValidationError

    for bad in (0, 601, "many"):
        with pytest.raises(ValidationError, match="max_per_minute"):
            Rule.model_validate({"name": "r", "actions": [{"type": "reask", "prompt": "p", "max_per_minute": bad}]})
    default = Rule.model_validate({"name": "r", "actions": [{"type": "reask", "prompt": "p"}]})
    assert default.actions[0].max_per_minute == 6  # type: ignore[union-attr]


def test_the_re_ask_window_slides_a_minute_after_each_ask(tmp_path: Path) -> None:
    line = Line(tmp_path / "j.sqlite3", actions=[{"type": "reask", "prompt": "p", "max_per_minute": 2}])
    rule = line.services.engine.rules[0]
    action = rule.actions[0]
    now = [1000.0]
    line.services.clock = lambda: now[0]
    try:
        allowed = []
        for t in (0, 1, 2, 59.9, 60.5, 61.5, 62):
            now[0] = 1000.0 + t
            allowed.append(line.services._reask_allowed(rule, 0, action))  # type: ignore[arg-type]
        # Asks at 0 and 1; 2 and 59.9 fall in their minute; 60.5 and 61.5 are a minute after them.
        assert allowed == [True, True, False, False, True, True, False]
    finally:
        line.close()
