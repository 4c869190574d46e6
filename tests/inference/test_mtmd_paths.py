"""Format-2 bundles (GGUF + mmproj) through our own decoding path, against libmtmd's helper path.

On tiny random-weight pairs of Qwen2.5-VL (M-RoPE), Qwen3-VL (interleaved M-RoPE, deepstack embeddings
3 x the model's width), Gemma 3 (bidirectional attention over the image), SmolVLM (tiles), LFM2-VL
(a hybrid convolution + attention decoder), InternVL (tiles + thumbnail, a Qwen2 decoder), Kimi-VL
(MoonViT, a DeepSeek-V3-style MoE decoder with MLA attention) and MiniCPM-V 4.6 (slices, a Qwen3.5
hybrid linear-attention decoder): the first-token logits of our
`llama_batch` path equal `mtmd_helper_eval_chunks`' (<= 1e-5; LFM2-VL and Kimi-VL 1e-4); greedy
verdicts agree one at a time, batched and with the prefix reused; a mutation of the positions, of
the attention mode or of the rows' order breaks the equality, so the equality test can fail.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.config import Config
from edge_runtime.core.batch import BatchJob
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.core.errors import InferenceError, InputError
from edge_runtime.inference.encoding import MediaEncoded
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.feed import ImagePart
from edge_runtime.inference.llm.mtmd import MediaEmbeds
from tests.support.tiny_pairs import FAMILIES, TinyPair, write_pair_bundle

PROMPT = "Inspect the part. Answer in JSON."
TOLERANCE = 1e-5


def tolerance(ins: Inspector) -> float:
    """1e-5 for every family: the projector's begin token is decoded with the prompt before it, as on the
    helper path (alone in a batch of its own, LFM2-VL and Kimi-VL's one-row kernels rounded up to 3.6e-5)."""
    return TOLERANCE


def frames(n: int, seed: int, size: tuple[int, int] = (128, 96)) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8) for _ in range(n)]


def make_inspector(pair: TinyPair, root: Path, **model: object) -> Inspector:
    cfg = Config(device_id="test-device")
    settings = cfg.model.model_copy(update={"threads": 2, "warmup": False, **model})
    return Inspector(load_bundle(write_pair_bundle(pair, root)), settings, "test-device")


@pytest.fixture(scope="module", params=FAMILIES)
def family_inspector(request: pytest.FixtureRequest, tiny_pairs: Callable[[str], TinyPair],
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inspector]:
    ins = make_inspector(tiny_pairs(request.param), tmp_path_factory.mktemp("pair") / request.param)
    yield ins
    ins.close()


def helper_logits(ins: Inspector, frame: np.ndarray) -> np.ndarray:
    """libmtmd's own path: the whole prompt through mtmd_tokenize and mtmd_helper_eval_chunks."""
    assert ins.mtmd is not None
    p = ins.bundle.manifest.prompt
    text = p.template.format(system=p.system, image=ins.mtmd.marker, prompt=PROMPT)
    lm = ins.language
    lm.forget_prefix(clear=True)
    with ins.mtmd.tokenize(text, [frame[:, :, ::-1].copy()], add_special=True) as chunks:
        ins.mtmd.eval_chunks(lm.ctx, chunks, 0, 0, lm.n_batch)
    lm.forget_prefix(clear=True)
    return lm.ctx.logits_ith(-1).copy()


def mutate(image: ImagePart, how: str | None) -> ImagePart:
    """The image part with one rule of decoding broken: `positions` (M-RoPE's y and x sections swapped,
    the image read transposed), `causal` (causal attention over an image that wants bidirectional) or
    `order` (the embedding rows reversed: plain positions, the image read backwards)."""
    if how is None or not isinstance(image, list):
        return image
    out = []
    for seg in image:
        if isinstance(seg, MediaEmbeds) and how == "positions" and seg.mrope is not None:
            seg = dataclasses.replace(seg, mrope=seg.mrope[[0, 2, 1, 3]])
        elif isinstance(seg, MediaEmbeds) and how == "causal":
            seg = dataclasses.replace(seg, non_causal=False)
        elif isinstance(seg, MediaEmbeds) and how == "order":
            seg = dataclasses.replace(seg, embeds=seg.embeds[::-1].copy())
        out.append(seg)
    return out


def our_logits(ins: Inspector, frame: np.ndarray, how: str | None = None) -> np.ndarray:
    prefix, image, suffix = ins.sequence(PROMPT, ins.encode(frame))
    ins.language.forget_prefix(clear=True)
    return ins.language.prompt_logits(prefix, mutate(image, how), suffix)


def test_first_token_logits_equal_the_mtmd_helper(family_inspector: Inspector) -> None:
    enc = family_inspector.encode(frames(1, seed=1)[0])
    assert enc.embeds.std(axis=0).mean() > 0.05  # the image's embeddings differ row to row: a real image
    for frame in frames(2, seed=1):
        ours, ref = our_logits(family_inspector, frame), helper_logits(family_inspector, frame)
        assert ref.std() > 0.5  # random weights that spread the logits: the tolerance means something
        assert np.abs(ours - ref).max() <= tolerance(family_inspector)


@pytest.mark.parametrize(("family", "how"), [("qwen2.5-vl", "positions"), ("qwen3-vl", "positions"),
                                                  ("gemma3", "causal"), ("lfm2-vl", "order"), ("internvl", "order"),
                                                  ("kimi-vl", "order"), ("minicpm-v", "order")])
