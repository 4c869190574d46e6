"""Configuration: defaults that run, wrong keys named with their line, ${ENV} for secrets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edge_runtime.config import config_schema, load_config, parse_config
from edge_runtime.core.errors import ConfigError


def test_no_file_means_defaults_that_run() -> None:
    cfg = load_config(None)
    assert cfg.model.path is None and cfg.model.threads >= 1
    assert cfg.model.providers[-1] == "CPUExecutionProvider"


def test_an_empty_mapping_means_defaults_and_an_empty_file_is_refused() -> None:
    assert parse_config("{}").model.context_size == 2048
    for text in ("", "\n", "# nothing yet\n", "---\n", "null\n"):
        with pytest.raises(ConfigError, match="the config file is empty"):
            parse_config(text, "edge.yaml")


def test_unknown_key_names_the_key_and_line() -> None:
    text = "device_id: cam-01\nmodel:\n  threads: 2\n  thread_count: 4\n"
    with pytest.raises(ConfigError, match=r"<config>:4: model\.thread_count: unknown key"):
        parse_config(text)


def test_wrong_type_names_the_key_and_line() -> None:
    with pytest.raises(ConfigError, match=r"cfg\.yaml:3: model\.gpu_layers: Input should be a valid integer"):
        parse_config("log_level: info\nmodel:\n  gpu_layers: lots\n", "cfg.yaml")


def test_invalid_yaml_names_the_line() -> None:
    with pytest.raises(ConfigError, match=r"<config>:3: not valid YAML: mapping values are not allowed"):
        parse_config("model:\n  threads: 2\n    gpu_layers: 1\n")


def test_environment_variables_are_substituted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGE_THREADS", "3")
    cfg = parse_config("device_id: ${DEVICE:-line-4}\nmodel:\n  threads: ${EDGE_THREADS}\n")
    assert cfg.device_id == "line-4" and cfg.model.threads == 3


def test_missing_environment_variable_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    with pytest.raises(ConfigError, match=r"<config>:1: environment variable NOT_SET_ANYWHERE is not set"):
        parse_config("device_id: ${NOT_SET_ANYWHERE}\n")


def test_systemd_credentials_fill_placeholders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "DEVICE_NAME").write_text("from-credential\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    monkeypatch.delenv("DEVICE_NAME", raising=False)
    assert parse_config("device_id: ${DEVICE_NAME}\n").device_id == "from-credential"


def test_device_id_must_be_topic_safe() -> None:
    with pytest.raises(ConfigError, match=r"device_id: Value error, use 1-64 letters"):
        parse_config("device_id: 'line 4/#'\n")


def test_schema_has_a_description_for_every_field() -> None:
    schema = config_schema()

    def walk(node: dict[str, Any]) -> None:
        for name, prop in node.get("properties", {}).items():
            assert prop.get("description"), f"{name} has no description"
    walk(schema)
    for definition in schema.get("$defs", {}).values():
        walk(definition)


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://updates.example/m.json", "https://a b/m.json"])
def test_an_ota_manifest_url_that_is_not_http_is_refused_at_load_naming_the_key(url: str) -> None:
    with pytest.raises(ConfigError, match=r"<config>:2: ota\.manifest_url: String should match pattern"):
        parse_config(f"ota:\n  manifest_url: {url!r}\n")


@pytest.mark.parametrize("name", ["api", "openai"])
def test_a_camera_cannot_take_the_name_that_uploads_and_chats_carry(name: str) -> None:
    with pytest.raises(ConfigError, match=f"camera name '{name}' is reserved"):
        parse_config(f"cameras:\n  - name: {name}\n    source: belt.mp4\n")
