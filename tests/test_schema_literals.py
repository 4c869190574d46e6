"""Verdict schemas whose enum values or property names hold quotes or backslashes, and nullable
fields spelled as a type list, must still constrain the model to strict, schema-valid JSON.

Before: llama-cpp-python's converter did not escape backslashes in GBNF literals, so `say "hi"`
broke the grammar (llguidance refused to translate it; the daemon would not start with such a
bundle) and `tab\\there` admitted a raw tab; `type: ["string", "null"]` dropped maxLength."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from flask.testing import FlaskClient
from images import synthetic_frames
from test_api import running_daemon

from edge_runtime.app import Daemon
from edge_runtime.bundle import Bundle
from edge_runtime.config import Config
from edge_runtime.errors import BundleError
from edge_runtime.grammar import schema_to_grammar
from edge_runtime.inspector import Inspector

AWKWARD_ENUM = ['say "hi"', "back\\slash", "tab\there", "new\nline", "caf\u00e9", "plain"]
SCHEMAS: dict[str, dict[str, Any]] = {
    "enum with quotes, backslashes and control characters": {
        "type": "object", "properties": {"kind": {"enum": AWKWARD_ENUM}}, "required": ["kind"]},
    "property names with a quote and a backslash": {
        "type": "object", "properties": {'a "quoted" name': {"type": "boolean"}, "back\\slash": {"type": "boolean"}},
        "required": ['a "quoted" name', "back\\slash"]},
    "const with a quote": {
        "type": "object", "properties": {"v": {"const": 'x"y'}}, "required": ["v"]},
    "nullable string by type list keeps maxLength": {
        "type": "object", "properties": {"note": {"type": ["string", "null"], "maxLength": 6}}, "required": ["note"]},
    "nullable integer by type list keeps its bounds": {
        "type": "object", "properties": {"n": {"type": ["integer", "null"], "minimum": 0, "maximum": 3}},
        "required": ["n"]},
    "nullable object by type list keeps its properties": {
        "type": "object", "properties": {"box": {"type": ["object", "null"], "properties": {"x": {"type": "boolean"}},
                                                 "required": ["x"], "additionalProperties": False}},
        "required": ["box"]},
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    yield from running_daemon(tmp_path_factory.mktemp("literals"), demo_dir, results=1)


def _verdicts(ins: Inspector, schema: dict[str, Any], frames: int = 6) -> list[str]:
    grammar = schema_to_grammar(schema)
    prefix, suffix = ins.prompt_parts(ins.default_prompt)
    return [ins.generate(prefix, ins.encode(f).embeds, suffix, grammar, 120).text
            for f in synthetic_frames(frames, seed=31)]


@pytest.mark.parametrize("name", SCHEMAS)
@pytest.mark.parametrize("engine", ["llguidance", "gbnf"])
def test_awkward_schemas_give_strict_schema_valid_json(name: str, engine: str, inspector: Inspector,
                                                        gbnf_inspector: Inspector) -> None:
    ins = inspector if engine == "llguidance" else gbnf_inspector
    schema = SCHEMAS[name]
    for text in _verdicts(ins, schema):
        verdict = json.loads(text, strict=True)  # strict: no raw control characters in strings
        jsonschema.validate(verdict, schema)


def test_enum_literals_in_the_grammar_are_escaped_for_gbnf() -> None:
    grammar = schema_to_grammar(SCHEMAS["enum with quotes, backslashes and control characters"])
    # JSON text `"say \"hi\""` inside a GBNF literal: every backslash and quote escaped once more.
    assert r'"\"say \\\"hi\\\"\""' in grammar
    assert r'"\"tab\\there\""' in grammar  # the two characters \t, never a raw tab


def test_chat_with_an_awkward_json_schema_answers_strict_json(client: FlaskClient) -> None:
    schema = SCHEMAS["enum with quotes, backslashes and control characters"]
    body = {"messages": [{"role": "user", "content": "Which kind?"}], "max_tokens": 60,
            "response_format": {"type": "json_schema", "json_schema": {"name": "k", "schema": schema}}}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.get_data(as_text=True)[:300]
    content = response.json["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(content, strict=True), schema)


def test_a_schema_the_engine_cannot_express_is_a_400_before_anything_is_queued(
        client: FlaskClient, daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    from edge_runtime.llm import constraint

    def refuse(gbnf: str) -> str:
        raise ValueError("Expected name at line 1")  # what llguidance's translator raises, in kind

    monkeypatch.setattr(constraint, "gbnf_to_lark", refuse)
    queued: list[object] = []
    real_submit = daemon.submit_job
    monkeypatch.setattr(daemon, "submit_job", lambda job: queued.append(job) or real_submit(job))
    schema = {"type": "object", "properties": {"only_here": {"type": "boolean"}}, "required": ["only_here"]}
    body = {"messages": [{"role": "user", "content": "?"}], "max_tokens": 8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.get_data(as_text=True)[:300]
    assert response.json["error"]["field"] == "response_format.json_schema"
    assert "cannot express" in response.json["error"]["message"]
    assert queued == []  # refused up front, not in the worker


def test_a_bundle_schema_the_engine_cannot_express_is_a_bundle_error_at_load(
        demo_bundle: Bundle, config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    from edge_runtime.llm import constraint

    def refuse(gbnf: str) -> str:
        raise ValueError("Expected name at line 1")

    monkeypatch.setattr(constraint, "gbnf_to_lark", refuse)
    constraint.lark_for.cache_clear()  # the demo schema was translated by earlier tests
    try:
        with pytest.raises(BundleError, match=r"verdict_schema: .*cannot express"):
            Inspector(demo_bundle, config.model.model_copy(update={"warmup": False}), "test")
    finally:
        constraint.lark_for.cache_clear()
