"""A complexity budget for JSON schemas, checked before any grammar or constraint is built.

llama.cpp's schema converter unrolls bounded repetition into nested rules: `maxLength: 50000` made
the daemon overflow its C stack (SIGSEGV) and `minItems: 10000000` allocated 800 MB. Every schema a
client sends (and every bundle's verdict schema) passes this walk first; it is iterative, so a deeply
nested schema cannot exhaust Python's stack either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from edge_runtime.core.errors import InputError


@dataclass(frozen=True)
class SchemaLimits:
    max_bytes: int = 32_768  # the schema as compact JSON
    max_depth: int = 16  # nested schema objects (properties, items, anyOf, ...)
    max_nodes: int = 1_000  # schema objects in all
    max_string_length: int = 1_000  # maxLength / minLength
    max_items: int = 256  # maxItems / minItems / min/maxProperties / min/maxContains
    max_enum: int = 256  # enum values
    max_properties: int = 128  # properties of one object
    max_pattern: int = 256  # characters of a `pattern`
    max_grammar_bytes: int = 131_072  # GBNF text a schema may turn into


LIMITS = SchemaLimits()
_STRING_BOUNDS = ("minLength", "maxLength")
_COUNT_BOUNDS = ("minItems", "maxItems", "minProperties", "maxProperties", "minContains", "maxContains")
# Keywords whose value is a schema, a list of schemas or a map of schemas.
SUBSCHEMA = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
              "unevaluatedItems", "unevaluatedProperties", "additionalItems")
SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")

FIELD = "response_format.json_schema"


def check_schema_budget(schema: Any, field: str = FIELD, limits: SchemaLimits = LIMITS) -> None:
    """Raise InputError (naming `field` and the limit) when `schema` is over the complexity budget."""
    def refuse(what: str) -> InputError:
        return InputError(f"{field}: {what}", field=field)

    if not isinstance(schema, dict):
        raise refuse("the schema must be a JSON object")
    stack: list[tuple[Any, int, str]] = [(schema, 1, "")]
    nodes = 0
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, bool):
            continue  # `true` / `false` are schemas too
        if not isinstance(node, dict):
            raise refuse(f"{path or 'the schema'} must be a JSON object")
        nodes += 1
        if nodes > limits.max_nodes:
            raise refuse(f"more than {limits.max_nodes} nested schemas (limit max_nodes)")
        if depth > limits.max_depth:
            raise refuse(f"{path} nests deeper than {limits.max_depth} levels (limit max_depth)")
        _check_bounds(node, path, limits, refuse)
        for key in SUBSCHEMA:
            if key in node:
                stack.append((node[key], depth + 1, f"{path}.{key}" if path else key))
        for key in SUBSCHEMA_LISTS:
            if key in node:
                items = node[key]
                if not isinstance(items, list):
                    raise refuse(f"{path}.{key} must be a list of schemas")
                stack.extend((s, depth + 1, f"{path}.{key}[{i}]") for i, s in enumerate(items))
        for key in SUBSCHEMA_MAPS:
            if key in node:
                subs = node[key]
                if not isinstance(subs, dict):
                    raise refuse(f"{path}.{key} must be an object of schemas")
                if key == "properties" and len(subs) > limits.max_properties:
                    raise refuse(f"{path}.properties has {len(subs)} properties, more than "
                                 f"{limits.max_properties} (limit max_properties)")
                stack.extend((s, depth + 1, f"{path}.{key}.{k}") for k, s in subs.items())
    # Sized after the walk: the walk has shown the nesting is shallow enough for json.dumps.
    size = len(json.dumps(schema, separators=(",", ":")))
    if size > limits.max_bytes:
        raise refuse(f"the schema is {size} bytes, more than {limits.max_bytes} (limit max_bytes)")


def _check_bounds(node: dict[str, Any], path: str, limits: SchemaLimits, refuse: Any) -> None:
    where = path or "the schema"
    for keys, cap, name in ((_STRING_BOUNDS, limits.max_string_length, "max_string_length"),
                            (_COUNT_BOUNDS, limits.max_items, "max_items")):
        for key in keys:
            if key not in node:
                continue
            value = node[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise refuse(f"{where}: {key} must be a non-negative integer")
            if value > cap:
                raise refuse(f"{where}: {key} {value} is more than {cap} (limit {name})")
    enum = node.get("enum")
    if enum is not None:
        if not isinstance(enum, list):
            raise refuse(f"{where}: enum must be a list")
        if len(enum) > limits.max_enum:
            raise refuse(f"{where}: enum has {len(enum)} values, more than {limits.max_enum} (limit max_enum)")
    pattern = node.get("pattern")
    if pattern is not None and (not isinstance(pattern, str) or len(pattern) > limits.max_pattern):
        raise refuse(f"{where}: pattern must be a string of at most {limits.max_pattern} characters "
                     "(limit max_pattern)")


def check_grammar_size(grammar: str, field: str = FIELD, limits: SchemaLimits = LIMITS) -> None:
    """The converted grammar is bounded too: small schemas can still expand (enums x nesting)."""
    if len(grammar) > limits.max_grammar_bytes:
        raise InputError(f"{field}: the schema's grammar is {len(grammar)} bytes, more than "
                         f"{limits.max_grammar_bytes} (limit max_grammar_bytes)", field=field)
