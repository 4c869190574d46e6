"""Several prompts as parallel sequences of one llama.cpp batch, on a second context.

The shared prefix is evaluated once and its KV cache copied to every sequence; each step then
decodes one token for every unfinished sequence in a single llama_decode, which is how a GPU
(bound by per-token overhead, not bandwidth) turns several cameras into more throughput.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from edge_runtime.core.errors import InferenceError
from edge_runtime.inference.llm.feed import Feed, Generation, ImagePart, image_segments
from edge_runtime.inference.llm.handles import Context, Model
from edge_runtime.inference.llm.picker import GREEDY, PickerHost, TokenPicker

# Picks go to threads only for llama.cpp's GBNF sampler on a large vocabulary: its full pass costs
# 1.5-2 ms of C with the GIL released, so four run side by side (150k-token vocabularies went from
# 2.6x to 2.9x on the H200). llguidance picks are ~0.2 ms, mostly numpy under the GIL: on the H200
# threads made a 4-camera step's picking 1.19 ms instead of 0.73 ms inline (docs/benchmarks.md).
_PARALLEL_PICK_VOCAB = 16_384

Item = tuple[list[int], ImagePart, list[int]]


class ParallelHost(PickerHost, Protocol):
    """What the parallel sequences need of the model that owns them (llm.model.LanguageModel)."""

    n_ctx: int
    n_batch: int
    threads: int
    kv_type: int
    batch_kv_cache: str
    fast_forward: bool
    feed: Feed

    @property
    def model(self) -> Model: ...
    @property
    def context_params(self) -> Any: ...


class ParallelSequences:
    """Owns the second context (created on the first batch, grown, never shrunk) and the picking threads."""

    def __init__(self, lm: ParallelHost) -> None:
        self.lm = lm
        self._ctx: Context | None = None
        self._pool: ThreadPoolExecutor | None = None
        self.pick_threads: bool | None = None  # None: the engine's choice (above); benchmarks force it

    def close(self) -> None:
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def generate(self, items: Sequence[Item], grammar: str | None, max_tokens: int) -> list[Generation]:
        """Greedy generation for several prompts sharing one prefix."""
        lm, feed = self.lm, self.lm.feed
        prefix = items[0][0]
        if any(it[0] != prefix for it in items):
            raise InferenceError("batched prompts must share their prefix")
        # The sequences share the prefix's KV cells (llama_memory_seq_cp in a unified cache); each
        # needs its own cells for its image, question and answer.
        own = [sum(len(s) for s in image_segments(image)) + len(suffix) + max_tokens for _, image, suffix in items]
        if lm.batch_kv_cache == "unified":
            cells = len(prefix) + sum(own)
        else:  # one stream per sequence, each with room for the longest sequence
            cells = max(len(items), 4) * (len(prefix) + max(own))
        ctx = self._context(len(items), cells)
        ctx.memory_clear()
        t0 = time.perf_counter()
        feed.token_ids(ctx, prefix, 0, want_last_logits=False, seq=0)
        for seq in range(1, len(items)):
            ctx.memory_seq_cp(0, seq)
        pickers: list[TokenPicker] = []
        out: list[list[bytes]] = [[] for _ in items]
        ids: list[list[int]] = [[] for _ in items]
        pos, pending, prompt_tokens, prefill_ms = [], [], [], []
        try:
            for _ in items:
                pickers.append(TokenPicker(lm, grammar, GREEDY))
            for seq, (_, image, suffix) in enumerate(items):
                t1 = time.perf_counter()
                p = feed.segments(ctx, image_segments(image), len(prefix), want_last_logits=not suffix, seq=seq)
                p = feed.token_ids(ctx, suffix, p, want_last_logits=True, seq=seq)
                pos.append(p)
                prompt_tokens.append(p)
                prefill_ms.append((time.perf_counter() - t1) * 1000)
                pending.append(pickers[seq].next_token(ctx, -1))  # sample now: the next decode overwrites logits
            prefill_total = (time.perf_counter() - t0) * 1000
            t2 = time.perf_counter()
            calls0, decode0 = feed.decode_calls, feed.decode_s
            finish = ["length"] * len(items)
            active = list(range(len(items)))
            batch = feed.tokens.struct
            step_ids: list[list[int]] = [[] for _ in items]
            room = max(0, lm.n_batch // len(items) - 1)  # forced tokens per sequence that fit one batch
            for _ in range(max_tokens):
                stepping = []
                for seq in active:
                    token, piece = pending[seq]
                    if token < 0:
                        finish[seq] = "stop"
                        continue
                    step = [(token, piece)]
                    if lm.fast_forward:
                        step += pickers[seq].forced(min(room, max_tokens - len(out[seq]) - 1))
                    out[seq].extend(p for _, p in step)
                    step_ids[seq] = [t for t, _ in step]
                    ids[seq].extend(step_ids[seq])
                    if len(out[seq]) < max_tokens:
                        stepping.append(seq)
                active = stepping
                if not active:
                    break
                i, rows = 0, []
                for seq in active:
                    for k, tok in enumerate(step_ids[seq]):
                        batch.token[i] = tok
                        batch.pos[i] = pos[seq]
                        batch.n_seq_id[i] = 1
                        batch.seq_id[i][0] = seq
                        batch.logits[i] = int(k == len(step_ids[seq]) - 1)
                        pos[seq] += 1
                        i += 1
                    rows.append(i - 1)
                batch.n_tokens = i
                feed.decode(ctx, batch)
                for seq, choice in zip(active, self._pick_all(pickers, active, rows, ctx), strict=True):
                    pending[seq] = choice
            decode_ms = (time.perf_counter() - t2) * 1000
            steps, llama_ms = feed.decode_calls - calls0, (feed.decode_s - decode0) * 1000
        finally:
            for picker in pickers:
                picker.close()
        return [Generation(b"".join(o).decode("utf-8", errors="replace"), len(o), prompt_tokens[i],
                           prefill_ms[i] + (prefill_total - sum(prefill_ms)) / len(items), decode_ms, finish[i], 0,
                           ids[i], steps, llama_ms)
                for i, o in enumerate(out)]

    def prompt_logits(self, items: Sequence[Item], copy_prefix: bool = True) -> list[np.ndarray]:
        """The logits after each prompt, each prefilled alone into this context (copies): with
        `copy_prefix` the prefix is decoded once into sequence 0 and copied to the others, as
        `generate` does; without it every sequence decodes its own prefix. A difference from the
        one-at-a-time context here comes from the context (unified KV, shared-prefix copy, size)."""
        feed = self.lm.feed
        own = [len(pre) + sum(len(s) for s in image_segments(im)) + len(sf) + 1 for pre, im, sf in items]
        ctx = self._context(len(items), sum(own))
        ctx.memory_clear()
        if copy_prefix:
            feed.token_ids(ctx, items[0][0], 0, want_last_logits=False, seq=0)
            for seq in range(1, len(items)):
                ctx.memory_seq_cp(0, seq)
        logits = []
        for seq, (prefix, image, suffix) in enumerate(items):
            if not copy_prefix:
                feed.token_ids(ctx, prefix, 0, want_last_logits=False, seq=seq)
            p = feed.segments(ctx, image_segments(image), len(prefix), want_last_logits=not suffix, seq=seq)
            feed.token_ids(ctx, suffix, p, want_last_logits=True, seq=seq)
            logits.append(ctx.logits_ith(-1).copy())
        return logits

    def _pick_all(self, pickers: list[TokenPicker], active: list[int], rows: list[int], ctx: Context
                  ) -> list[tuple[int, bytes]]:
        """Next token of each active sequence; batch row rows[i] holds the logits of sequence active[i]."""
        def pick(i: int) -> tuple[int, bytes]:
            return pickers[active[i]].next_token(ctx, rows[i])

        threads = self.pick_threads
        if threads is None:
            threads = self.lm.constraint_engine == "gbnf" and self.lm.n_vocab >= _PARALLEL_PICK_VOCAB
        if not threads or len(active) == 1:
            return [pick(row) for row in range(len(active))]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=max(2, min(8, self.lm.threads)), thread_name_prefix="sampler")
        return list(self._pool.map(pick, range(len(active))))

    def _context(self, sequences: int, cells: int) -> Context:
        """A context over the model's weights with room for `sequences` sequences and `cells` KV cells."""
        lm = self.lm
        n_ctx = max(lm.n_ctx, -(-cells // 256) * 256)
        if self._ctx is not None and self._ctx.n_seq_max >= sequences and self._ctx.n_ctx >= n_ctx:
            return self._ctx
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
        params = Context.default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = lm.n_batch
        params.n_seq_max = max(sequences, 4)
        # Unified: all sequences share one KV buffer (the most batch throughput). Per sequence:
        # each has its own stream, so a sequence's attention runs exactly as in the one-at-a-time
        # context; on the H200 the unified cache changed the first-token logits of sequences 1..3
        # (max |diff| 0.11-2.9) and with them 2 of 4 verdicts (docs/benchmarks.md).
        params.kv_unified = lm.batch_kv_cache == "unified"
        params.n_threads = params.n_threads_batch = lm.threads
        params.type_k = params.type_v = lm.kv_type
        # The numerics of the one-at-a-time context: llama.cpp's defaults differ from
        # llama-cpp-python's (flash attention auto vs off, RoPE scaling), and those differences
        # alone changed 2 of 4 real-weight verdicts on the H200.
        main = lm.context_params
        params.flash_attn_type = main.flash_attn_type
        params.yarn_attn_factor, params.yarn_beta_fast = main.yarn_attn_factor, main.yarn_beta_fast
        params.yarn_beta_slow = main.yarn_beta_slow
        try:
            self._ctx = Context(lm.model, params, n_ctx, params.n_seq_max)
        except InferenceError:
            raise InferenceError("llama.cpp could not create a context for parallel sequences") from None
        return self._ctx
