"""Several images in one prompt (a GGUF + mmproj bundle): our `llama_batch` path against libmtmd's
`mtmd_helper_eval_chunks` on the same prompt, one media marker per image at the template's image
slot. On every tiny pair (Qwen2.5-VL's M-RoPE: the second image's positions continue from the
first's n_pos; Gemma 3's bidirectional attention inside each image; ...) the first-token logits of
two and three images agree to 1e-5; shifting the first image's positions (Qwen2.5-VL, Gemma 3)
breaks it, so the equality can fail."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.config import Config
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.core.errors import InputError
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.feed import ImagePart
from edge_runtime.inference.llm.mtmd import MediaEmbeds
from tests.support.mtmd_reference import helper_logits
from tests.support.tiny_pairs import FAMILIES, TinyPair, write_pair_bundle

PROMPT = "Compare the two parts. Answer in JSON."
TOLERANCE = 1e-5


def frames(n: int, seed: int, size: tuple[int, int] = (128, 96)) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8) for _ in range(n)]


def make_inspector(pair: TinyPair, root: Path) -> Inspector:
    settings = Config(device_id="t").model.model_copy(update={"threads": 2, "warmup": False})
    return Inspector(load_bundle(write_pair_bundle(pair, root)), settings, "t")


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair_inspector(request: pytest.FixtureRequest, tiny_pairs: Callable[[str], TinyPair],
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inspector]:
    ins = make_inspector(tiny_pairs(request.param), tmp_path_factory.mktemp("pair") / request.param)
    yield ins
    ins.close()


def shift_first_image(image: ImagePart) -> ImagePart:
    """The first image's positions moved: M-RoPE's sections + 2 (Qwen2.5-VL); with plain positions
    (Gemma 3) the first image's embeddings decoded where the second's go and the other way round."""
    assert isinstance(image, list)
    media = [i for i, seg in enumerate(image) if isinstance(seg, MediaEmbeds)]
    out = list(image)
    first = image[media[0]]
    assert isinstance(first, MediaEmbeds)
    if first.mrope is not None:
        out[media[0]] = dataclasses.replace(first, mrope=first.mrope + 2)
    else:
        second = image[media[-1]]
        assert isinstance(second, MediaEmbeds) and len(second) == len(first)
        out[media[0]], out[media[-1]] = second, first
    return out


def our_logits(ins: Inspector, images: list[np.ndarray], mutate: bool = False) -> np.ndarray:
    prefix, image, suffix = ins.sequence(PROMPT, [ins.encode(img) for img in images])
    ins.language.forget_prefix(clear=True)
    return ins.language.prompt_logits(prefix, shift_first_image(image) if mutate else image, suffix)


def test_two_image_logits_equal_the_mtmd_helper(pair_inspector: Inspector) -> None:
    images = frames(2, seed=21)
    ours, ref = our_logits(pair_inspector, images), helper_logits(pair_inspector, images, PROMPT)
    assert ref.std() > 0.5  # random weights that spread the logits: the tolerance means something
    assert np.abs(ours - ref).max() <= TOLERANCE
    # Both images count: the same prompt with the second image replaced gives other logits.
    other = our_logits(pair_inspector, [images[0], frames(1, seed=22)[0]])
    assert np.abs(other - ref).max() > 100 * TOLERANCE


@pytest.mark.parametrize("family", ["qwen2.5-vl", "gemma3"])
def test_shifting_the_first_images_positions_fails_the_equality(family: str, tiny_pairs: Callable[[str], TinyPair],
                                                                tmp_path: Path) -> None:
    with make_inspector(tiny_pairs(family), tmp_path / family) as ins:
        images = frames(2, seed=23)
        ref = helper_logits(ins, images, PROMPT)
        assert np.abs(our_logits(ins, images) - ref).max() <= TOLERANCE
        assert np.abs(our_logits(ins, images, mutate=True) - ref).max() > 100 * TOLERANCE


def test_three_images_and_a_repeated_one_agree_too(pair_inspector: Inspector) -> None:
    """The same image twice is two places in the prompt (the cache hands the second its embeddings;
    the layout still gives each its own positions)."""
    a, b = frames(2, seed=24)
    images = [a, b, a]
    assert np.abs(our_logits(pair_inspector, images) - helper_logits(pair_inspector, images, PROMPT)).max() <= TOLERANCE


def test_an_onnx_bundle_refuses_several_images_in_one_line(inspector: Inspector) -> None:
    encs = [inspector.encode(f) for f in frames(2, seed=25)]
    with pytest.raises(InputError, match=r"^messages: this model \(onnx bundle\) takes one image per request"):
        inspector.sequence(PROMPT, encs)
    assert inspector.several_images is False

