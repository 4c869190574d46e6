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

from edge_runtime.inference.engines import llama_grammar  # isort: skip - onnxruntime, then llama_cpp (engines.py)

from edge_runtime.core.errors import InputError
from edge_runtime.core.schema_budget import (
    FIELD,
    SUBSCHEMA,
    SUBSCHEMA_LISTS,
    SUBSCHEMA_MAPS,
    check_grammar_size,
    check_schema_budget,
)

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
    if max_items == 0:
        return ""  # `x{0,0}` is refused by llguidance's Lark: nothing at all is the same language
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
_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9-]+")


class _StrictConverter(llama_grammar.SchemaConverter):
    def visit(self, schema: dict[str, Any], name: str) -> str:
        bounded = _bounded_numeric_rule(schema)
        if bounded is not None:
            rule_name = name + "-" if name in llama_grammar.RESERVED_NAMES else name or "root"
            return str(self._add_rule(rule_name, bounded))
        if isinstance(schema.get("type"), list):
            # The converter turns `type: [A, B]` into a union of bare `{"type": A}`, dropping every
            # other keyword (maxLength, bounds, properties): keep them on each branch instead.
            rest = {k: v for k, v in schema.items() if k != "type"}
            return self.visit({"anyOf": [{**rest, "type": t} for t in schema["type"]]}, name)
        return str(super().visit(schema, name))

    def _add_rule(self, name: str, rule: str) -> str:
        # Rule names come from property names. The converter turns every other character into "-", so
        # "é" became "-kv", which llguidance's Lark reads as a private "__KV" rule and refuses; a name
        # must also start with a letter there ("1st" did not). Spell such characters out instead.
        safe = _NAME_UNSAFE.sub(lambda m: "".join(f"u{ord(c):x}" for c in m.group(0)), name)
        if safe and not safe[0].isalpha():
            safe = "p" + safe
        return str(super()._add_rule(safe, rule))

    def _format_literal(self, literal: str) -> str:
        return '"' + _LITERAL_SPECIAL.sub(lambda m: _LITERAL_ESCAPES[m.group(0)], literal) + '"'


def _bounded_numeric_rule(schema: dict[str, Any]) -> str | None:
    """A GBNF body for integer/number schemas with small non-negative integral bounds, or a lower
    bound of 0 (1 for integers) alone, else None."""
    kind = schema.get("type")
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if kind not in ("integer", "number") or lo is None or isinstance(lo, bool) or isinstance(hi, bool):
        return None
    if "exclusiveMinimum" in schema or "exclusiveMaximum" in schema:
        return None
    if hi is None:  # NonNegativeInt / PositiveInt / a non-negative number, as pydantic writes them
        whole = '("0" | [1-9] [0-9]{0,15})' if lo == 0 else '([1-9] [0-9]{0,15})'
        if kind == "integer" and lo in (0, 1):
            return f"{whole} space"
        if kind == "number" and lo == 0:
            return f'{whole} ("." [0-9]{{1,15}})? space'
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
    _canonical_separators(converter._rules)
    return str(converter.format_grammar())


def _canonical_separators(rules: dict[str, str]) -> None:
    """One spelling of the JSON around the values: `{"a": 1, "b": [1, 2]}` (json.dumps' separators).
    The converter's `space ::= " "?` after every token made each separator a choice the model had to
    make, one generation step each; with none left, the grammar forces the keys and punctuation from
    one value to the next, and fast-forward decodes them together with the token before them."""
    for name, body in rules.items():
        rules[name] = body.replace('":" space', '": "').replace('"," space', '", "')
    if "space" in rules:
        rules["space"] = '""'



_NUMERIC_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_NOT_ENFORCED = ("uniqueItems", "minProperties", "maxProperties", "contains", "minContains", "maxContains")
_PAIRS = (("minLength", "maxLength"), ("minItems", "maxItems"), ("minimum", "maximum"))


def check_enforceable(schema: Any, field: str = FIELD, path: str = "") -> None:
    """Refuse (InputError naming the keyword) what the grammar cannot hold the model to, so no answer
    is ever invalid against a schema we accepted: unenforced keywords, numeric bounds other than the
    forms `_bounded_numeric_rule` writes, bounds that can never be met, and `required` names missing
    from `properties` (the converter drops them). Runs after the budget, so the depth is bounded."""
    if not isinstance(schema, dict):
        return
    where = path or "the schema"

    def refuse(what: str) -> InputError:
        return InputError(f"{field}: {where}: {what}", field=field)

    for key in _NOT_ENFORCED:
        if key in schema and schema[key] not in (False, 0):
            raise refuse(f"{key} is not supported: the constraint engine cannot enforce it")
    for lo_key, hi_key in _PAIRS:
        lo, hi = schema.get(lo_key), schema.get(hi_key)
        if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo > hi:
            raise refuse(f"{lo_key} {lo} is greater than {hi_key} {hi}: no value can satisfy it")
    kinds = schema.get("type")
    types: list[Any] = kinds if isinstance(kinds, list) else [kinds]
    if any(k in schema for k in _NUMERIC_BOUNDS):
        for kind in types:
            if kind in ("integer", "number") and _bounded_numeric_rule({**schema, "type": kind}) is None:
                raise refuse(f"these bounds of a {kind} are not enforced by the constraint engine; supported: "
                             "minimum and maximum that are whole numbers from 0 at most 1000 apart, or "
                             "minimum 0 (or 1 for an integer) alone")
    required, props = schema.get("required"), schema.get("properties")
    if isinstance(required, list):
        if len(set(map(str, required))) != len(required):
            raise refuse("required lists a name twice")
        missing = [name for name in required if not isinstance(props, dict) or name not in props]
        if missing:
            raise refuse(f"required names {missing[0]!r}, which properties does not define")
    for key in SUBSCHEMA:
        check_enforceable(schema.get(key), field, f"{path}.{key}" if path else key)
    for key in SUBSCHEMA_LISTS:
        for i, sub in enumerate(schema.get(key) or []):
            check_enforceable(sub, field, f"{path}.{key}[{i}]")
    for key in SUBSCHEMA_MAPS:
        subs = schema.get(key)
        for name, sub in (subs.items() if isinstance(subs, dict) else ()):
            check_enforceable(sub, field, f"{path}.{key}.{name}")


def schema_to_grammar(schema: dict[str, Any], field: str = FIELD) -> str:
    """The GBNF text for `schema` (cached: a bundle's schema is converted once).

    The schema passes the complexity budget first (InputError naming `field` otherwise)."""
    check_schema_budget(schema, field)
    check_enforceable(schema, field)
    grammar = _grammar_for(json.dumps(schema))
    check_grammar_size(grammar, field)
    return grammar
