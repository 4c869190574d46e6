"""The CLI end to end in a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from images import encode

from edge_runtime.samples import part_image


def run_cli(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EDGE_RUNTIME_DATA": str(data_dir)}
    return subprocess.run([sys.executable, "-m", "edge_runtime", *args], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.mark.parametrize("ext", [".jpg", ".png", ".webp"])
def test_infer_prints_a_valid_result(ext: str, tmp_path: Path, data_dir: Path, demo_dir: Path) -> None:
    image = tmp_path / f"part{ext}"
    image.write_bytes(encode(part_image(4, defect=True), ext))
    proc = run_cli("infer", str(image), "--model", str(demo_dir), data_dir=data_dir)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    manifest_schema = __import__("yaml").safe_load((demo_dir / "bundle.yaml").read_text())["verdict_schema"]
    jsonschema.validate(result["verdict"], manifest_schema)
    assert result["frame"]["width"] == 640 and result["model"] == "edge-demo-vlm@1.0"


def test_infer_builds_the_demo_bundle_when_none_is_given(tmp_path: Path) -> None:
    image = tmp_path / "part.bmp"
    image.write_bytes(encode(part_image(5), ".bmp"))
    proc = run_cli("infer", str(image), data_dir=tmp_path / "fresh")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "fresh" / "models" / "demo" / "bundle.yaml").is_file()


@pytest.mark.parametrize(("make_input", "message"), [
    (lambda d: d / "missing.jpg", "no such file"),
    (lambda d: (d / "notes.txt").write_text("just text") and d / "notes.txt", "not an image"),
    (lambda d: (d / "cut.jpg").write_bytes(encode(part_image(0), ".jpg")[:2500]) and d / "cut.jpg", "truncated"),
])
def test_bad_images_give_one_line_and_exit_2(make_input, message: str, tmp_path: Path,  # type: ignore[no-untyped-def]
                                            data_dir: Path) -> None:
    proc = run_cli("infer", str(make_input(tmp_path)), data_dir=data_dir)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_corrupt_bundle_gives_one_line_and_exit_2(tmp_path: Path, data_dir: Path, bundle_copy: Path) -> None:
    (bundle_copy / "vision.onnx").write_bytes(b"broken")
    image = tmp_path / "p.png"
    image.write_bytes(encode(part_image(1), ".png"))
    proc = run_cli("infer", str(image), "--model", str(bundle_copy), data_dir=data_dir)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "vision.onnx does not match its sha256" in proc.stderr


def test_config_validate_reports_the_bad_line(tmp_path: Path, data_dir: Path) -> None:
    cfg = tmp_path / "edge.yaml"
    cfg.write_text("model:\n  threads: 2\n  providers: [CPUExecutionProvider]\n  temprature: 0.1\n")
    proc = run_cli("config", "validate", str(cfg), data_dir=data_dir)
    assert proc.returncode == 2
    assert f"{cfg}:4: model.temprature: unknown key" in proc.stderr
    cfg.write_text("model:\n  threads: 2\n")
    assert run_cli("config", "validate", str(cfg), data_dir=data_dir).returncode == 0


def test_config_schema_is_json_schema(data_dir: Path) -> None:
    proc = run_cli("config", "schema", data_dir=data_dir)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["properties"]["model"]


def test_models_demo_and_verify(tmp_path: Path, data_dir: Path) -> None:
    proc = run_cli("models", "demo", str(tmp_path / "b"), data_dir=data_dir)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("models", "verify", str(tmp_path / "b"), data_dir=data_dir)
    assert proc.returncode == 0 and json.loads(proc.stdout)["ok"] is True
