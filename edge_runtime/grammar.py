"""JSON schema -> GBNF grammar that only admits strict JSON valid against the schema.

Built on llama-cpp-python's converter, with the gaps it leaves closed (see FACTS.md): raw control
characters are kept out of strings (strict `json.loads` rejects them), and numbers and integers
with a `minimum`/`maximum` are bounded in the grammar itself, because the converter ignores them.
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from typing import Any

from .engines import llama_cpp  # noqa: F401  # isort: skip - the engines' safe load order

from llama_cpp import llama_grammar
from llama_cpp.llama_grammar import RESERVED_NAMES, SchemaConverter

from .schema_budget import FIELD, check_grammar_size, check_schema_budget

# Any character but quote, backslash and the control characters, or a JSON escape.
STRICT_CHAR = (
    r'[^"\\\x00-\x1F\x7F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'
)
# Enumerating integer literals stays cheap for ranges up to this size.
_MAX_ENUMERATED = 1000
_FRACTION_DIGITS = 4
# The converter's number allows a 16-digit exponent (`937E+6093719609609609` parses as infinity):
# numbers here have at most 16 integral and 15 fraction digits and no exponent.
BOUNDED_NUMBER = '("-"? integral-part) ("." decimal-part)? space'


def _flat_repetition(item_rule: str, min_items: int, max_items: int | None, separator_rule: str | None = None,
                     item_rule_is_literal: bool = False) -> str:
    """`item{m,n}` instead of the converter's `(item (item (...)?)?)?`: the same language, but its
    nesting depth no longer grows with maxLength/maxItems (a recursive parser's stack did)."""
    del item_rule_is_literal
    if not separator_rule:
        return f"({item_rule}){{{min_items},{'' if max_items is None else max_items}}}"
    if max_items == 0:
        return ""
    rest_hi = "" if max_items is None else max_items - 1
    tail = f"({separator_rule} {item_rule}){{{max(min_items - 1, 0)},{rest_hi}}}"
    body = f"{item_rule} {tail}"
    return body if min_items > 0 else f"({body})?"


llama_grammar._build_repetition = _flat_repetition  # the converter looks it up per call


# GBNF literal escapes. The converter escapes quotes and newlines but not the backslash, so the JSON
# text of `say "hi"` ("say \"hi\"") ended its GBNF literal early (a grammar error) and `a\tb`
# admitted a raw tab: enum values and property names with a backslash broke strict JSON.
_LITERAL_ESCAPES = {"\\": "\\\\", '"': '\\"', "\r": "\\r", "\n": "\\n"}
_LITERAL_SPECIAL = re.compile(r'[\\"\r\n]')


class _StrictConverter(SchemaConverter):
    def visit(self, schema: dict[str, Any], name: str) -> str:
        bounded = _bounded_numeric_rule(schema)
        if bounded is not None:
            rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
            return str(self._add_rule(rule_name, bounded))
        if isinstance(schema.get("type"), list):
            # The converter turns `type: [A, B]` into a union of bare `{"type": A}`, dropping every
            # other keyword (maxLength, bounds, properties): keep them on each branch instead.
            rest = {k: v for k, v in schema.items() if k != "type"}
            return self.visit({"anyOf": [{**rest, "type": t} for t in schema["type"]]}, name)
        return str(super().visit(schema, name))

    def _format_literal(self, literal: str) -> str:
        return '"' + _LITERAL_SPECIAL.sub(lambda m: _LITERAL_ESCAPES[m.group(0)], literal) + '"'


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
    if "number" in converter._rules:
        converter._rules["number"] = BOUNDED_NUMBER
    return str(converter.format_grammar())


def schema_to_grammar(schema: dict[str, Any], field: str = FIELD) -> str:
    """The GBNF text for `schema` (cached: a bundle's schema is converted once).

    The schema passes the complexity budget first (InputError naming `field` otherwise)."""
    check_schema_budget(schema, field)
    grammar = _grammar_for(json.dumps(schema))
    check_grammar_size(grammar, field)
    return grammar
