"""Prompt pieces into a llama.cpp context: token ids and image embeddings, batch by batch.

An image enters as a `llama_batch` whose `embd` field is filled, at the positions right after the
tokens before it. `Feed` owns the two batches (tokens, embeddings) it reuses for every call.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_runtime.core.errors import InferenceError
from edge_runtime.inference.llm.handles import Batch, Context, DecodeError
from edge_runtime.inference.llm.mtmd import MediaEmbeds


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
    batched: float = 1.0  # sequences decoded together with it, on average over its steps (its energy share)
    forced: int = 0  # tokens the grammar forced (decoded after the chosen token of their step, fast-forward)
    drafted: int = 0  # tokens a draft model guessed for it (speculative decoding, draft.py)
    draft_accepted: int = 0  # of them, those it picked too


# What goes between the prompt's prefix and suffix: one block of image embeddings [N, D], or a
# sequence of embedding blocks and token ids (tiled images with row/column marker tokens between tiles);
# libmtmd's images come as MediaEmbeds (their positions, n_pos and attention mode with them).
Segment = np.ndarray | list[int] | MediaEmbeds
ImagePart = np.ndarray | Sequence[Segment] | None


@dataclass(frozen=True, eq=False)
class Prefix:
    """A prompt's fixed head that holds images besides tokens (an inspection program's system text,
    reference images and captions): its KV is decoded once and kept, reused and copied between slots
    like a token prefix. `len()` is the positions it takes (where the rest of the prompt starts, what
    a slot is cut back to); `cells` the KV cells it fills. Two prefixes with one `key` hold the same KV."""

    key: str
    segments: tuple[Segment, ...]

    def __len__(self) -> int:
        return sum(seg.n_pos if isinstance(seg, MediaEmbeds) else len(seg) for seg in self.segments)

    @property
    def cells(self) -> int:
        return sum(len(seg) for seg in self.segments)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Prefix) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)


Head = list[int] | Prefix  # what comes before a prompt's image: tokens, or a Prefix holding images too


def head_cells(head: Head) -> int:
    """KV cells the head fills (a Prefix's images may fill more cells than they take positions)."""
    return head.cells if isinstance(head, Prefix) else len(head)


def head_tokens(head: Head) -> list[int]:
    """The head's token ids where it is plain tokens; a Prefix's text pieces run together (what a
    text-only draft model reads of it)."""
    if isinstance(head, Prefix):
        return [t for seg in head.segments if isinstance(seg, list) for t in seg]
    return head


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
            # room for M-RoPE's 4 positions per embedding (section-major over the batch)
            self.embeds = stack.enter_context(Batch(n_batch, n_embd, n_pos=4))
            self._stack = stack.pop_all()

    def close(self) -> None:
        self._stack.close()

    def segments(self, ctx: Context, segments: list[Segment], pos: int, want_last_logits: bool, seq: int = 0) -> int:
        for i, seg in enumerate(segments):
            last = want_last_logits and i == len(segments) - 1
            if isinstance(seg, MediaEmbeds):
                pos = self.media(ctx, seg, pos, last, seq)
            elif isinstance(seg, np.ndarray):
                pos = self.embeddings(ctx, seg, pos, last, seq)
            else:
                pos = self.token_ids(ctx, seg, pos, last, seq)
        return pos

    def head(self, ctx: Context, head: Head, seq: int = 0) -> int:
        """A prompt's head at positions 0.. of `seq` (no logits kept); returns the next position."""
        if isinstance(head, Prefix):
            return self.segments(ctx, [s for s in head.segments if len(s)], 0, False, seq)
        return self.token_ids(ctx, head, 0, False, seq)

    def token_ids(self, ctx: Context, tokens: list[int], pos: int, want_last_logits: bool, seq: int = 0) -> int:
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

    def media(self, ctx: Context, media: MediaEmbeds, pos: int, want_last_logits: bool, seq: int = 0) -> int:
        """One libmtmd image chunk at pos.. of `seq`, as `mtmd_helper_decode_image_chunk` decodes it:
        positions from the chunk (M-RoPE: [4, n] section-major per batch), bidirectional attention
        around it when the projector asks (the whole image in one micro-batch then); the next position
        is pos + the chunk's n_pos, not + its embedding count."""
        n = len(media)
        if media.non_causal and n > self.n_batch:
            raise InferenceError(f"the image is {n} embeddings, more than model.batch_size {self.n_batch}; "
                                 "its attention is bidirectional, so it must fit one batch")
        if media.embeds.shape[1] != self.n_embd:
            raise InferenceError(f"image embeddings are {media.embeds.shape[1]} wide, the language model "
                                 f"takes {self.n_embd}")
        batch = self.embeds.struct
        embeds = np.ascontiguousarray(media.embeds, dtype=np.float32)
        row_bytes = self.n_embd * ctypes.sizeof(ctypes.c_float)
        if media.non_causal:
            ctx.set_causal_attn(False)
        try:
            for start in range(0, n, self.n_batch):
                stop = min(n, start + self.n_batch)
                batch.n_tokens = stop - start
                ctypes.memmove(batch.embd, embeds[start:].ctypes.data, (stop - start) * row_bytes)
                self.embeds.use_positions(media.positions(pos, start, stop))
                for i in range(stop - start):
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = seq
                    batch.logits[i] = 0
                if want_last_logits and stop == n:
                    batch.logits[stop - start - 1] = 1
                self.decode(ctx, batch)
        finally:
            if media.non_causal:
                ctx.set_causal_attn(True)
        return pos + media.n_pos

    def embeddings(self, ctx: Context, embeds: np.ndarray, pos: int, want_last_logits: bool, seq: int = 0) -> int:
        batch = self.embeds.struct
        self.embeds.use_positions(())  # the plain position array
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

    def decode(self, ctx: Context, batch: Any) -> None:
        """`batch`: the struct of one of this feed's batches (or a caller's, filled the same way)."""
        t0 = time.perf_counter() if self.profile else 0.0
        try:
            ctx.decode(batch)
        except DecodeError:
            self._on_error()
            raise
        self.decode_calls += 1
        if self.profile:
            ctx.synchronize()
            self.decode_s += time.perf_counter() - t0
