"""Model bundles: the demo builder is deterministic, and every broken bundle says what is wrong."""

from __future__ import annotations

import hashlib
from pathlib import Path

import onnx
import pytest
import yaml
from edge_runtime_models.demo import build_demo_bundle
from edge_runtime_models.vision_onnx import VisionShape, build_vision_model

from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.core.errors import BundleError


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_demo_bundle_is_byte_identical_across_builds(demo_dir: Path, tmp_path: Path) -> None:
    again = build_demo_bundle(tmp_path / "again")
    assert _digests(again) == _digests(demo_dir)


def test_demo_bundle_loads_with_matching_widths(demo_dir: Path) -> None:
    bundle = load_bundle(demo_dir)
    assert bundle.kind == "onnx" and bundle.mmproj_path is None and bundle.manifest.mtmd is None
    assert bundle.onnx_manifest.vision.embedding_dim == 128
    assert bundle.onnx_manifest.vision.image_tokens == 49
    assert bundle.vision_path is not None and bundle.vision_path.name == "vision.onnx"
    assert bundle.language_path.name == "language.gguf"


def test_missing_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="does not exist"):
        load_bundle(tmp_path / "nope")


def test_missing_manifest_is_named(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"bundle\.yaml is missing"):
        load_bundle(tmp_path)


def test_missing_model_file_is_named(bundle_copy: Path) -> None:
    (bundle_copy / "language.gguf").unlink()
    with pytest.raises(BundleError, match=r"language\.gguf is missing.*language model"):
        load_bundle(bundle_copy)


def test_changed_file_fails_its_checksum(bundle_copy: Path) -> None:
    with (bundle_copy / "vision.onnx").open("ab") as f:
        f.write(b"\0")
    with pytest.raises(BundleError, match=r"vision\.onnx does not match its sha256"):
        load_bundle(bundle_copy)


def test_manifest_with_unknown_key_names_it(bundle_copy: Path) -> None:
    manifest = yaml.safe_load((bundle_copy / "bundle.yaml").read_text())
    manifest["vision"]["colour"] = "red"
    (bundle_copy / "bundle.yaml").write_text(yaml.safe_dump(manifest))
    with pytest.raises(BundleError, match=r"vision\.colour: Extra inputs are not permitted"):
        load_bundle(bundle_copy)


def test_vision_and_language_widths_must_agree(bundle_copy: Path) -> None:
    # A vision tower projecting to 64 wide while the GGUF is 128 wide.
    onnx.save_model(build_vision_model(VisionShape(out_dim=64), seed=1), str(bundle_copy / "vision.onnx"))
    manifest = yaml.safe_load((bundle_copy / "bundle.yaml").read_text())
    manifest["files"]["vision"]["sha256"] = hashlib.sha256((bundle_copy / "vision.onnx").read_bytes()).hexdigest()
    manifest["vision"]["embedding_dim"] = 64
    (bundle_copy / "bundle.yaml").write_text(yaml.safe_dump(manifest))
    with pytest.raises(BundleError, match=r"language\.gguf has embedding width 128, but the vision model outputs 64"):
        load_bundle(bundle_copy)


def test_manifest_that_lies_about_width_is_caught(bundle_copy: Path) -> None:
    manifest = yaml.safe_load((bundle_copy / "bundle.yaml").read_text())
    manifest["vision"]["embedding_dim"] = 256
    (bundle_copy / "bundle.yaml").write_text(yaml.safe_dump(manifest))
    with pytest.raises(BundleError, match=r"vision\.onnx outputs embeddings of width 128, but bundle\.yaml says 256"):
        load_bundle(bundle_copy)


def test_garbage_gguf_is_reported_as_unreadable(bundle_copy: Path) -> None:
    (bundle_copy / "language.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(BundleError, match=r"language\.gguf is not a readable GGUF file"):
        load_bundle(bundle_copy, verify_checksums=False)
