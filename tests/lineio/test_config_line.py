"""`line_io:` is validated at load with the file and line of the problem."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from edge_runtime.config.line_io import SCHEMA_FILE_MAX
from edge_runtime.config.schema import parse_config
from edge_runtime.core.errors import ConfigError

BASE = """\
cameras:
  - name: cam
    source: /tmp
line_io:
  stations:
    - name: st1
      camera: cam
      nok_when: [{field: verdict.defect, equals: true}]
"""


def test_a_valid_line_io_section_loads() -> None:
    cfg = parse_config(BASE + "      recipes: {bolt: {prompt: \"Is the bolt there?\"}}\n      default_recipe: bolt\n")
    st = cfg.line_io.stations[0]
    assert (st.fifo_depth, st.result_deadline_ms, st.default_recipe) == (8, 2000, "bolt")
    assert cfg.line_io.opcua.enabled is False and cfg.line_io.opcua.security == ["sign", "sign_and_encrypt"]


@pytest.mark.parametrize("extra,where,words", [
    ("      fifo_depth: 0\n", ":9:", "fifo_depth"),
    ("      default_recipe: nope\n", ":6:", "default_recipe 'nope' is not one of the recipes"),
    ("      recipes: {'bad id': {}}\n", ":9:", "recipe ids are 1-32"),
    ("      nok_when_typo: 1\n", ":9:", "unknown key"),
    ("  opcua: {enabled: true}\n", ":9:", "give at least one user"),
    ("  opcua: {users: [{name: plc, password_hash: hunter2}]}\n", ":9:", "password_hash"),
    ("  opcua: {security: [basic128]}\n", ":9:", "security"),
])
def test_line_io_errors_name_file_line_and_key(extra: str, where: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(BASE + extra, "line.yaml")
    message = str(err.value)
    assert message.startswith("line.yaml") and where in message and words in message, message


def test_station_names_are_unique() -> None:
    twice = BASE + "    - name: st1\n      camera: cam\n      nok_when: [{field: verdict.defect, equals: true}]\n"
    with pytest.raises(ConfigError, match="station names must be unique; repeated: st1"):
        parse_config(twice, "line.yaml")


BOLT_SCHEMA = ('{type: object, properties: {present: {type: boolean}, torque_ok: {type: boolean}}, '
               'required: [present, torque_ok]}')


def test_a_recipe_selects_an_inline_schema_and_a_rule_on_its_fields() -> None:
    cfg = parse_config(BASE + f"      recipes: {{bolt: {{schema: {BOLT_SCHEMA}, "
                              "nok_when: [{field: verdict.present, equals: false}]}}\n")
    schema = cfg.line_io.stations[0].recipes["bolt"].verdict_schema
    assert schema is not None and schema["required"] == ["present", "torque_ok"]


def test_a_recipe_schema_from_a_json_file_with_refs(tmp_path: Path) -> None:
    path = tmp_path / "seal.json"
    path.write_text(json.dumps({"$defs": {"seal": {"type": "object", "properties": {"gap_mm": {"type": "number"}}}},
                                "type": "object", "properties": {"seal": {"$ref": "#/$defs/seal"}},
                                "required": ["seal"]}, indent=2))
    cfg = parse_config(BASE + f"      recipes: {{seal: {{schema: {path}, "
                              "nok_when: [{field: verdict.seal.gap_mm, gt: 0.5}]}}\n")
    schema = cfg.line_io.stations[0].recipes["seal"].verdict_schema
    assert schema is not None and schema["properties"]["seal"] == {"$ref": "#/$defs/seal"}


@pytest.mark.parametrize("recipe,words", [
    # The station's rule reads verdict.defect; this recipe's schema has no such field.
    (f"{{bolt: {{schema: {BOLT_SCHEMA}}}}}", "the station's nok_when reads verdict.defect"),
    (f"{{bolt: {{schema: {BOLT_SCHEMA}, nok_when: [{{field: verdict.torque, equals: false}}]}}}}",
     "its nok_when reads verdict.torque, which the recipe's schema does not declare"),
    ("{bolt: {schema: {type: object, properties: {a: {type: string, maxLength: 50000}}}}}",
     "maxLength 50000 is more than 1000"),
    ("{bolt: {schema: /nonexistent/schema.json}}", "cannot read the schema file /nonexistent/schema.json"),
    ("{bolt: {schema: [1, 2]}}", "schema must be a JSON schema"),
])
def test_a_recipe_schema_is_bounded_and_must_declare_the_rules_fields(recipe: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(BASE + f"      recipes: {recipe}\n", "line.yaml")
    message = str(err.value)
    assert message.startswith("line.yaml:9") and words in message, message


def test_a_schema_file_too_big_or_too_deep_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text(" " * (SCHEMA_FILE_MAX + 10) + "{}")
    deep = tmp_path / "deep.json"
    deep.write_text('{"properties": {"a": ' * 40 + "{}" + "}}" * 40)
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 60_000 + "]" * 60_000)  # within the size bound: too deep for the parser
    for path, words in ((big, "more than"), (deep, "nests deeper than 16"), (nested, "is not JSON")):
        with pytest.raises(ConfigError) as err:
            parse_config(BASE + f"      recipes: {{r: {{schema: {path}}}}}\n", "line.yaml")
        assert words in str(err.value), str(err.value)


def test_a_schema_file_that_is_a_fifo_or_device_is_refused_not_waited_on(tmp_path: Path) -> None:
    # Opening a FIFO waits for a writer: `config validate`, start and every reload (under the reload
    # lock: SIGHUP and the MQTT reload command behind it) hung for good.
    fifo = tmp_path / "seal.json"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), (Path("/dev/zero"), "a device")):
        caught: list[BaseException] = []

        def load(path: Path = path, caught: list[BaseException] = caught) -> None:
            try:
                parse_config(BASE + f"      recipes: {{r: {{schema: {path}}}}}\n", "line.yaml")
            except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
                caught.append(exc)

        worker = threading.Thread(target=load, daemon=True)
        worker.start()
        worker.join(10)
        assert caught, f"still blocked on {path} after 10 s"
        assert isinstance(caught[0], ConfigError) and "\n" not in str(caught[0])
        assert f"cannot read the schema file {path}: not a regular file ({kind})" in str(caught[0]), str(caught[0])
