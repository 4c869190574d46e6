"""Verdict schemas -> the grammar that constrains a generation and the validator that checks it.

The bundle's verdict_schema is built once at load; a request's own schema (a station's recipe) once
per schema, kept in a bounded LRU. A generation's text becomes a verdict only when it is JSON valid
against its schema.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from edge_runtime.core.errors import InferenceError, InputError
from edge_runtime.inference.llm.feed import Generation
from edge_runtime.inference.llm.grammar import schema_to_grammar

_SCHEMAS_KEPT = 32  # per-request verdict schemas whose grammar and validator are kept (a line's recipes)


@dataclass(frozen=True)
class VerdictRules:
    """What a verdict schema becomes once: the grammar that constrains it and the validator that checks it."""

    grammar: str
    validator: Draft202012Validator


class SchemaRefused(InputError, InferenceError):
    """A request's own verdict schema is refused (an InputError naming `schema`; an InferenceError
    too, so a batch reports it in its place like any other failed verdict)."""


class SchemaRules:
    """The rules of every verdict schema asked: the bundle's, and the requests' own in a bounded LRU."""

    def __init__(self, bundle: VerdictRules, check_grammar: Callable[[str], None]) -> None:
        self.bundle = bundle
        self._check_grammar = check_grammar  # the constraint engine's own refusal
        self.kept: OrderedDict[str, VerdictRules] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, schema: dict[str, Any] | None) -> VerdictRules:
        """The grammar and validator of a verdict schema (None: the bundle's), built once per schema
        and kept in a bounded LRU (a station's recipes come back every part). InputError naming
        `schema` when the schema is over the complexity budget or beyond the constraint engine."""
        if schema is None:
            return self.bundle
        key = json.dumps(schema, sort_keys=True, separators=(",", ":"))
        with self._lock:
            rules = self.kept.get(key)
            if rules is not None:
                self.kept.move_to_end(key)
                return rules
        try:
            Draft202012Validator.check_schema(schema)
            grammar = schema_to_grammar(schema, "schema")
            self._check_grammar(grammar)
        except SchemaError as exc:
            raise SchemaRefused(f"schema: not a valid JSON schema ({exc.message[:160]})", field="schema") from None
        except InputError as exc:
            why = str(exc).removeprefix("response_format.json_schema: ").removeprefix("schema: ")
            raise SchemaRefused(f"schema: {why}", field="schema") from None
        except Exception as exc:  # noqa: BLE001 - the converter raises bare exceptions for odd schemas
            raise SchemaRefused(f"schema: unsupported JSON schema ({str(exc)[:160]})", field="schema") from None
        rules = VerdictRules(grammar, Draft202012Validator(schema))
        with self._lock:
            self.kept[key] = rules
            while len(self.kept) > _SCHEMAS_KEPT:
                self.kept.popitem(last=False)
        return rules

    def parse(self, gen: Generation, rules: VerdictRules | None, max_tokens: int) -> dict[str, Any]:
        """The verdict of a generation, checked against `rules`' schema (None: the bundle's)."""
        validator = (rules or self.bundle).validator
        if gen.finish_reason == "length":
            raise InferenceError(f"the model used all {max_tokens} tokens before finishing the "
                                 "verdict; raise model.max_tokens")
        try:
            verdict = json.loads(gen.text)
        except json.JSONDecodeError as exc:
            raise InferenceError(f"the model's output is not valid JSON ({exc.msg})") from None
        errors = sorted(validator.iter_errors(verdict), key=str)
        if errors:
            whose = "the bundle's" if validator is self.bundle.validator else "its request's"
            raise InferenceError(f"the verdict does not match {whose} schema: {errors[0].message}")
        return dict(verdict)
