"""Prompt pieces into a llama.cpp context: token ids and image embeddings, batch by batch.

An image enters as a `llama_batch` whose `embd` field is filled, at the positions right after the
tokens before it. `Feed` owns the two batches (tokens, embeddings) it reuses for every call.
"""

from __future__ import annotations

from edge_runtime.inference.engines import llama_cpp  # isort: skip - onnxruntime, then llama_cpp (see engines.py)

import ctypes
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_runtime.core.errors import InferenceError
from edge_runtime.inference.llm.handles import Batch


@dataclass
class Generation:
    text: str
    tokens: int
    prompt_tokens: int
    prefill_ms: float
    decode_ms: float
    finish_reason: str  # "stop" or "length"
    prefix_reused: int  # prompt tokens whose KV cache was reused
    token_ids: list[int] = field(default_factory=list)
    steps: int = 0  # llama_decode calls of the generation (not the prefill)
    llama_decode_ms: float = 0.0  # time inside them; measured only when Feed.profile is on


# What goes between the prompt's prefix and suffix: one block of image embeddings [N, D], or a
# sequence of embedding blocks and token ids (tiled images with row/column marker tokens between tiles).
ImagePart = np.ndarray | Sequence[np.ndarray | list[int]] | None
Segment = np.ndarray | list[int]


def image_segments(image: ImagePart) -> list[Segment]:
    if image is None:
        return []
    if isinstance(image, np.ndarray):
        return [image]
    return [seg for seg in image if len(seg)]


class Feed:
    """Decodes tokens and embeddings into a context, `n_batch` at a time. Not thread-safe."""

    def __init__(self, n_batch: int, n_embd: int, on_error: Callable[[], None] = lambda: None) -> None:
        self.n_batch = n_batch
        self.n_embd = n_embd
        self._on_error = on_error  # the owner forgets its cached prefix: the KV cache is in doubt
        # Profiling (benchmarks only): wait for the GPU after each decode so the time spent in it is
        # the model's, not charged to the token picking that reads its logits next.
        self.profile = False
        self.decode_calls = 0
        self.decode_s = 0.0
        with ExitStack() as stack:
            self.tokens = stack.enter_context(Batch(n_batch))
            self.embeds = stack.enter_context(Batch(n_batch, n_embd))
            self._stack = stack.pop_all()

    def close(self) -> None:
        self._stack.close()

    def segments(self, ctx: Any, segments: list[Segment], pos: int, want_last_logits: bool, seq: int = 0) -> int:
        for i, seg in enumerate(segments):
            last = want_last_logits and i == len(segments) - 1
            if isinstance(seg, np.ndarray):
                pos = self.embeddings(ctx, seg, pos, last, seq)
            else:
                pos = self.token_ids(ctx, seg, pos, last, seq)
        return pos

    def token_ids(self, ctx: Any, tokens: list[int], pos: int, want_last_logits: bool, seq: int = 0) -> int:
        """Decode `tokens` at positions pos.. of sequence `seq`; return the next position."""
        batch = self.tokens.struct
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start:start + self.n_batch]
            batch.n_tokens = len(chunk)
            for i, tok in enumerate(chunk):
                batch.token[i] = tok
                batch.pos[i] = pos + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = 0
            if want_last_logits and start + self.n_batch >= len(tokens):
                batch.logits[len(chunk) - 1] = 1
            self.decode(ctx, batch)
            pos += len(chunk)
        return pos

    def embeddings(self, ctx: Any, embeds: np.ndarray, pos: int, want_last_logits: bool, seq: int = 0) -> int:
        batch = self.embeds.struct
        embeds = np.ascontiguousarray(embeds, dtype=np.float32)
        row_bytes = self.n_embd * ctypes.sizeof(ctypes.c_float)
        for start in range(0, embeds.shape[0], self.n_batch):
            chunk = embeds[start:start + self.n_batch]
            batch.n_tokens = chunk.shape[0]
            ctypes.memmove(batch.embd, chunk.ctypes.data, chunk.shape[0] * row_bytes)
            for i in range(chunk.shape[0]):
                batch.pos[i] = pos + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = 0
            if want_last_logits and start + self.n_batch >= embeds.shape[0]:
                batch.logits[chunk.shape[0] - 1] = 1
            self.decode(ctx, batch)
            pos += chunk.shape[0]
        return pos

    def decode(self, ctx: Any, batch: llama_cpp.llama_batch) -> None:
        t0 = time.perf_counter() if self.profile else 0.0
        rc = llama_cpp.llama_decode(ctx, batch)
        if rc != 0:
            self._on_error()
            raise InferenceError(f"llama_decode failed with code {rc}")
        self.decode_calls += 1
        if self.profile:
            llama_cpp.llama_synchronize(ctx)
            self.decode_s += time.perf_counter() - t0
