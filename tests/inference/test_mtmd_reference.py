"""Format-2 bundles against transformers: the first-token logits of our path on a converted tiny pair
against the Hugging Face model it was converted from, on the same token ids and image.

Measured on the 2-core machine (max |difference| of the first-token logits, logits' std ~2):
text alone 7-9e-3 for every family (llama.cpp keeps the KV cache in f16, transformers in f32);
Qwen2.5-VL 8.9e-3, Qwen3-VL 5.5e-3 (deepstack rows and interleaved M-RoPE) and Gemma 3 1.6e-3 with
the image (libmtmd preprocesses these sizes exactly as the HF processors do); SmolVLM 0.13-0.38:
libmtmd resizes the global image 64 -> 32 px with its own filter (its tiles, cut without resizing,
match). The tolerances below sit ~2x above those; the argmax agrees.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.inference.llm.mtmd import MediaEmbeds
from tests.inference.test_mtmd_paths import PROMPT, frames, make_inspector
from tests.support.tiny_pairs import TinyPair

# family: (image size that libmtmd and the HF processor lay out alike, tolerance on the logits)
CASES = {"qwen2.5-vl": ((112, 84), 2e-2), "gemma3": ((64, 64), 1e-2), "smolvlm": ((64, 64), 0.8),
         "qwen3-vl": ((128, 96), 2e-2)}


def hf_logits(pair: TinyPair, ids: list[int], image_mask: list[int], rgb: np.ndarray) -> np.ndarray:
    import torch
    import transformers
    from PIL import Image

    model = transformers.AutoModelForImageTextToText.from_pretrained(pair.hf_dir, dtype=torch.float32).eval()
    processor = transformers.AutoImageProcessor.from_pretrained(pair.hf_dir)
    inputs: dict[str, Any] = dict(processor(images=[Image.fromarray(rgb)], return_tensors="pt"))
    inputs["input_ids"] = torch.tensor([ids])
    inputs["attention_mask"] = torch.ones(1, len(ids), dtype=torch.long)
    if pair.family in ("qwen2.5-vl", "qwen3-vl"):  # which tokens are the image's: M-RoPE positions come from it
        inputs["mm_token_type_ids"] = torch.tensor([image_mask], dtype=torch.int32)
    if pair.family == "gemma3":  # bidirectional attention over the image tokens
        inputs["token_type_ids"] = torch.tensor([image_mask])
    with torch.no_grad():
        return np.asarray(model(**inputs).logits[0, -1].numpy())


@pytest.mark.parametrize("family", list(CASES))
def test_first_token_logits_agree_with_transformers(family: str, tiny_pairs: Callable[[str], TinyPair],
                                                    tmp_path: Path) -> None:
    pair = tiny_pairs(family)
    size, tolerance = CASES[family]
    frame = frames(1, seed=5, size=size)[0]
    with make_inspector(pair, tmp_path / family) as ins:
        prefix, image, suffix = ins.sequence(PROMPT, ins.encode(frame))
        ins.language.forget_prefix(clear=True)
        ours = ins.language.prompt_logits(prefix, image, suffix)
    config = json.loads((pair.hf_dir / "config.json").read_text())
    image_token = config.get("image_token_id", config.get("image_token_index"))
    ids, mask = list(prefix), [0] * len(prefix)
    assert isinstance(image, list)
    for seg in image:  # the same token ids, an image token where each embedding goes
        n = len(seg)
        ids += [image_token] * n if isinstance(seg, MediaEmbeds) else list(seg)
        mask += [int(isinstance(seg, MediaEmbeds))] * n
    ids += suffix
    mask += [0] * len(suffix)
    ref = hf_logits(pair, ids, mask, np.ascontiguousarray(frame[:, :, ::-1]))
    assert ref.std() > 0.5
    assert np.abs(ours - ref).max() <= tolerance
    assert int(ours.argmax()) == int(ref.argmax())
