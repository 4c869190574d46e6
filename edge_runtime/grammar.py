"""JSON schema -> GBNF grammar that only admits strict JSON valid against the schema.

Built on llama-cpp-python's converter, with the gaps it leaves closed (see FACTS.md): raw control
characters are kept out of strings (strict `json.loads` rejects them), and numbers and integers
with a `minimum`/`maximum` are bounded in the grammar itself, because the converter ignores them.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from typing import Any

from .engines import llama_cpp  # noqa: F401  # isort: skip - the engines' safe load order

from llama_cpp.llama_grammar import RESERVED_NAMES, SchemaConverter

# Any character but quote, backslash and the control characters, or a JSON escape.
STRICT_CHAR = (
    r'[^"\\\x00-\x1F\x7F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'
)
# Enumerating integer literals stays cheap for ranges up to this size.
_MAX_ENUMERATED = 1000
_FRACTION_DIGITS = 4


class _StrictConverter(SchemaConverter):
    def visit(self, schema: dict[str, Any], name: str) -> str:
        bounded = _bounded_numeric_rule(schema)
        if bounded is not None:
            rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
            return str(self._add_rule(rule_name, bounded))
        return str(super().visit(schema, name))


def _bounded_numeric_rule(schema: dict[str, Any]) -> str | None:
    """A GBNF body for integer/number schemas with small non-negative integral bounds, else None."""
    kind = schema.get("type")
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if kind not in ("integer", "number") or lo is None or hi is None:
        return None
    if "exclusiveMinimum" in schema or "exclusiveMaximum" in schema:
        return None
    if lo < 0 or lo > hi or hi - lo > _MAX_ENUMERATED:
        return None
    if kind == "integer":
        values = range(math.ceil(lo), math.floor(hi) + 1)
        return "(" + " | ".join(f'"{v}"' for v in values) + ") space"
    if lo != int(lo) or hi != int(hi):
        return None
    lo, hi = int(lo), int(hi)
    frac = f'("." [0-9]{{1,{_FRACTION_DIGITS}}})?'
    parts = [f'("{v}" {frac})' for v in range(lo, hi)]
    parts.append(f'("{hi}" ("." "0"{{1,{_FRACTION_DIGITS}}})?)')
    return "(" + " | ".join(parts) + ") space"


@lru_cache(maxsize=32)
def _grammar_for(schema_json: str) -> str:
    schema = json.loads(schema_json)
    # Keep the schema's own property order (the converter sorts names otherwise).
    order = {name: i for i, name in enumerate(schema.get("properties", {}))}
    converter = _StrictConverter(prop_order=order, allow_fetch=False, dotall=False, raw_pattern=False)
    schema = converter.resolve_refs(schema, "schema")
    converter.visit(schema, "")
    if "char" in converter._rules:
        converter._rules["char"] = STRICT_CHAR
    return str(converter.format_grammar())


def schema_to_grammar(schema: dict[str, Any]) -> str:
    """The GBNF text for `schema` (cached: a bundle's schema is converted once)."""
    return _grammar_for(json.dumps(schema))
