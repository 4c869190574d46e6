"""Constraint-complexity attacks: every schema is bounded before a grammar is built (issue 14 item 1)."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.core.errors import BundleError, InputError
from edge_runtime.core.schema_budget import check_schema_budget
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.grammar import schema_to_grammar

HOSTILE = [
    ({"type": "string", "maxLength": 50000}, "maxLength 50000"),  # SIGSEGV in llama.cpp before
    ({"type": "string", "maxLength": 10000}, "maxLength 10000"),  # a 500 and a huge log line before
    ({"type": "array", "items": {"type": "integer"}, "minItems": 10_000_000}, "minItems 10000000"),
    ({"type": "string", "enum": [str(i) for i in range(5000)]}, "enum has 5000 values"),
    ({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(500)}}, "500 properties"),
    ({"type": "string", "pattern": "a" * 5000}, "pattern must be a string of at most"),
    ({"type": "string", "maxLength": 1e308}, "maxLength must be a non-negative integer"),
]


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize(("schema", "named"), HOSTILE, ids=[h[1] for h in HOSTILE])
def test_hostile_schema_is_refused_naming_the_field_and_limit(schema: dict[str, Any], named: str) -> None:
    with pytest.raises(InputError) as err:
        schema_to_grammar(schema)
    assert err.value.field == "response_format.json_schema" and err.value.status == 400
    assert named in str(err.value)


def test_deeply_nested_schema_is_refused_without_recursion() -> None:
    with pytest.raises(InputError, match="deeper than 16 levels"):
        schema_to_grammar(nested(100_000))  # json.dumps of this would raise RecursionError


def test_huge_repetition_bound_allocates_nothing() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(3):
        with pytest.raises(InputError):
            schema_to_grammar({"type": "array", "items": {"type": "string"}, "minItems": 10_000_000})
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 20_000  # KiB


def test_schema_that_expands_past_the_grammar_budget_is_refused() -> None:
    # Optional properties: the converter writes a rule for every suffix of the property order.
    props = {f"p{i:03d}" + "x" * 150: {"type": "integer"} for i in range(128)}
    schema = {"type": "object", "properties": props}
    check_schema_budget(schema)  # each count is within budget, the grammar they make is not
    with pytest.raises(InputError, match="max_grammar_bytes"):
        schema_to_grammar(schema)


def test_schema_within_budget_still_converts() -> None:
    assert "root ::=" in schema_to_grammar({"type": "string", "maxLength": 1000})
    assert "root ::=" in schema_to_grammar(nested(10))


def test_bundle_schema_over_budget_is_a_bundle_error(bundle_copy: Path) -> None:
    manifest = bundle_copy / "bundle.yaml"
    data = yaml.safe_load(manifest.read_text())
    data["verdict_schema"]["properties"]["notes"]["maxLength"] = 50000
    manifest.write_text(yaml.safe_dump(data))
    with pytest.raises(BundleError, match=r"verdict_schema.*maxLength 50000 is more than 1000"):
        load_bundle(bundle_copy)


def test_json_object_admits_no_exponent_or_unbounded_number(inspector: Inspector) -> None:
    import llguidance

    from edge_runtime.inference.llm.constraint import lark_for

    tok = inspector.language.guidance_tokenizer().tokenizer
    lark = lark_for(schema_to_grammar({"type": "object"}))

    def admitted(text: str) -> bool:
        ids = tok.tokenize_str(text)
        return bool(llguidance.LLMatcher(tok, lark, log_level=0).validate_tokens(ids) == len(ids))

    assert admitted('{"a": 12.5, "b": [1, -2]}')
    assert not admitted('{"a": 937E+6093719609609609}')  # parsed as infinity before
    assert not admitted('{"a": 1e5}')
    assert not admitted('{"a": 12345678901234567}')  # 17 integral digits


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(port: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_daemon_survives_the_schema_that_crashed_it(tmp_path: Path, demo_dir: Path) -> None:
    port = free_port()
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(f"device_id: schema-test\ndata_dir: {tmp_path / 'data'}\nmodel:\n  path: {demo_dir}\n"
                   f"  threads: 2\napi:\n  port: {port}\nmqtt:\n  enabled: false\ncameras: []\n")
    with (tmp_path / "log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "edge_runtime", "--config", str(cfg), "run"],
                                stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "log").read_text()
                time.sleep(0.2)
        attack = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                  "response_format": {"type": "json_schema",
                                      "json_schema": {"name": "x", "schema": {"type": "string", "maxLength": 50000}}}}
        status, body = post(port, attack)
        assert status == 400, body
        assert "response_format.json_schema" in body["error"]["message"]
        assert "maxLength 50000" in body["error"]["message"]
        status, body = post(port, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert status == 200 and proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=20)
