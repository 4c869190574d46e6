"""`line_io:` is validated at load with the file and line of the problem."""

from __future__ import annotations

import pytest

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
