"""Relative paths in a config file are read from the file's folder, not the daemon's working directory
(`/` under systemd): at load, in `config validate` and on reload. Absolute and `~` paths are kept, and
a config not read from a file keeps its relative paths as written (docs/configuration.md, "Paths")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import pytest
from pydantic import AfterValidator, BaseModel

from edge_runtime.capture.sources import Source
from edge_runtime.config import Config, load_config, parse_config
from edge_runtime.config.base import beside_config
from edge_runtime.core.samples import write_sample_video
from tests.support.file_daemon import daemon_from_file
from tests.support.images import encode
from tests.support.tiny_pairs import TinyPair, write_pair_bundle
from tests.support.waiting import wait_for

SCHEMA = {"type": "object", "properties": {"defect": {"type": "boolean"}}, "required": ["defect"]}

# Every path-valued key of the file, each written relative (a camera's file source and a recipe's schema
# file too): the attribute path to read back and what it was written as.
RELATIVE = {
    "data_dir": "data",
    "model.path": "models/vlm",
    "model.draft_model": "models/draft.gguf",
    "governor.replay_file": "traces/power.jsonl",
    "journal.path": "db/journal.sqlite3",
    "evidence.path": "evidence",
    "mqtt.tls.ca_file": "tls/ca.pem",
    "mqtt.tls.cert_file": "tls/client.pem",
    "mqtt.tls.key_file": "tls/client.key",
    "ota.state_dir": "ota",
    "ota.lock_file": "run/update.lock",
    "line_io.opcua.pki_dir": "pki",
    "cameras.0.source": "clips/belt.avi",
    "cameras.0.gate.bank": "banks/belt.bank",
    "programs.housing.references.0.image": "refs/ok.png",
    "line_io.stations.0.recipes.r1.gate.bank": "banks/r1.bank",
}


def _config(refs: str = "refs/ok.png", schema: str = "schemas/r1.json") -> dict[str, Any]:
    r = RELATIVE
    return {
        "device_id": "paths", "data_dir": r["data_dir"],
        "model": {"path": r["model.path"], "draft_model": r["model.draft_model"]},
        "governor": {"sensor": "replay", "replay_file": r["governor.replay_file"]},
        "journal": {"path": r["journal.path"]}, "evidence": {"path": r["evidence.path"]},
        "mqtt": {"tls": {"enabled": True, "ca_file": r["mqtt.tls.ca_file"], "cert_file": r["mqtt.tls.cert_file"],
                         "key_file": r["mqtt.tls.key_file"]}},
        "ota": {"state_dir": r["ota.state_dir"], "lock_file": r["ota.lock_file"]},
        "cameras": [{"name": "belt", "source": r["cameras.0.source"], "program": "housing",
                     "trigger": {"mode": "on_demand"}, "gate": {"mode": "annotate", "bank": r["cameras.0.gate.bank"]}},
                    {"name": "usb", "source": 0}, {"name": "rtsp", "source": "rtsp://cam/stream"},
                    {"name": "pipe", "source": "videotestsrc ! appsink"}],
        "programs": {"housing": {"references": [{"image": refs, "caption": "golden OK sample"}]}},
        "line_io": {"opcua": {"pki_dir": r["line_io.opcua.pki_dir"]},
                    "stations": [{"name": "st1", "camera": "belt",
                                  "nok_when": [{"field": "verdict.defect", "equals": True}],
                                  "recipes": {"r1": {"schema": schema, "gate": {
                                      "mode": "annotate", "bank": r["line_io.stations.0.recipes.r1.gate.bank"]}}}}]},
    }


def _value(config: Config, dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part] if isinstance(value, dict) \
            else getattr(value, part)
    return value


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    """A config folder holding the files the relative paths name that are read at load (the reference
    image, the recipe's schema); the daemon's working directory is elsewhere."""
    folder = tmp_path / "etc" / "edge-runtime"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "ok.png").write_bytes(
        encode(np.random.default_rng(5).integers(0, 256, (96, 128, 3), dtype=np.uint8), ".png"))
    (folder / "schemas").mkdir()
    (folder / "schemas" / "r1.json").write_text(json.dumps(SCHEMA))
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    return folder


def test_relative_paths_are_read_from_the_config_files_folder_not_the_working_directory(
        conf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = conf / "config.yaml"
    path.write_text(json.dumps(_config()))
    monkeypatch.chdir(tmp_path / "cwd")  # as systemd's `/`: nothing the file names is here
    config = load_config(path)
    for dotted, written in RELATIVE.items():
        assert str(_value(config, dotted)) == str(conf / written), dotted
    assert config.model.path == conf / "models/vlm"  # still a Path
    recipe = config.line_io.stations[0].recipes["r1"]
    assert recipe.verdict_schema == SCHEMA  # read from conf/schemas/r1.json
    # not paths: a device index, a URL, a GStreamer pipeline
    assert [c.source for c in config.cameras[1:]] == [0, "rtsp://cam/stream", "videotestsrc ! appsink"]
    # a relative config path given from the working directory: the same folder
    monkeypatch.chdir(tmp_path)
    assert load_config(Path("etc/edge-runtime/config.yaml")).model.path == conf / "models/vlm"


def test_absolute_and_home_paths_are_kept_as_written(conf: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    data = _config(refs=str(conf / "refs" / "ok.png"), schema=str(conf / "schemas" / "r1.json"))
    data["model"]["path"] = "/opt/bundles/vlm"
    data["data_dir"] = "~/edge-data"
    data["cameras"][0]["source"] = "/srv/clips/belt.avi"
    data["cameras"][0]["gate"]["bank"] = "~/banks/belt.bank"
    path = conf / "config.yaml"
    path.write_text(json.dumps(data))
    monkeypatch.chdir(tmp_path / "cwd")
    config = load_config(path)
    assert config.model.path == Path("/opt/bundles/vlm")
    assert config.data_dir == Path("~/edge-data")  # not joined to the folder, not expanded here
    assert config.cameras[0].source == "/srv/clips/belt.avi"
    assert config.cameras[0].gate is not None and config.cameras[0].gate.bank == "~/banks/belt.bank"
    assert config.programs["housing"].references[0].image == conf / "refs" / "ok.png"


def test_a_file_url_source_is_read_from_the_config_files_folder(conf: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Capture strips `file://` and opens the rest: a relative `file://clips/belt.avi` was kept as written
    (any source holding `://` was taken for a URL) and opened from the working directory."""
    write_sample_video(conf / "clips" / "belt.avi", frames=5)
    data = _config()
    data["cameras"][0]["source"] = "file://clips/belt.avi"
    data["cameras"][1] = {"name": "abs", "source": f"file://{conf / 'clips' / 'belt.avi'}"}
    path = conf / "config.yaml"
    path.write_text(json.dumps(data))
    monkeypatch.chdir(tmp_path / "cwd")
    config = load_config(path)
    assert config.cameras[0].source == f"file://{conf / 'clips' / 'belt.avi'}"
    assert config.cameras[1].source == f"file://{conf / 'clips' / 'belt.avi'}"  # absolute: kept
    assert [c.source for c in config.cameras[2:]] == ["rtsp://cam/stream", "videotestsrc ! appsink"]
    source = Source(config.cameras[0])
    try:
        assert source.kind == "video" and source.path == conf / "clips" / "belt.avi"
        assert source.read() is not None  # opened from the config's folder, not the working directory
    finally:
        source.close()


def test_a_config_not_read_from_a_file_keeps_relative_paths_as_written() -> None:
    config = parse_config("model: {path: models/vlm}\ncameras:\n  - {name: a, source: clips/a.avi}\n")
    assert config.model.path == Path("models/vlm")  # the working directory's, as before
    assert config.cameras[0].source == "clips/a.avi"
    assert config.resolved_paths() == []
    assert Config.model_validate({"journal": {"path": "j.sqlite3"}}).journal.path == Path("j.sqlite3")


def _models(model: type[BaseModel]) -> set[type[BaseModel]]:
    found, todo = set(), [model]
    while todo:
        m = todo.pop()
        if m in found:
            continue
        found.add(m)
        for field in m.model_fields.values():
            stack: list[Any] = [field.annotation]
            while stack:
                tp = stack.pop()
                if isinstance(tp, type) and issubclass(tp, BaseModel):
                    todo.append(tp)
                stack.extend(typing.get_args(tp))
    return found


def _plain_path(tp: Any) -> bool:
    """Whether a Path occurs in the annotation without beside_config around it."""
    if typing.get_origin(tp) is typing.Annotated:
        base, *meta = typing.get_args(tp)
        if any(isinstance(m, AfterValidator) and m.func is beside_config for m in meta):
            return False
        return _plain_path(base)
    if isinstance(tp, type) and issubclass(tp, PurePath):
        return True
    return any(_plain_path(a) for a in typing.get_args(tp))


def test_every_path_field_of_the_configuration_is_read_from_the_files_folder() -> None:
    """A Path field added later without ConfigPath would be read from the working directory again."""
    plain = [f"{m.__name__}.{name}" for m in _models(Config) for name, field in m.model_fields.items()
             if not any(isinstance(x, AfterValidator) and x.func is beside_config for x in field.metadata)
             and _plain_path(field.annotation)]
    assert plain == []


def test_config_validate_reads_relative_paths_as_start_does_and_shows_them(
        conf: Path, tmp_path: Path, tiny_pairs: Callable[[str], TinyPair]) -> None:
    write_pair_bundle(tiny_pairs("qwen2.5-vl"), conf / "models" / "vlm", image_max_tokens=64)
    data = _config()
    del data["model"]["draft_model"]
    for cam in data["cameras"]:
        cam.pop("gate", None)  # a gate's bank is checked against the bundle: none fitted here
    del data["line_io"]["stations"][0]["recipes"]["r1"]["gate"]
    path = conf / "config.yaml"
    path.write_text(json.dumps(data))
    proc = subprocess.run([sys.executable, "-m", "edge_runtime", "config", "validate", str(path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path / "cwd",
                          env={**os.environ, "EDGE_RUNTIME_DATA": str(tmp_path / "data")})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{path}: ok"
    assert f"  models/vlm -> {conf / 'models/vlm'}" in lines
    assert f"  refs/ok.png -> {conf / 'refs/ok.png'}" in lines
    assert f"  schemas/r1.json -> {conf / 'schemas/r1.json'}" in lines


def test_a_reload_reads_relative_paths_from_the_files_folder(tmp_path: Path, demo_dir: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "etc"
    (conf / "models").mkdir(parents=True)
    (conf / "models" / "demo").symlink_to(demo_dir)
    write_sample_video(conf / "belt.avi", frames=20)
    cameras = [{"name": "belt", "source": "belt.avi", "fps": 10, "trigger": {"mode": "on_demand"}}]
    data = {"device_id": "paths-reload", "data_dir": "data", "model": {"path": "models/demo", "threads": 2},
            "api": {"enabled": False}, "mqtt": {"enabled": False}, "governor": {"enabled": False},
            "cameras": cameras}
    path = conf / "edge.yaml"
    (tmp_path / "start").mkdir()
    (tmp_path / "reload").mkdir()
    monkeypatch.chdir(tmp_path / "start")
    with daemon_from_file(path, json.dumps(data)) as started:  # read by load_config(path) from "start"
        daemon = started.daemon
        assert daemon.config.model.path == conf / "models/demo" and daemon.config.data_dir == conf / "data"
        wait_for(lambda: daemon.rigs["belt"].camera.slot.peek() is not None, what="the belt camera's frame")
        monkeypatch.chdir(tmp_path / "reload")  # a working directory that changed since the start
        data["cameras"] = [*cameras, {"name": "side", "source": "belt.avi", "fps": 10,
                                      "trigger": {"mode": "on_demand"}}]
        path.write_text(json.dumps(data))
        changes = daemon.reload()
        assert not any(k.startswith("model") or k == "data_dir" for k in changes["restart_needed"] + changes["applied"])
        assert daemon.rigs["side"].cfg.source == str(conf / "belt.avi")
        wait_for(lambda: daemon.rigs["side"].camera.slot.peek() is not None, what="the side camera's frame")
