"""The anomaly gate on the demo bundle's real encoder (ONNX Runtime), fitted on synthetic good parts.

Found on these parts (tests/support/parts.py, 224x224 frames; the demo encoder sees them at 112x112
in a 7x7 patch grid, 32 frame pixels a patch): every defect scores above every clean held-out part
from a scratch of 16 px, a stain of 8 px and the smallest missing hole on the part (6 px). Smaller
scratches (8 px) and stains (6 px) fall among the good parts' scores. docs/inspection.md records it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from edge_runtime_models.demo import SEED
from edge_runtime_models.vision_onnx import VisionShape, build_vision_model

from edge_runtime.config import ModelConfig
from edge_runtime.core.bundle.manifest import Bundle, load_bundle, sha256_file
from edge_runtime.evaluation.gate_fit import in_memory_gate
from edge_runtime.inference.anomaly import (
    AnomalyGate,
    BankCorrupt,
    BankMismatch,
    BankTooLarge,
    FrameMismatch,
    GateContext,
    PatchFeatures,
    gate_context,
    heat_map,
    overlay_heat,
    patch_features,
    write_bank,
)
from edge_runtime.inference.anomaly.fit import bank_header, fit_bank
from edge_runtime.inference.inspector import Inspector
from tests.support.parts import clean_part, defective_part

W = 224
TRAIN, HELD_OUT, SEEDS = 100, 30, 5
# The smallest size at which each kind is caught, and larger ones (missing holes: the part's holes).
SIZES = {"scratch": [16, 24, 32, 48], "stain": [8, 12, 24, 48], "missing_hole": [6, 8, 14, 20]}
HALF_PATCH = W / 7 / 2


@dataclass
class Fitted:
    gate: AnomalyGate
    context: GateContext
    bank: Path
    good: list[float]
    train: list[PatchFeatures]


@pytest.fixture(scope="module")
def fitted(inspector: Inspector, demo_bundle: Bundle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fitted]:
    context = gate_context(demo_bundle, inspector.settings)
    feats = [patch_features(inspector.encode(clean_part(s, W, W)), context) for s in range(TRAIN)]
    fit = fit_bank(feats, max_patches=100_000)
    bank = tmp_path_factory.mktemp("gate") / "parts.bank"
    write_bank(bank, bank_header(fit, context, feats[0]), fit.vectors)
    gate = AnomalyGate.load(bank, context, 64 << 20)
    good = [gate.score(inspector.encode(clean_part(1000 + s, W, W))).score for s in range(HELD_OUT)]
    yield Fitted(gate, context, bank, good, feats)


@pytest.mark.parametrize("kind", sorted(SIZES))
def test_every_defect_scores_above_every_clean_held_out_part(fitted: Fitted, inspector: Inspector,
                                                             kind: str) -> None:
    worst_good = max(fitted.good)
    for size in SIZES[kind]:
        for seed in range(SEEDS):
            image, _ = defective_part(2000 + seed, kind, size, W, W)  # type: ignore[arg-type]
            result = fitted.gate.score(inspector.encode(image))
            assert result.score > worst_good, (kind, size, seed, result.score, worst_good)


@pytest.mark.parametrize("kind", sorted(SIZES))
def test_the_heat_maps_maximum_lies_on_the_drawn_defect(fitted: Fitted, inspector: Inspector, kind: str) -> None:
    """Within half a patch of the defect's box: the encoder sees 7x7 patches, the map is no finer."""
    for size in SIZES[kind]:
        for seed in range(SEEDS):
            image, defect = defective_part(2000 + seed, kind, size, W, W)  # type: ignore[arg-type]
            heat = heat_map(fitted.gate.score(inspector.encode(image)))
            assert heat.shape == (W, W)
            y, x = np.unravel_index(int(heat.argmax()), heat.shape)
            bx, by, bw, bh = defect.box
            assert bx - HALF_PATCH <= x <= bx + bw + HALF_PATCH and by - HALF_PATCH <= y <= by + bh + HALF_PATCH, \
                (kind, size, seed, (x, y), defect.box)


def test_without_the_place_weighed_a_missing_hole_passes_as_good_metal(fitted: Fitted, inspector: Inspector) -> None:
    """Why position_weight exists: PatchCore alone finds plain plate elsewhere for an undrilled hole."""
    fit = fit_bank(fitted.train, max_patches=100_000, position_weight=0.0)
    anywhere = in_memory_gate(fit, fitted.context, bank_header(fit, fitted.context, fitted.train[0]))
    worst_good = max(anywhere.score(inspector.encode(clean_part(1000 + s, W, W))).score for s in range(HELD_OUT))
    holes = [inspector.encode(defective_part(2000 + s, "missing_hole", 14, W, W)[0]) for s in range(SEEDS)]
    assert min(anywhere.score(e).score for e in holes) < worst_good
    assert min(fitted.gate.score(e).score for e in holes) > max(fitted.good)


def test_the_score_is_the_largest_patch_distance_not_the_mean(fitted: Fitted, inspector: Inspector) -> None:
    image, _ = defective_part(2000, "stain", 12, W, W)
    result = fitted.gate.score(inspector.encode(image))
    assert result.score == pytest.approx(float(result.distances.max()))
    assert result.score > 1.5 * float(result.distances.mean())  # one bad patch among 49 good ones


