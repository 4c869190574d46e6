"""What a schema may ask, and that the grammar holds the model to all of it: every answer under an
accepted schema is strict JSON valid against it, and a schema the grammar cannot enforce is a 400
naming why (a BundleError for a bundle's schema) instead of answers that break it.

Before: the converter did not escape backslashes in GBNF literals (`say "hi"` broke the grammar and a
bundle with it would not start; `tab\\there` admitted a raw tab), `type: ["string", "null"]` dropped
maxLength, non-ASCII property names and `maxLength: 0` were 500s, and number bounds, `uniqueItems`,
`minProperties` and undefined `required` names were accepted and ignored."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from flask.testing import FlaskClient

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import Config
from edge_runtime.core.bundle.manifest import Bundle
from edge_runtime.core.errors import BundleError
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.grammar import schema_to_grammar
from tests.api.test_api import running_daemon
from tests.support.flask_json import json_of
from tests.support.images import synthetic_frames

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
    "property names that are not ASCII or start with a digit": {
        "type": "object", "properties": {"\u00e9tat": {"type": "boolean"}, "\U0001f600": {"type": "boolean"},
                                         "1st": {"type": "boolean"}},
        "required": ["\u00e9tat", "\U0001f600", "1st"]},
    "maxLength 0 and maxItems 0": {
        "type": "object", "properties": {"s": {"type": "string", "maxLength": 0},
                                         "a": {"type": "array", "items": {"type": "integer"}, "maxItems": 0}},
        "required": ["s", "a"]},
    "a lower bound alone, as pydantic writes NonNegativeInt, PositiveInt and a non-negative float": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 0}, "p": {"type": "integer", "minimum": 1},
                                         "x": {"type": "number", "minimum": 0}},
        "required": ["n", "p", "x"]},
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
    content = json_of(response)["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(content, strict=True), schema)


def test_a_schema_the_engine_cannot_express_is_a_400_before_anything_is_queued(
        client: FlaskClient, daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    from edge_runtime.inference.llm import constraint

    def refuse(gbnf: str) -> str:
        raise ValueError("Expected name at line 1")  # what llguidance's translator raises, in kind

    monkeypatch.setattr(constraint, "gbnf_to_lark", refuse)
    queued: list[object] = []
    real_submit = daemon.entry.submit_job

    def submit(job: Any) -> Any:
        queued.append(job)
        return real_submit(job)

    monkeypatch.setattr(daemon.entry, "submit_job", submit)
    schema = {"type": "object", "properties": {"only_here": {"type": "boolean"}}, "required": ["only_here"]}
    body = {"messages": [{"role": "user", "content": "?"}], "max_tokens": 8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.get_data(as_text=True)[:300]
    assert json_of(response)["error"]["field"] == "response_format.json_schema"
    assert "cannot express" in json_of(response)["error"]["message"]
    assert queued == []  # refused up front, not in the worker


def test_a_bundle_schema_the_engine_cannot_express_is_a_bundle_error_at_load(
        demo_bundle: Bundle, config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    from edge_runtime.inference.llm import constraint

    def refuse(gbnf: str) -> str:
        raise ValueError("Expected name at line 1")

    monkeypatch.setattr(constraint, "gbnf_to_lark", refuse)
    constraint.lark_for.cache_clear()  # the demo schema was translated by earlier tests
    try:
        with pytest.raises(BundleError, match=r"verdict_schema: .*cannot express"):
            Inspector(demo_bundle, config.model.model_copy(update={"warmup": False}), "test")
    finally:
        constraint.lark_for.cache_clear()



NOT_ENFORCEABLE = {
    "uniqueItems": {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True},
    "minProperties": {"type": "object", "minProperties": 1},
    "are not enforced by the constraint engine": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
    "these bounds of a number": {"type": "number", "minimum": -5, "maximum": -2},
    "these bounds of a integer": {"type": "integer", "minimum": 3},
    "greater than maxLength": {"type": "string", "minLength": 10, "maxLength": 2},
    "greater than maximum": {"type": "integer", "minimum": 10, "maximum": 1},
    "which properties does not define": {"type": "object", "properties": {"a": {"type": "integer"}},
                                         "required": ["a", "b"]},
    "required lists a name twice": {"type": "object", "properties": {"a": {"type": "boolean"}},
                                    "required": ["a", "a"]},
}


@pytest.mark.parametrize("reason", NOT_ENFORCEABLE)
def test_a_schema_the_grammar_cannot_hold_the_model_to_is_a_400_naming_why(client: FlaskClient, reason: str) -> None:
    body = {"messages": [{"role": "user", "content": "?"}], "max_tokens": 8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": NOT_ENFORCEABLE[reason]}}}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.get_data(as_text=True)[:300]
    error = json_of(response)["error"]
    assert error["field"] == "response_format.json_schema" and reason in error["message"], error


def test_a_bundle_whose_schema_cannot_be_enforced_is_a_bundle_error_at_load(
        bundle_copy: Path, config: Config) -> None:
    import yaml

    from edge_runtime.core.bundle.manifest import load_bundle

    manifest = yaml.safe_load((bundle_copy / "bundle.yaml").read_text())
    manifest["verdict_schema"]["properties"]["confidence"] = {"type": "number", "minimum": -1, "maximum": 1}
    (bundle_copy / "bundle.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    with pytest.raises(BundleError, match=r"verdict_schema: .*confidence.*not enforced"):
        Inspector(load_bundle(bundle_copy), config.model.model_copy(update={"warmup": False}), "test")


BOOL_AND_ENUM = {"type": "object", "additionalProperties": False, "required": ["ok", "kind", "marks"],
                 "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["screw", "label"]},
                                "marks": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}}}


def test_the_json_around_the_values_has_one_spelling(inspector: Inspector) -> None:
    """json.dumps' separators and no other whitespace: each optional space was a step of its own."""
    import llguidance

    from edge_runtime.inference.llm.constraint import lark_for

    tok = inspector.language.guidance_tokenizer().tokenizer
    lark = lark_for(schema_to_grammar(BOOL_AND_ENUM))

    def admitted(text: str) -> bool:
        ids = tok.tokenize_str(text)
        return bool(llguidance.LLMatcher(tok, lark, log_level=0).validate_tokens(ids) == len(ids))

    assert admitted('{"ok": true, "kind": "screw", "marks": [true, false]}')
    for other in ('{"ok":true, "kind": "screw", "marks": [true, false]}',
                  '{ "ok": true, "kind": "screw", "marks": [true, false]}',
                  '{"ok" : true, "kind": "screw", "marks": [true, false]}',
                  '{"ok": true,"kind": "screw", "marks": [true, false]}',
                  '{"ok": true, "kind": "screw", "marks": [true,false]}',
                  '{"ok": true, "kind": "screw", "marks": [ true, false]}',
                  '{"ok": true, "kind": "screw", "marks": [true, false] }'):
        assert not admitted(other), other


