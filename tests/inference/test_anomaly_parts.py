"""The gate's parts without a model: the patch layout against the real preprocessing, the coreset,
the search, the bank file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.core.bundle.manifest import Preprocess
from edge_runtime.inference.anomaly import BankCorrupt, read_bank, verify_bank, write_bank
from edge_runtime.inference.anomaly.bank import BankEncoder, BankHeader, BankLayout, BankVectors
from edge_runtime.inference.anomaly.coreset import greedy_coreset
from edge_runtime.inference.anomaly.features import EncoderId, GateContext, patch_positions
from edge_runtime.inference.anomaly.layout import PatchLayout, factor_grid, media_layout, onnx_layout
from edge_runtime.inference.anomaly.search import PatchIndex
from edge_runtime.inference.vision import Preprocessor

PATCH = 16
BASE: dict[str, Any] = {"width": 64, "height": 64, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5],
                        "resize": "nearest"}


def _patch_of_dot(spec: Preprocess, frame: np.ndarray) -> tuple[int, int]:
    """(embedding index, embeddings per tile) of the patch where the preprocessed frame's dot landed."""
    tensor, _ = Preprocessor(spec).process(frame)
    t, y, x = np.unravel_index(int(tensor[:, 0].argmax()), tensor[:, 0].shape)
    cols = spec.width // PATCH
    per_tile = cols * (spec.height // PATCH)
    return int(t * per_tile + (y // PATCH) * cols + x // PATCH), per_tile


@pytest.mark.parametrize(("extra", "size", "dot"), [
    ({}, (200, 120), (150, 30)),                                  # stretched to the input
    ({"keep_aspect": True}, (200, 120), (20, 100)),               # letterboxed
    ({"keep_aspect": True}, (90, 200), (70, 10)),
    ({"shortest_edge": 64}, (200, 120), (120, 60)),               # centre-cropped
    ({"tiling": {"longest_edge": 128}}, (200, 120), (170, 20)),   # tiles + the global image
])
def test_the_layout_puts_each_patch_where_the_preprocessing_took_it(extra: dict[str, Any], size: tuple[int, int],
                                                                     dot: tuple[int, int]) -> None:
    spec = Preprocess.model_validate({**BASE, **extra})
    w, h = size
    frame = np.zeros((h, w, 3), np.uint8)
    frame[dot[1] - 2:dot[1] + 3, dot[0] - 2:dot[0] + 3] = 255
    index, per_tile = _patch_of_dot(spec, frame)
    _, grid = Preprocessor(spec).process(frame)
    tiles = grid[0] * grid[1] + 1 if grid != (0, 0) else 1
    layout = onnx_layout(spec, w, h, grid, tiles * per_tile)
    box = layout.patch_box(index)
    assert box is not None
    assert box[0] - 3 <= dot[0] <= box[2] + 3 and box[1] - 3 <= dot[1] <= box[3] + 3, (box, dot)


class _Media:
    """What media_layout reads of libmtmd's MediaEmbeds: its length and M-RoPE positions."""

    def __init__(self, n: int, mrope: np.ndarray | None = None) -> None:
        self.n, self.mrope = n, mrope

    def __len__(self) -> int:
        return self.n


def test_a_libmtmd_image_is_laid_out_from_its_positions_or_its_square() -> None:
    rows, cols = 6, 10
    r, c = np.divmod(np.arange(rows * cols), cols)
    mrope = np.stack([np.zeros_like(r), r, c, np.zeros_like(r)]).astype(np.int32)  # t, y, x, z
    qwen = media_layout([_Media(60, mrope)], 640, 384)
    assert qwen.grid() == [[6, 10]] and qwen.blocks[0].box == (0.0, 0.0, 640.0, 384.0)
    gemma = media_layout([_Media(256)], 896, 896)
    assert gemma.grid() == [[16, 16]]
    slices = media_layout([_Media(64), _Media(64), _Media(64)], 800, 600)
    assert all(b.box is None for b in slices.blocks) and slices.patches == 192  # scored, not placed
    odd = media_layout([_Media(60)], 640, 384)
    assert odd.blocks[0].box is None
    told = media_layout([_Media(60)], 640, 384, grids=[(6, 10)])
    assert told.grid() == [[6, 10]] and told.blocks[0].box is not None


def test_unplaced_blocks_sit_far_from_every_placed_patch() -> None:
    layout = PatchLayout((*media_layout([_Media(16)], 64, 64).blocks, *media_layout([_Media(4), _Media(4)], 64, 64)
                          .blocks), 64, 64)
    pos = patch_positions(layout)
    assert pos.shape == (24, 2)
    assert pos[:16, 0].max() < 10 and pos[16:, 0].min() > 500


def test_factor_grid_follows_the_aspect() -> None:
    assert factor_grid(64, 1.0) == (8, 8)
    assert factor_grid(60, 0.6) == (6, 10)
    assert factor_grid(7, 1.0) in ((1, 7), (7, 1))


def test_the_coreset_keeps_the_rare_patterns_a_random_pick_loses() -> None:
    """Most patches are plain metal; a few are the rare good details (a label's edge): keep those."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((21, 200)).astype(np.float32) * 3
    which = np.concatenate([np.zeros(3900, int), np.repeat(np.arange(1, 21), 5)])
    x = (centres[which] + rng.standard_normal((4000, 200)).astype(np.float32) * 0.2)
    chosen = greedy_coreset(x, 200, seed=1)
    assert len(set(chosen.tolist())) == 200
    assert np.array_equal(chosen, greedy_coreset(x, 200, seed=1))  # deterministic for a seed

    def radius(idx: np.ndarray) -> float:
        index = PatchIndex(x.shape[1])
        index.add(x[idx])
        return float(index.nearest(x).max())

    assert radius(chosen) < 0.5 * radius(rng.choice(4000, 200, replace=False))
    assert np.array_equal(greedy_coreset(x[:50], 200), np.arange(50))  # fewer than asked: all of them


def test_the_exact_search_matches_brute_force() -> None:
    rng = np.random.default_rng(2)
    bank, q = rng.standard_normal((3000, 64)).astype(np.float32), rng.standard_normal((50, 64)).astype(np.float32)
    index = PatchIndex(64)
    index.add(bank[:1000])
    index.add(bank[1000:])
    brute = np.sqrt(((q[:, None] - bank[None]) ** 2).sum(-1).min(1))
    assert np.allclose(index.nearest(q), brute, rtol=1e-4)


def _header(n: int, d: int) -> BankHeader:
    return BankHeader(created="2026-12-04T00:00:00.000Z",
                      encoder=BankEncoder(kind="onnx", file="vision.onnx", sha256="a" * 64, bundle="b@1"),
                      budget={"preprocess": {"width": 64}}, region=(1, 2, 3, 4),
                      layout=BankLayout(width=64, height=64, grid=[(2, 2)], embed_dim=d - 2, position_weight=0.5),
                      vectors=BankVectors(patches=n, dim=d))


def test_a_bank_file_reads_back_as_written_and_any_flipped_byte_is_caught(tmp_path: Path) -> None:
    vectors = np.random.default_rng(4).standard_normal((40, 10)).astype(np.float32)
    path = tmp_path / "b.bank"
    header = write_bank(path, _header(40, 10), vectors)
    context = GateContext(EncoderId("onnx", "vision.onnx", "a" * 64), {"preprocess": {"width": 64}}, (1, 2, 3, 4))
    loaded = read_bank(path, 1 << 20, context)
    assert loaded.header == header and loaded.index.size == 40
    assert np.allclose(loaded.index.nearest(vectors[:3]), 0, atol=1e-3)
    assert verify_bank(path) == header
    data = path.read_bytes()
    for at in (20, len(data) // 2, len(data) - 1):  # the header, the middle, the last value
        bad = tmp_path / f"bad{at}.bank"
        bad.write_bytes(data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1:])
        with pytest.raises(BankCorrupt):
            read_bank(bad, 1 << 20, context)
        with pytest.raises(BankCorrupt):
            verify_bank(bad)
