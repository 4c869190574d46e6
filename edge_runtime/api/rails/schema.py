"""JSON Schema validation for schema rails, with `pattern` on the bounded `regex` engine."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

import regex
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

from edge_runtime.api.rails import text as rails_text
from edge_runtime.config.rules import REGEX_TIMEOUT_S
from edge_runtime.verdicts.rules import RegexBudget

# The regex budget of the output check now running on this thread (set around a schema validation).
SCHEMA_BUDGET: ContextVar[RegexBudget | None] = ContextVar("rails_schema_budget", default=None)


def _pattern_keyword(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    """JSON Schema `pattern` on the `regex` engine within the request's regex budget (jsonschema's uses
    `re`, which holds the GIL while it backtracks). A search that does not finish raises `Unfinished`
    out of the validation: an error here would count as "no match", which `not` or `anyOf` turn into
    a pass, and every string of the answer would get a fresh time limit."""
    if not validator.is_type(instance, "string"):
        return
    budget = SCHEMA_BUDGET.get() or RegexBudget(REGEX_TIMEOUT_S, 1)
    if rails_text.search(regex.compile(pattern), instance, budget) is None:
        yield ValidationError(f"does not match {pattern[:40]!r}")


SchemaValidator = validators.extend(Draft202012Validator, {"pattern": _pattern_keyword})
