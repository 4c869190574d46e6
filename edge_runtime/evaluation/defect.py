"""Which verdicts mean "reject this part": an expression (`verdict.defect == true`) or a rule's conditions.

Both become rule `Condition`s evaluated by `verdicts.rules.condition_holds`, the daemon's own
evaluator, so the eval's defect decision is the one the line's rules make. A label or verdict that
lacks a field the decision reads is "unknown" (left out of the defect metrics, and counted).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from edge_runtime.config.rules import Condition, Rule
from edge_runtime.core.errors import EdgeRuntimeError
from edge_runtime.verdicts.rules import condition_holds, lookup

_TERM = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(==|!=|<|>|\bin\b|~)\s*(.+?)\s*$")
_MISSING = lookup({}, "x")  # the evaluator's own "missing field" marker


@dataclass(frozen=True)
class DefectRule:
    """All `conditions` hold (each possibly negated) means defect. `text` is how the user wrote it."""

    text: str
    conditions: tuple[tuple[Condition, bool], ...]  # (condition, negated)

    def fields(self) -> list[str]:
        return [c.field for c, _ in self.conditions]

    def holds(self, verdict: dict[str, Any]) -> bool | None:
        """Defect (True), good (False), or None when a field the decision reads is missing."""
        doc = {"verdict": verdict}
        for cond, _ in self.conditions:
            if lookup(doc, cond.field) is _MISSING:
                return None
        return all(condition_holds(cond, doc) != negated for cond, negated in self.conditions)

    def pass_condition(self) -> dict[str, Any] | None:
        """The rule condition meaning "the model passed the part", when one condition can say it."""
        if len(self.conditions) != 1:
            return None
        cond, negated = self.conditions[0]
        if "equals" in cond.model_fields_set and isinstance(cond.equals, bool):
            return {"field": cond.field, "equals": cond.equals == negated}
        if "equals" in cond.model_fields_set and negated:
            return {"field": cond.field, "equals": cond.equals}
        return None


def parse_defect(text: str) -> DefectRule:
    """`FIELD == VALUE`, `!=`, `<`, `>`, `in [..]`, `~ REGEX`, joined by `and`; fields start `verdict.`."""
    if len(text) > 1000:
        raise EdgeRuntimeError("--defect: longer than 1000 characters")
    conds: list[tuple[Condition, bool]] = []
    for part in re.split(r"\s+and\s+", text.strip()):
        m = _TERM.match(part)
        if not m:
            raise EdgeRuntimeError(f"--defect: {part!r} is not FIELD == VALUE (also !=, <, >, in [..], ~ REGEX)")
        field, op, raw = m.groups()
        if not field.startswith("verdict."):
            field = f"verdict.{field}"
        value = _value(raw)
        spec: dict[str, Any] = {"field": field}
        if op in ("==", "!="):
            spec["equals"] = value
        elif op == "in":
            if not isinstance(value, list):
                raise EdgeRuntimeError(f"--defect: {part!r}: 'in' needs a list, e.g. [\"scratch\", \"crack\"]")
            spec["in"] = value
        elif op == "~":
            spec["regex"] = raw.strip("\"'")
        else:
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise EdgeRuntimeError(f"--defect: {part!r}: {op} needs a number")
            spec["lt" if op == "<" else "gt"] = value
        try:
            conds.append((Condition.model_validate(spec), op == "!="))
        except ValidationError as exc:
            raise EdgeRuntimeError(f"--defect: {part!r}: {exc.errors()[0]['msg']}") from None
    return DefectRule(text.strip(), tuple(conds))


def rule_defect(rules: list[Rule], name: str) -> DefectRule:
    """The defect decision of a configured rule: its `when` conditions (all hold)."""
    for rule in rules:
        if rule.name == name:
            if not rule.when:
                raise EdgeRuntimeError(f"--defect-rule {name}: the rule has no conditions")
            return DefectRule(f"rule {name}", tuple((c, False) for c in rule.when))
    raise EdgeRuntimeError(f"--defect-rule {name}: no rule of that name in the config "
                           f"({', '.join(r.name for r in rules) or 'no rules'})")


def default_defect(schema: dict[str, Any]) -> DefectRule:
    """`verdict.defect == true` when the schema has a boolean `defect`, else the first boolean field."""
    props = schema.get("properties") or {}
    names = [n for n, s in props.items() if isinstance(s, dict) and s.get("type") == "boolean"]
    if not names:
        raise EdgeRuntimeError("the verdict schema has no boolean field; say what a defect is with --defect "
                               "(e.g. --defect 'verdict.category != \"none\"')")
    name = "defect" if "defect" in names else names[0]
    return parse_defect(f"verdict.{name} == true")


def _value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.strip("\"'")
