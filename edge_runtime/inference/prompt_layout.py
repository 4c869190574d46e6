"""How an image is written into the prompt (image tokens, idefics3 tile grid) and split back out.

No engine imports: the offline exporter (`edge_runtime_models.export`) uses this without loading
ONNX Runtime or llama.cpp; `inspector.py` uses it at inference time.
"""

from __future__ import annotations

import numpy as np

from edge_runtime.core.bundle.manifest import ImageLayout
from edge_runtime.core.errors import InferenceError


def image_prompt(layout: ImageLayout, tokens: int, grid: tuple[int, int]) -> str:
    """The image as the model's processor writes it into the prompt: one image token per embedding,
    and for idefics3 the tile grid (row/column markers, a newline after each row, then the global image)."""
    block = layout.image_token * tokens
    if layout.kind == "single":
        return block
    rows, cols = grid
    text = ""
    for r in range(rows):
        text += "".join(f"{layout.fake_token}<row_{r + 1}_col_{c + 1}>{block}" for c in range(cols)) + "\n"
    glob = f"{layout.fake_token}{layout.global_token}{block}{layout.fake_token}"
    return text + "\n" + glob if rows else glob


def split_at_image_tokens(ids: list[int], image_token: int, embeds: np.ndarray
                          ) -> tuple[list[int], list[np.ndarray | list[int]], list[int]]:
    """Tokens before the first image token, then alternating embedding blocks and marker tokens, then the rest."""
    where = [i for i, t in enumerate(ids) if t == image_token]
    if len(where) != embeds.shape[0]:
        raise InferenceError(f"the prompt has {len(where)} image tokens for {embeds.shape[0]} image embeddings")
    if not where:
        return ids, [], []
    first, last = where[0], where[-1]
    segments: list[np.ndarray | list[int]] = []
    used, i = 0, first
    while i <= last:
        j = i
        is_image = ids[i] == image_token
        while j <= last and (ids[j] == image_token) == is_image:
            j += 1
        if is_image:
            segments.append(embeds[used:used + j - i])
            used += j - i
        else:
            segments.append(ids[i:j])
        i = j
    return ids[:first], segments, ids[last + 1:]
