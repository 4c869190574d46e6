"""Broken and hostile config files: one config error line (exit 2), never a crash; names are anchored."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_runtime.config import MAX_CONFIG_BYTES, load_config, parse_config
from edge_runtime.core.errors import ConfigError

LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8))

# name -> file content (bytes); each must be refused with one ConfigError line.
CORPUS: dict[str, bytes] = {
    "unhashable_key": b"? [a, b]\n: 1\n",
    "mapping_key": b"? {a: 1}\n: 1\n",
    "recursive_alias": b"x: &a [*a]\n",
    "recursive_mapping_alias": b"model: &m\n  threads: *m\n",
    "billion_laughs": LAUGHS.encode(),
    "deep_nesting": b"x: " + b"[" * 5000 + b"]" * 5000 + b"\n",
    "binary_garbage": bytes(range(256)) * 4,
    "nul_bytes": b"device_id: a\x00b\n",
    "python_tag": b"x: !!python/object/apply:os.system ['true']\n",
    "not_a_mapping": b"- 1\n- 2\n",
    "wildcard_camera": b"cameras:\n  - name: 'line#1'\n    source: x.avi\n",
    "huge_integer": b"api: {port: 1" + b"0" * 5000 + b"}\n",  # past Python's int() digit limit
    "merge_key": b"x: &d {threads: 1}\nmodel: {<<: *d}\n",
    "binary_tag": b"device_id: !!binary aGVsbG8=\n",
    "lone_surrogate": b'device_id: "a\\ud800"\n',
    "lone_surrogate_key": b'"k\\udfff": 1\n',
    # A key's text is echoed in the error: a newline in it split the one line (and forged log lines on a
    # reload), a long one made it as long.
    "newline_key": b'"device_id\\n2026-12-05 daemon: config reloaded": 1\n',
    "newline_program_name": b'programs:\n  "a\\nb": {}\n',
    "newline_nested_key": b'api:\n  "port\\rx": 1\n',
    "long_key": b'"' + b"k" * 1000 + b'": 1\n',
    "duplicate_key": b"device_id: a\ndevice_id: b\n",
    "duplicate_section": b"cameras:\n  - {name: a, source: x.avi}\nmodel: {threads: 2}\ncameras: []\n",
}
BAD_NAMES = ["line#1", "line+1", "a/b", "<b>x</b>", "x" * 100, "-lead", "", "a b", "$SYS"]


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_broken_config_is_one_config_error(name: str, tmp_path: Path) -> None:
    path = tmp_path / "edge.yaml"
    path.write_bytes(CORPUS[name])
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(str(path)) and message.isprintable() and len(message) < 400, message


def test_a_key_given_twice_names_both_lines() -> None:
    # The second silently won: a `cameras:` block pasted below an existing one dropped the first cameras.
    with pytest.raises(ConfigError, match=r"<config>:4: cameras: the key appears twice in one mapping "
                                          r"\(first on line 1\)"):
        parse_config("cameras:\n  - {name: a, source: x.avi}\nmodel: {threads: 2}\ncameras: []\n")
    with pytest.raises(ConfigError, match=r"<config>:3: model.threads: the key appears twice"):
        parse_config("model:\n  threads: 2\n  threads: 4\n")


def test_unhashable_key_names_its_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"<config>:2: a key must be a plain value"):
        parse_config("device_id: a\n? [a, b]\n: 1\n")


def test_recursive_alias_is_named() -> None:
    with pytest.raises(ConfigError, match="refers to itself"):
        parse_config("x: &a [*a]\n")


def test_alias_bomb_is_refused_before_it_expands() -> None:
    with pytest.raises(ConfigError, match="too many values"):
        parse_config(LAUGHS)


def test_a_directory_is_not_a_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(tmp_path)


def test_an_unreadable_file_is_one_line(tmp_path: Path) -> None:
    # As root (CI) file permissions do not stop reading; a symlink loop fails open() for anyone.
    path = tmp_path / "loop.yaml"
    path.symlink_to(path)
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config(path)


def test_a_huge_file_is_refused_after_a_bounded_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as f:
        f.truncate(1 << 30)  # sparse 1 GiB: reading it whole would cost a gigabyte of memory
    with pytest.raises(ConfigError, match="larger than"):
        load_config(path)
    assert MAX_CONFIG_BYTES <= 1 << 20


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_camera_names_unsafe_in_topics_urls_or_files_are_refused(bad: str) -> None:
    text = f"device_id: ok\ncameras:\n  - name: {bad!r}\n    source: x.avi\n"
    with pytest.raises(ConfigError, match=r"<config>:3: cameras\.0\.name"):
        parse_config(text)


@pytest.mark.parametrize("bad", ["+", "#", *BAD_NAMES])
def test_ota_group_names_unsafe_in_topics_are_refused(bad: str) -> None:
    # The agent subscribes to edge/group/<name>/cmd/ota: "+" took every group's releases (signed by the
    # same fleet key, so applied), "#" made paho raise in on_connect and skip the groups after it.
    with pytest.raises(ConfigError, match=r"<config>:2: ota\.groups\.1: Value error, use 1-64 letters"):
        parse_config(f"ota:\n  groups: [line-1, {bad!r}]\n")


def test_ota_group_names_that_are_topic_pieces_pass() -> None:
    assert parse_config("ota:\n  groups: [line-1, hall_2.press]\n").ota.groups == ["line-1", "hall_2.press"]


@pytest.mark.parametrize("bad", ["a#b", "a+b", "a/b", "<i>", "x" * 100, "-x"])
def test_device_id_unsafe_in_topics_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"<config>:1: device_id"):
        parse_config(f"device_id: {bad!r}\n")


@pytest.mark.parametrize("bad", ["edge/#", "edge/+/x", "edge//x", "/edge", "$SYS/x", "a/<b>"])
def test_topic_prefix_pieces_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"<config>:2: mqtt\.topic_prefix"):
        parse_config(f"mqtt:\n  topic_prefix: {bad!r}\n")


def test_safe_names_pass() -> None:
    cfg = parse_config("device_id: line-7.plant\nmqtt:\n  topic_prefix: factory/hall_2/line-7\n"
                       "cameras:\n  - name: Belt_2-top\n    source: x.avi\n")
    assert cfg.cameras[0].name == "Belt_2-top" and cfg.topic_prefix() == "factory/hall_2/line-7"


@pytest.mark.parametrize("name", ["unhashable_key", "recursive_alias", "billion_laughs", "binary_garbage"])
def test_config_validate_exits_2_with_one_line(name: str, tmp_path: Path) -> None:
    path = tmp_path / "edge.yaml"
    path.write_bytes(CORPUS[name])
    proc = subprocess.run([sys.executable, "-m", "edge_runtime", "config", "validate", str(path)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "EDGE_RUNTIME_DATA": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr and "internal error" not in proc.stderr


def test_an_environment_value_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "edge.yaml"
    path.write_text("device_id: a\nmqtt:\n  host: ${EDGE_TEST_BAD_HOST}\n")
    env = {**os.environ, "EDGE_TEST_BAD_HOST": "x"}
    code = ("import os, sys; from edge_runtime.config import load_config\n"
            "os.environb[b'EDGE_TEST_BAD_HOST'] = b'br\\xffoker'\n"
            "try:\n    load_config(sys.argv[1])\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True,
                         timeout=60).stdout
    assert out.startswith(f"ConfigError {path}:3:") and "not valid UTF-8" in out, out


def test_the_number_of_cameras_is_bounded() -> None:
    # A generated file with a runaway loop: 19,000 cameras were accepted (12 s to validate), and the
    # daemon would have started a capture and a schedule thread for each.
    many = "cameras:\n" + "".join(f"  - {{name: c{i}, source: x.avi}}\n" for i in range(65))
    with pytest.raises(ConfigError, match=r"<config>:1: cameras: List should have at most 64 items"):
        parse_config(many)
    assert len(parse_config(many.rsplit("  - ", 1)[0]).cameras) == 64