@pytest.mark.parametrize("engine", ["llguidance", "gbnf"])
def test_both_engines_answer_the_one_spelling(engine: str, inspector: Inspector, gbnf_inspector: Inspector) -> None:
    ins = inspector if engine == "llguidance" else gbnf_inspector
    prefix, suffix = ins.prompt_parts(ins.default_prompt)
    for frame in synthetic_frames(3, seed=41):
        text = ins.generate(prefix, ins.encode(frame).embeds, suffix, schema_to_grammar(BOOL_AND_ENUM), 120).text
        assert text.strip() == json.dumps(json.loads(text))


def test_a_boolean_and_enum_verdict_is_decoded_in_a_few_steps(inspector: Inspector) -> None:
    """Between two values the grammar forces every key and separator, so fast-forward decodes them with
    the value before: the steps are the model's choices (a boolean, an enum's first token, each array
    item and what follows it), not one more per optional space."""
    prefix, suffix = inspector.prompt_parts(inspector.default_prompt)
    for frame in synthetic_frames(3, seed=41):
        gen = inspector.generate(prefix, inspector.encode(frame).embeds, suffix, schema_to_grammar(BOOL_AND_ENUM), 120)
        marks = len(json.loads(gen.text)["marks"])
        assert gen.steps <= 3 + 2 * marks + 2, (gen.steps, gen.text)