def test_the_overlay_leaves_a_good_part_untouched_and_colours_a_defect(fitted: Fitted, inspector: Inspector) -> None:
    threshold = max(fitted.good)
    good = clean_part(1000, W, W)
    bad, defect = defective_part(2000, "stain", 24, W, W)
    good_over = overlay_heat(good, heat_map(fitted.gate.score(inspector.encode(good))), threshold)
    bad_over = overlay_heat(bad, heat_map(fitted.gate.score(inspector.encode(bad))), threshold)
    x, y, w, h = defect.box
    assert np.abs(bad_over[y:y + h, x:x + w].astype(int) - bad[y:y + h, x:x + w]).mean() > 20
    assert (np.abs(good_over.astype(int) - good).max(axis=2) > 0).mean() < 0.25


def _bundle_with_another_encoder(demo_dir: Path, tmp_path: Path) -> Path:
    """The demo bundle with a vision encoder of the same shape and other weights."""
    other = Path(shutil.copytree(demo_dir, tmp_path / "other"))
    onnx.save_model(build_vision_model(VisionShape(), SEED + 99), str(other / "vision.onnx"))
    manifest = yaml.safe_load((other / "bundle.yaml").read_text())
    manifest["files"]["vision"]["sha256"] = sha256_file(other / "vision.onnx")
    (other / "bundle.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return other


def test_a_bank_of_another_encoder_is_refused_with_one_line(fitted: Fitted, demo_dir: Path, tmp_path: Path) -> None:
    other = load_bundle(_bundle_with_another_encoder(demo_dir, tmp_path))
    with pytest.raises(BankMismatch, match="another encoder") as err:
        AnomalyGate.load(fitted.bank, gate_context(other, ModelConfig()), 64 << 20)
    assert "\n" not in str(err.value) and "fit the gate again" in str(err.value)


def test_a_bank_of_another_crop_or_budget_is_refused(fitted: Fitted, demo_bundle: Bundle) -> None:
    with pytest.raises(BankMismatch, match=r"crop the whole frame, but these frames are cut to \[10, 20, 200, 180\]"):
        AnomalyGate.load(fitted.bank, gate_context(demo_bundle, ModelConfig(), (10, 20, 200, 180)), 64 << 20)
    budget = gate_context(demo_bundle, ModelConfig(), budget={"image_max_tokens": 64})
    with pytest.raises(BankMismatch, match="another image budget"):
        AnomalyGate.load(fitted.bank, budget, 64 << 20)


def test_a_frame_of_another_size_is_refused_not_scored(fitted: Fitted, inspector: Inspector) -> None:
    with pytest.raises(FrameMismatch, match="the frame is 320x240; the bank was fitted on 224x224"):
        fitted.gate.score(inspector.encode(clean_part(1, 320, 240)))


def test_a_corrupt_or_oversized_bank_is_refused_with_one_line(fitted: Fitted, tmp_path: Path) -> None:
    data = fitted.bank.read_bytes()
    flipped = tmp_path / "flipped.bank"
    flipped.write_bytes(data[:-10] + bytes([data[-10] ^ 1]) + data[-9:])
    truncated = tmp_path / "short.bank"
    truncated.write_bytes(data[:-4])
    junk = tmp_path / "junk.bank"
    junk.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    header = tmp_path / "header.bank"
    header.write_bytes(data[:16] + b"[" + data[17:])
    for path, says in ((flipped, "sha256 does not match"), (truncated, "truncated"), (junk, "not a gate bank"),
                       (header, "corrupt header")):
        with pytest.raises(BankCorrupt, match=says) as err:
            AnomalyGate.load(path, fitted.context, 64 << 20)
        assert "\n" not in str(err.value)
    with pytest.raises(BankTooLarge, match="over the bound of 1 MiB"):
        AnomalyGate.load(fitted.bank, fitted.context, 1 << 20)


def test_the_bank_file_keeps_what_made_it(fitted: Fitted, demo_bundle: Bundle) -> None:
    h = fitted.gate.header
    assert h.encoder.sha256 == demo_bundle.onnx_manifest.files.vision.sha256 and h.encoder.file == "vision.onnx"
    assert h.budget["preprocess"]["width"] == 112 and h.region is None
    assert (h.layout.width, h.layout.height, h.layout.grid) == (W, W, [(7, 7)])
    assert len(h.vectors.sha256) == 64 and h.vectors.patches == TRAIN * 49


def test_an_in_memory_gate_scores_as_the_loaded_one(fitted: Fitted, inspector: Inspector) -> None:
    feats = [patch_features(inspector.encode(clean_part(s, W, W)), fitted.context) for s in range(4)]
    fit = fit_bank(feats)
    gate = in_memory_gate(fit, fitted.context, bank_header(fit, fitted.context, feats[0]))
    enc = inspector.encode(clean_part(7, W, W))
    assert gate.score(enc).score > 0 and gate.patches == 4 * 49


def test_a_search_from_another_thread_runs_on_one_openmp_thread() -> None:
    import threading

    import faiss

    from edge_runtime.inference.anomaly.search import PatchIndex

    index = PatchIndex(4)
    index.add(np.eye(4, dtype=np.float32))
    seen: list[int] = []

    def search() -> None:
        index.nearest(np.ones((2, 4), np.float32))
        seen.append(faiss.omp_get_max_threads())

    worker = threading.Thread(target=search)
    worker.start()
    worker.join()
    assert seen == [1]  # OpenMP's default on a fresh thread is every core: a team spinning beside llama.cpp's
