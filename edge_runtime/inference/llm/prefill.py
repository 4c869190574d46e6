"""The prefill of sequences that start together (a frame's regions, cameras joining one batch): the
pieces of their prompts (token runs, image embeddings) packed into as few llama_decode calls as
`n_batch` allows, instead of one sequence after the other (one decode per region's image).

A llama_batch holds tokens or embeddings, never both, so the sequences advance in rounds: each round
decodes the next piece of as many sequences as fit, images first while any sequence is at one. Every
piece keeps the positions it has when its sequence is prefilled alone (an M-RoPE image's four sections
are laid out section-major over the whole batch), so each sequence's KV is what its own prefill makes.
Whole pieces are packed, so a batch's rows are whole images (llama.cpp computes a batch of equal rows
as one graph); a causal piece larger than a batch is split across batches, as alone.

An image whose attention is bidirectional (Gemma 3) must be whole in one micro-batch. Over per-sequence
KV streams llama.cpp splits a batch into micro-batches of equally many rows of each sequence, so such
an image goes only with images of its own length, at most n_batch (= n_ubatch) rows in all, and the
causal mask is off for that decode only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from edge_runtime.core.errors import InferenceError
from edge_runtime.inference.llm.feed import Feed, Segment
from edge_runtime.inference.llm.handles import Context
from edge_runtime.inference.llm.mtmd import MediaEmbeds

# (sequence id, first position, the pieces after its prefix in order: the image's segments, the suffix)
Start = tuple[int, int, Sequence[Segment]]
Ready = Callable[[int, int], None]  # (index into the starts, batch row holding its last logits)


@dataclass
class _Piece:
    index: int  # which start it belongs to
    seq_id: int
    seg: Segment
    pos0: int  # its first position
    last: bool  # its last row's logits are the sequence's first pick
    done: int = 0  # rows decoded so far (a causal piece larger than a batch)

    @property
    def n(self) -> int:
        return len(self.seg)

    @property
    def is_tokens(self) -> bool:
        return isinstance(self.seg, list)

    @property
    def non_causal(self) -> bool:
        return isinstance(self.seg, MediaEmbeds) and self.seg.non_causal

    @property
    def mrope(self) -> bool:
        return isinstance(self.seg, MediaEmbeds) and self.seg.mrope is not None

    def positions(self, start: int, stop: int) -> np.ndarray:
        """Rows start..stop: [n] plain, or [4, n] for M-RoPE."""
        if isinstance(self.seg, MediaEmbeds):
            pos = self.seg.positions(self.pos0, start, stop)
            return pos.reshape(4, -1) if self.mrope else pos
        return np.arange(self.pos0 + start, self.pos0 + stop, dtype=np.int32)


def _pieces(index: int, start: Start) -> tuple[list[_Piece], int]:
    """A start's pieces with their positions; the position after them."""
    seq_id, pos, given = start
    segments: list[Segment] = []
    for seg in given:
        if not len(seg):
            continue
        if isinstance(seg, list) and segments and isinstance(segments[-1], list):
            segments[-1] = segments[-1] + seg  # text runs together: one piece (the image's end marker, the question)
        else:
            segments.append(seg)
    out = []
    for k, seg in enumerate(segments):
        out.append(_Piece(index, seq_id, seg, pos, k == len(segments) - 1))
        pos += seg.n_pos if isinstance(seg, MediaEmbeds) else len(seg)
    return out, pos


def prefill_together(feed: Feed, ctx: Context, starts: Sequence[Start], ready: Ready) -> list[int]:
    """Decode every start's pieces at its positions of its sequence; `ready(i, row)` is called right
    after the decode that computed start i's last logits (before the next one overwrites them).
    Returns each start's next position. Starts go in increasing sequence ids (one graph a batch)."""
    queues: list[deque[_Piece]] = []
    ends = []
    for i, start in enumerate(starts):
        pieces, end = _pieces(i, start)
        if not pieces:
            raise InferenceError("a prompt with nothing to prefill after its prefix")
        queues.append(deque(pieces))
        ends.append(end)
    while any(queues):
        heads = [q[0] for q in queues if q]
        images = [p for p in heads if not p.is_tokens]
        taken = _pack(images or heads, feed.n_batch)
        rows = _decode(feed, ctx, taken)
        for (piece, _, stop), row in zip(taken, rows, strict=True):
            piece.done = stop
            if stop == piece.n:
                queues[piece.index].popleft()
                if piece.last:
                    ready(piece.index, row)
    return ends


def _pack(heads: list[_Piece], n_batch: int) -> list[tuple[_Piece, int, int]]:
    """The pieces (rows start..stop of each) one batch takes: whole pieces while they fit, in sequence
    order; a causal piece larger than a batch alone, split; bidirectional images only of one length."""
    room = n_batch
    out: list[tuple[_Piece, int, int]] = []
    kind: tuple[bool, bool, int] | None = None  # (non-causal, M-RoPE, the rows of a non-causal image)
    for p in heads:
        left = p.n - p.done
        if p.non_causal and p.n > n_batch:
            raise InferenceError(f"the image is {p.n} embeddings, more than model.batch_size {n_batch}; "
                                 "its attention is bidirectional, so it must fit one batch")
        own = (p.non_causal, p.mrope, left if p.non_causal else 0)
        if kind is not None and own != kind:
            continue
        if left <= room:
            out.append((p, p.done, p.n))
            room -= left
        elif not out and not p.non_causal:
            out.append((p, p.done, p.done + room))
            room = 0
        else:
            continue
        kind = own
        if room == 0:
            break
    return out


def _decode(feed: Feed, ctx: Context, taken: list[tuple[_Piece, int, int]]) -> list[int]:
    """One llama_decode of the taken rows; the batch row of each piece's last row."""
    tokens = taken[0][0].is_tokens
    batch = (feed.tokens if tokens else feed.embeds).struct
    i, last_rows, positions = 0, [], []
    for piece, start, stop in taken:
        seg = piece.seg
        if isinstance(seg, list):
            for k, tok in enumerate(seg[start:stop]):
                batch.token[i + k] = tok
                batch.pos[i + k] = piece.pos0 + start + k
        else:
            rows = seg.embeds if isinstance(seg, MediaEmbeds) else seg
            if rows.shape[1] != feed.n_embd:
                raise InferenceError(f"image embeddings are {rows.shape[1]} wide, the language model "
                                     f"takes {feed.n_embd}")
            block = np.ascontiguousarray(rows[start:stop], dtype=np.float32)
            np.ctypeslib.as_array(batch.embd, shape=(feed.n_batch * feed.n_embd,))[
                i * feed.n_embd:(i + stop - start) * feed.n_embd] = block.ravel()
            positions.append(piece.positions(start, stop))
        for k in range(stop - start):
            batch.n_seq_id[i + k] = 1
            batch.seq_id[i + k][0] = piece.seq_id
            batch.logits[i + k] = 0
        i += stop - start
        if piece.last and stop == piece.n:
            batch.logits[i - 1] = 1
        last_rows.append(i - 1)
    batch.n_tokens = i
    if not tokens:
        # section-major over the batch: all rows' first section, then the second, ...
        feed.embeds.use_positions(np.concatenate(positions, axis=-1).ravel())
    non_causal = taken[0][0].non_causal
    if non_causal:
        ctx.set_causal_attn(False)
    try:
        feed.decode(ctx, batch)
    finally:
        if non_causal:
            ctx.set_causal_attn(True)
    return last_rows