def test_a_broken_decoding_rule_fails_the_equality(family: str, how: str, tiny_pairs: Callable[[str], TinyPair],
                                                   tmp_path: Path) -> None:
    with make_inspector(tiny_pairs(family), tmp_path / family) as ins:
        frame = frames(1, seed=2)[0]
        ref = helper_logits(ins, frame)
        assert np.abs(our_logits(ins, frame) - ref).max() <= tolerance(ins)
        assert np.abs(our_logits(ins, frame, how) - ref).max() > 100 * tolerance(ins)


def test_verdicts_agree_one_at_a_time_batched_and_prefix_reused(family_inspector: Inspector) -> None:
    ins = family_inspector
    encoded = [ins.encode(f) for f in frames(3, seed=3)]
    items = [ins.sequence(PROMPT, enc) for enc in encoded]
    fresh = []
    for prefix, image, suffix in items:
        ins.language.forget_prefix(clear=True)
        fresh.append(ins.generate(prefix, image, suffix, ins.grammar, ins.max_tokens))
    reused = [ins.generate(prefix, image, suffix, ins.grammar, ins.max_tokens) for prefix, image, suffix in items]
    # LFM2's short-convolution and Qwen3.5's linear-attention states cannot be cut back to the prefix
    # (llama.cpp refuses a partial memory_seq_rm of a recurrent state): the prompt is read again.
    recurrent = ins.bundle.manifest.mtmd is not None and ins.bundle.manifest.mtmd.projector in ("lfm2", "minicpmv4_6")
    expected = 0 if recurrent else len(items[0][0])
    assert [g.prefix_reused for g in reused][1:] == [expected] * 2
    results = ins.inspect_batch([BatchJob(enc, camera=f"cam{i}") for i, enc in enumerate(encoded)])
    batched = ins.generate_batch(items, ins.grammar, ins.max_tokens)
    assert [g.token_ids for g in reused] == [g.token_ids for g in fresh] == [g.token_ids for g in batched]
    for gen, result in zip(fresh, results, strict=True):
        assert not isinstance(result, Exception), result
        verdict = json.loads(gen.text)  # strict: no control characters, nothing around the object
        assert verdict == result.verdict == ins.parse_verdict(gen)  # parse_verdict checks the schema
        assert set(verdict) == {"defect", "category"}


def test_an_image_over_the_token_budget_is_one_clear_error(tiny_pairs: Callable[[str], TinyPair],
                                                           tmp_path: Path) -> None:
    """libmtmd shrinks an image to the budget where the projector can (Qwen's dynamic resolution, fewer
    SmolVLM tiles); Gemma 3 always makes 16 tokens, so a budget of 8 cannot hold one image."""
    for family, tokens in (("qwen2.5-vl", 6), ("smolvlm", 8)):
        with make_inspector(dataclasses.replace(tiny_pairs(family), image_max_tokens=8), tmp_path / family) as ins:
            enc = ins.encode(frames(1, seed=4)[0])
            assert isinstance(enc, MediaEncoded) and len(enc.embeds) == tokens
    with make_inspector(dataclasses.replace(tiny_pairs("gemma3"), image_max_tokens=8), tmp_path / "gemma3") as ins:
        with pytest.raises(InputError, match=r"^image: 128x96 makes 16 image tokens, more than the bundle's "
                                             r"budget of 8 \(mtmd.image_max_tokens\)$"):
            ins.encode(frames(1, seed=4)[0])


def test_encoding_while_generating_changes_nothing(family_inspector: Inspector) -> None:
    """The worker's overlap: libmtmd encodes frame N+1 (its own lock) while llama.cpp generates frame N."""
    ins = family_inspector
    images = frames(4, seed=6)
    alone = []
    for frame in images:
        ins.language.forget_prefix(clear=True)
        alone.append(ins.generate(*ins.sequence(PROMPT, ins.encode(frame)), ins.grammar, ins.max_tokens).token_ids)
    with ThreadPoolExecutor(max_workers=1) as encoder:
        pending = encoder.submit(ins.encode, images[0])
        overlapped = []
        for i in range(len(images)):
            enc = pending.result()
            if i + 1 < len(images):
                pending = encoder.submit(ins.encode, images[i + 1])  # runs during the generation below
            ins.language.forget_prefix(clear=True)
            overlapped.append(ins.generate(*ins.sequence(PROMPT, enc), ins.grammar, ins.max_tokens).token_ids)
    assert overlapped == alone


def test_a_bare_embedding_block_on_an_mrope_model_is_refused(tiny_pairs: Callable[[str], TinyPair],
                                                             tmp_path: Path) -> None:
    with make_inspector(tiny_pairs("qwen2.5-vl"), tmp_path / "qwen") as ins:
        enc = ins.encode(frames(1, seed=7)[0])
        prefix, _, suffix = ins.sequence(PROMPT, enc)
        with pytest.raises(InferenceError, match="uses M-RoPE: its images must come from libmtmd"):
            ins.generate(prefix, enc.embeds, suffix, ins.grammar, ins.max_tokens)
        assert ins.inspect(frames(1, seed=7)[0]).verdict  # and the model still works


def test_a_bidirectional_image_larger_than_the_batch_is_one_clear_error(
        tiny_pairs: Callable[[str], TinyPair], tmp_path: Path) -> None:
    """Gemma 3's image must sit in one micro-batch (its attention is bidirectional): 16 > batch_size 8."""
    with make_inspector(tiny_pairs("gemma3"), tmp_path / "gemma3", batch_size=8) as ins:
        with pytest.raises(InferenceError, match=r"^the image is 16 embeddings, more than model.batch_size 8; "
                                                 r"its attention is bidirectional, so it must fit one batch$"):
            ins.inspect(frames(1, seed=8)[0])
