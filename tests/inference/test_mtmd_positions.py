"""libmtmd's image positions read in one call (mtmd.decoder_positions) against one
`mtmd_image_tokens_get_decoder_pos` call per token, the way llama.cpp's helper lays them out for a batch.

On the tiny Qwen2.5-VL pair (M-RoPE) with image grids wider than tall, taller than wide and square, at
first positions 0, 1 and 37: the positions, and those `MediaEmbeds.positions` derives for any first
position and any slice of rows, are the per-token calls' exactly. A grid with nx != ny makes a swap of
the y and x sections visible, so the equality can fail.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from llama_cpp import mtmd_cpp

from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.mtmd import MediaEmbeds, chunk_is_image, chunk_tokens, decoder_positions
from tests.inference.test_mtmd_paths import make_inspector
from tests.support.tiny_pairs import TinyPair

# (width, height) in pixels: the tiny Qwen2.5-VL's processor keeps them within 56..112 px a side
SIZES = [(112, 56), (56, 112), (112, 112), (84, 56)]


@pytest.fixture(scope="module")
def qwen(tiny_pairs: Callable[[str], TinyPair], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inspector]:
    ins = make_inspector(tiny_pairs("qwen2.5-vl"), tmp_path_factory.mktemp("pos") / "qwen")
    assert ins.mtmd is not None and ins.mtmd.use_mrope  # else the positions compared are the plain ones
    yield ins
    ins.close()


def per_token(chunk: object, pos0: int) -> np.ndarray:
    """[4, N] section-major (t, y, x, z), one libmtmd call per token (the loop this replaced)."""
    image = mtmd_cpp.mtmd_input_chunk_get_tokens_image(chunk)
    n = int(mtmd_cpp.mtmd_image_tokens_get_n_tokens(image))
    out = np.empty((4, n), np.int32)
    for i in range(n):
        p = mtmd_cpp.mtmd_image_tokens_get_decoder_pos(image, pos0, i)
        out[:, i] = (p.t, p.y, p.x, p.z)
    return out


def image_chunk(ins: Inspector, rgb: np.ndarray, check: Callable[[object], None]) -> None:
    assert ins.mtmd is not None
    with ins.mtmd.tokenize(ins.mtmd.marker, [rgb]) as chunks:
        (chunk,) = [c for c in chunks if chunk_is_image(c)]
        check(chunk)


@pytest.mark.parametrize("size", SIZES)
def test_positions_read_in_one_call_equal_the_per_token_calls(qwen: Inspector, size: tuple[int, int]) -> None:
    rgb = np.random.default_rng(size[0] * size[1]).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)

    def check(chunk: object) -> None:
        image = mtmd_cpp.mtmd_input_chunk_get_tokens_image(chunk)
        nx, ny = (int(mtmd_cpp.mtmd_image_tokens_get_nx(image)), int(mtmd_cpp.mtmd_image_tokens_get_ny(image)))
        for pos0 in (0, 1, 37):
            ref = per_token(chunk, pos0)
            got = decoder_positions(chunk, pos0)
            assert got.dtype == np.int32 and got.shape == (4, nx * ny)
            assert np.array_equal(got, ref)
            if nx != ny:  # the y and x sections differ: reading them swapped would fail
                assert not np.array_equal(got[[0, 2, 1, 3]], ref)

    image_chunk(qwen, rgb, check)


def test_media_positions_at_any_first_position_and_slice_equal_the_per_token_calls(qwen: Inspector) -> None:
    assert qwen.mtmd is not None
    rgb = np.random.default_rng(9).integers(0, 256, (56, 112, 3), dtype=np.uint8)

    def check(chunk: object) -> None:
        assert qwen.mtmd is not None
        media = qwen.mtmd.media(chunk)
        assert isinstance(media, MediaEmbeds) and media.mrope is not None
        n = len(media)
        for pos0 in (0, 5, 1000):
            ref = per_token(chunk, pos0)
            assert np.array_equal(media.positions(pos0), ref.ravel())
            for start, stop in ((0, n // 2), (n // 2, n), (1, n - 1)):  # batch by batch, as feed.py cuts them
                assert np.array_equal(media.positions(pos0, start, stop), ref[:, start:stop].ravel())

    image_chunk(qwen, rgb, check)


def test_text_chunk_tokens_read_in_one_call_equal_the_per_token_reads(qwen: Inspector) -> None:
    assert qwen.mtmd is not None
    rgb = np.zeros((56, 56, 3), np.uint8)
    with qwen.mtmd.tokenize(f"You inspect parts.{qwen.mtmd.marker}Inspect the part.", [rgb]) as chunks:
        texts = [c for c in chunks if not chunk_is_image(c)]
        assert texts
        for chunk in texts:
            n = ctypes.c_size_t()
            ptr = mtmd_cpp.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
            assert n.value > 0
            assert chunk_tokens(chunk) == [int(ptr[i]) for i in range(n.value)]
