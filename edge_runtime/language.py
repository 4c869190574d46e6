"""The llama.cpp language model: text + image embeddings in, grammar-constrained text out.

Image embeddings enter through a `llama_batch` whose `embd` field is filled, at the positions
right after the prompt prefix. The KV cache of the prefix (system text and everything before the
image) is kept between calls and reused when the next prompt starts the same way.
"""

from __future__ import annotations

from .engines import llama_cpp  # isort: skip - onnxruntime, then llama_cpp (see engines.py)

import ctypes
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .constraint import VocabTokenizer, tokenizer_for
from .errors import BundleError, InferenceError, InputError
from .picker import GREEDY, Candidates, Sampling, TokenPicker

log = logging.getLogger(__name__)


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


# What goes between the prompt's prefix and suffix: one block of image embeddings [N, D], or a
# sequence of embedding blocks and token ids (tiled images with row/column marker tokens between tiles).
ImagePart = np.ndarray | Sequence[np.ndarray | list[int]] | None


def image_segments(image: ImagePart) -> list[np.ndarray | list[int]]:
    if image is None:
        return []
    if isinstance(image, np.ndarray):
        return [image]
    return [seg for seg in image if len(seg)]


class LanguageModel:
    """Owns the llama.cpp model, context and batches; `close()` frees them. Not thread-safe."""

    def __init__(self, path: Path, context_size: int, threads: int, gpu_layers: int,
                 batch_size: int = 512, reuse_prefix: bool = True, kv_cache_type: str = "f16",
                 constraint_engine: str = "llguidance", fast_forward: bool = True, model_key: str = "",
                 batch_kv_cache: str = "per_sequence") -> None:
        self.batch_kv_cache = batch_kv_cache
        self.constraint_engine = constraint_engine
        self.fast_forward = fast_forward and constraint_engine == "llguidance"
        self._model_key = model_key or str(path)
        self._path = str(path)
        self._kv_type = _GGML_TYPES[kv_cache_type]
        try:
            self._llm: llama_cpp.Llama | None = llama_cpp.Llama(
                model_path=str(path), n_ctx=context_size, n_batch=batch_size, n_ubatch=batch_size,
                n_threads=threads, n_threads_batch=threads, n_gpu_layers=gpu_layers, verbose=False,
                type_k=self._kv_type, type_v=self._kv_type,
            )
        except ValueError as exc:  # llama-cpp-python's only signal is "Failed to load model"
            raise BundleError(f"{path} could not be loaded by llama.cpp ({exc}); "
                              "run with log level debug to see llama.cpp's reason") from None
        self.n_ctx = context_size
        self.n_batch = batch_size
        self.n_embd = self._llm.n_embd()
        self.reuse_prefix = reuse_prefix
        self._vocab = llama_cpp.llama_model_get_vocab(self._llm.model)
        self._tokens = llama_cpp.llama_batch_init(batch_size, 0, 1)
        self._embeds = llama_cpp.llama_batch_init(batch_size, self.n_embd, 1)
        self._cached_prefix: list[int] = []
        self._threads = threads
        self._par_ctx: Any = None  # created on the first batched generation
        self._par_seqs = 0
        self._par_n_ctx = 0
        # Per-token lookups done once per model, not once per generated token.
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self._probe = ctypes.create_string_buffer(256)
        self.eog = frozenset(t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self._vocab, t))
        self._pieces: dict[int, bytes] = {}
        # The longest token's bytes: a text longer than n_ctx times this cannot fit the context.
        self.max_token_bytes = max(1, max(self._piece_length(t) for t in range(self.n_vocab)))
        # Full-vocabulary candidate arrays for the grammar pass, one per sequence sampled at once,
        # kept between generations (1.8 MB each for a 150k vocabulary).
        self._candidate_pool: list[Candidates] = []
        # Sequences of one batch pick their next tokens in parallel: the grammar pass runs in C with
        # the GIL released, and it costs more CPU per token than a GPU decode step.
        self._pickers_pool: ThreadPoolExecutor | None = None

    @property
    def llm(self) -> llama_cpp.Llama:
        if self._llm is None:
            raise RuntimeError("language model is closed")
        return self._llm

    def guidance_tokenizer(self) -> VocabTokenizer:
        """llguidance's view of this model's vocabulary (built once per model checksum)."""
        return tokenizer_for(self._path, self.n_vocab, self.eog, self._model_key)

    def tokenize(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def generate(
        self, prefix: list[int], image: ImagePart, suffix: list[int],
        grammar: str | None, max_tokens: int, sampling: Sampling | None = None,
        on_text: Callable[[str], None] | None = None, stop: list[str] | None = None,
    ) -> Generation:
        """Prefill prefix + image + suffix, then generate until end or max_tokens."""
        prefix, segments, suffix = self._check_prompt(prefix, image, suffix, max_tokens)
        t0 = time.perf_counter()
        reused = self._prefill_prefix(prefix)
        pos = self._decode_segments(segments, len(prefix), want_last_logits=not suffix)
        pos = self._decode_tokens(suffix, pos, want_last_logits=True)
        prefill_ms = (time.perf_counter() - t0) * 1000

        prompt_tokens = pos
        picker = TokenPicker(self, grammar, sampling or GREEDY)
        out: list[bytes] = []
        ids: list[int] = []
        finish = "length"
        t1 = time.perf_counter()
        try:
            for _ in range(max_tokens):
                token, piece = picker.next_token()
                if token < 0:
                    finish = "stop"
                    break
                step = [(token, piece)]
                if self.fast_forward:
                    step += picker.forced(max_tokens - len(ids) - 1)
                out.extend(p for _, p in step)
                ids.extend(t for t, _ in step)
                if stop and any(s in picker.emitted.decode("utf-8", "ignore") for s in stop):
                    finish = "stop"
                    break
                if on_text is not None:
                    delta = picker.text_so_far_delta()
                    if delta:
                        on_text(delta)
                if len(ids) >= max_tokens:
                    break
                # The chosen token and the ones the grammar forces after it: one llama_decode.
                pos = self._decode_tokens([t for t, _ in step], pos, want_last_logits=True)
        finally:
            picker.close()
        decode_ms = (time.perf_counter() - t1) * 1000
        text = b"".join(out).decode("utf-8", errors="replace")
        for s in stop or []:
            text = text.split(s, 1)[0]  # OpenAI semantics: the stop string is not returned
        return Generation(
            text=text, tokens=len(out),
            prompt_tokens=prompt_tokens, prefill_ms=prefill_ms, decode_ms=decode_ms,
            finish_reason=finish, prefix_reused=reused, token_ids=ids,
        )

    def prompt_logits(self, prefix: list[int], image: ImagePart, suffix: list[int]) -> np.ndarray:
        """The logits after the whole prompt (a copy): what the first generated token is chosen from."""
        prefix, segments, suffix = self._check_prompt(prefix, image, suffix, 1)
        self._prefill_prefix(prefix)
        pos = self._decode_segments(segments, len(prefix), want_last_logits=not suffix)
        self._decode_tokens(suffix, pos, want_last_logits=True)
        ptr = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def _check_prompt(self, prefix: list[int], image: ImagePart, suffix: list[int], max_tokens: int
                      ) -> tuple[list[int], list[np.ndarray | list[int]], list[int]]:
        segments = image_segments(image)
        prompt_tokens = len(prefix) + sum(len(seg) for seg in segments) + len(suffix)
        if prompt_tokens >= self.n_ctx:
            raise InputError(f"messages: the prompt is {prompt_tokens} tokens, the context holds "
                             f"{self.n_ctx}", field="messages")
        if prompt_tokens + max_tokens > self.n_ctx:
            raise InputError(f"max_tokens: prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) "
                             f"exceeds the context size {self.n_ctx}; at most {self.n_ctx - prompt_tokens} "
                             "fit", field="max_tokens")
        for seg in segments:
            if isinstance(seg, np.ndarray) and seg.shape[1] != self.n_embd:
                raise InferenceError(f"image embeddings are {seg.shape[1]} wide, the language "
                                     f"model expects {self.n_embd}")
        if not suffix and not segments:
            if not prefix:
                raise InferenceError("the prompt is empty")
            prefix, suffix = prefix[:-1], prefix[-1:]  # the last prompt token must yield logits
        return prefix, segments, suffix

    def _decode_segments(self, segments: list[np.ndarray | list[int]], pos: int, want_last_logits: bool,
                         seq: int = 0, ctx: Any = None) -> int:
        for i, seg in enumerate(segments):
            last = want_last_logits and i == len(segments) - 1
            if isinstance(seg, np.ndarray):
                pos = self._decode_embeds(seg, pos, last, seq, ctx)
            else:
                pos = self._decode_tokens(seg, pos, last, seq, ctx)
        return pos

    def generate_batch(self, items: Sequence[tuple[list[int], ImagePart, list[int]]], grammar: str | None,
                       max_tokens: int) -> list[Generation]:
        """Greedy generation for several prompts as parallel sequences of one llama.cpp batch.

        The shared prefix is evaluated once and its KV cache copied to every sequence; each step then
        decodes one token for every unfinished sequence in a single llama_decode, which is how a GPU
        (bound by per-token overhead, not bandwidth) turns several cameras into more throughput.
        """
        if len(items) == 1:
            prefix, image, suffix = items[0]
            return [self.generate(prefix, image, suffix, grammar, max_tokens)]
        prefix = items[0][0]
        # The sequences share the prefix's KV cells (llama_memory_seq_cp in a unified cache); each
        # needs its own cells for its image, question and answer.
        own = [sum(len(s) for s in image_segments(image)) + len(suffix) + max_tokens for _, image, suffix in items]
        if self.batch_kv_cache == "unified":
            cells = len(prefix) + sum(own)
        else:  # one stream per sequence, each with room for the longest sequence
            cells = max(len(items), 4) * (len(prefix) + max(own))
        ctx = self._parallel_context(len(items), cells)
        memory = llama_cpp.llama_get_memory(ctx)
        llama_cpp.llama_memory_clear(memory, True)
        if any(it[0] != prefix for it in items):
            raise InferenceError("batched prompts must share their prefix")
        t0 = time.perf_counter()
        self._decode_tokens(prefix, 0, want_last_logits=False, seq=0, ctx=ctx)
        for seq in range(1, len(items)):
            llama_cpp.llama_memory_seq_cp(memory, 0, seq, -1, -1)
        pickers = [TokenPicker(self, grammar, GREEDY) for _ in items]
        out: list[list[bytes]] = [[] for _ in items]
        ids: list[list[int]] = [[] for _ in items]
        pos, pending, prompt_tokens, prefill_ms = [], [], [], []
        try:
            for seq, (_, image, suffix) in enumerate(items):
                t1 = time.perf_counter()
                segments = image_segments(image)
                p = self._decode_segments(segments, len(prefix), want_last_logits=not suffix, seq=seq, ctx=ctx)
                p = self._decode_tokens(suffix, p, want_last_logits=True, seq=seq, ctx=ctx)
                pos.append(p)
                prompt_tokens.append(p)
                prefill_ms.append((time.perf_counter() - t1) * 1000)
                pending.append(pickers[seq].next_token(ctx, -1))  # sample now: the next decode overwrites logits
            prefill_total = (time.perf_counter() - t0) * 1000
            t2 = time.perf_counter()
            finish = ["length"] * len(items)
            active = list(range(len(items)))
            batch = self._tokens
            feed: list[list[int]] = [[] for _ in items]
            room = max(0, self.n_batch // len(items) - 1)  # forced tokens per sequence that fit one batch
            for _ in range(max_tokens):
                stepping = []
                for seq in active:
                    token, piece = pending[seq]
                    if token < 0:
                        finish[seq] = "stop"
                        continue
                    step = [(token, piece)]
                    if self.fast_forward:
                        step += pickers[seq].forced(min(room, max_tokens - len(out[seq]) - 1))
                    out[seq].extend(p for _, p in step)
                    feed[seq] = [t for t, _ in step]
                    ids[seq].extend(feed[seq])
                    if len(out[seq]) < max_tokens:
                        stepping.append(seq)
                active = stepping
                if not active:
                    break
                i, rows = 0, []
                for seq in active:
                    for k, tok in enumerate(feed[seq]):
                        batch.token[i] = tok
                        batch.pos[i] = pos[seq]
                        batch.n_seq_id[i] = 1
                        batch.seq_id[i][0] = seq
                        batch.logits[i] = int(k == len(feed[seq]) - 1)
                        pos[seq] += 1
                        i += 1
                    rows.append(i - 1)
                batch.n_tokens = i
                self._decode(batch, ctx)
                for seq, choice in zip(active, self._pick_all(pickers, active, rows, ctx), strict=True):
                    pending[seq] = choice
            decode_ms = (time.perf_counter() - t2) * 1000
        finally:
            for picker in pickers:
                picker.close()
        return [Generation(b"".join(o).decode("utf-8", errors="replace"), len(o), prompt_tokens[i],
                           prefill_ms[i] + (prefill_total - sum(prefill_ms)) / len(items), decode_ms, finish[i], 0,
                           ids[i])
                for i, o in enumerate(out)]

    def _pick_all(self, pickers: list[TokenPicker], active: list[int], rows: list[int], ctx: Any
                  ) -> list[tuple[int, bytes]]:
        """Next token of each active sequence; batch row rows[i] holds the logits of sequence active[i]."""
        def pick(i: int) -> tuple[int, bytes]:
            return pickers[active[i]].next_token(ctx, rows[i])

        if self.n_vocab < _PARALLEL_PICK_VOCAB or len(active) == 1:
            return [pick(row) for row in range(len(active))]
        if self._pickers_pool is None:
            self._pickers_pool = ThreadPoolExecutor(max_workers=max(2, min(8, self._threads)),
                                                    thread_name_prefix="sampler")
        return list(self._pickers_pool.map(pick, range(len(active))))

    def _parallel_context(self, sequences: int, cells: int) -> Any:
        """A second llama.cpp context over the same weights with room for `sequences` sequences
        and `cells` KV cells in all (grown, never shrunk, when a batch needs more)."""
        n_ctx = max(self.n_ctx, -(-cells // 256) * 256)
        if self._par_ctx is None or self._par_seqs < sequences or self._par_n_ctx < n_ctx:
            if self._par_ctx is not None:
                llama_cpp.llama_free(self._par_ctx)
            params = llama_cpp.llama_context_default_params()
            params.n_ctx = n_ctx
            params.n_batch = params.n_ubatch = self.n_batch
            params.n_seq_max = max(sequences, 4)
            # Unified: all sequences share one KV buffer (the most batch throughput). Per sequence:
            # each has its own stream, so a sequence's attention runs exactly as in the one-at-a-time
            # context; on the H200 the unified cache changed the first-token logits of sequences 1..3
            # (max |diff| 0.11-2.9) and with them 2 of 4 verdicts (docs/benchmarks.md).
            params.kv_unified = self.batch_kv_cache == "unified"
            params.n_threads = params.n_threads_batch = self._threads
            params.type_k = params.type_v = self._kv_type
            # The numerics of the one-at-a-time context: llama.cpp's defaults differ from
            # llama-cpp-python's (flash attention auto vs off, RoPE scaling), and those differences
            # alone changed 2 of 4 real-weight verdicts on the H200.
            main = self.llm.context_params
            params.flash_attn_type = main.flash_attn_type
            params.yarn_attn_factor, params.yarn_beta_fast = main.yarn_attn_factor, main.yarn_beta_fast
            params.yarn_beta_slow = main.yarn_beta_slow
            self._par_ctx = llama_cpp.llama_init_from_model(self.llm.model, params)
            if not self._par_ctx:
                raise InferenceError("llama.cpp could not create a context for parallel sequences")
            self._par_seqs = params.n_seq_max
            self._par_n_ctx = n_ctx
        return self._par_ctx

    def _prefill_prefix(self, prefix: list[int]) -> int:
        """Reuse the cached prefix KV when the prompt starts the same way; return tokens reused."""
        memory = llama_cpp.llama_get_memory(self.llm.ctx)
        if self.reuse_prefix and prefix and prefix == self._cached_prefix:
            # Drop everything after the prefix: the previous image, its question and answer.
            if llama_cpp.llama_memory_seq_rm(memory, 0, len(prefix), -1):
                return len(prefix)
        llama_cpp.llama_memory_clear(memory, True)
        self._cached_prefix = []
        self._decode_tokens(prefix, 0, want_last_logits=False)
        self._cached_prefix = list(prefix)
        return 0

    def _decode_tokens(self, tokens: list[int], pos: int, want_last_logits: bool, seq: int = 0,
                       ctx: Any = None) -> int:
        batch = self._tokens
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start:start + self.n_batch]
            batch.n_tokens = len(chunk)
            for i, tok in enumerate(chunk):
                batch.token[i] = tok
                batch.pos[i] = pos + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = 0
            is_last_chunk = start + self.n_batch >= len(tokens)
            if want_last_logits and is_last_chunk:
                batch.logits[len(chunk) - 1] = 1
            self._decode(batch, ctx)
            pos += len(chunk)
        return pos

    def _decode_embeds(self, embeds: np.ndarray, pos: int, want_last_logits: bool, seq: int = 0,
                       ctx: Any = None) -> int:
        batch = self._embeds
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
            self._decode(batch, ctx)
            pos += chunk.shape[0]
        return pos

    def _decode(self, batch: llama_cpp.llama_batch, ctx: Any = None) -> None:
        rc = llama_cpp.llama_decode(ctx or self.llm.ctx, batch)
        if rc != 0:
            self._cached_prefix = []
            raise InferenceError(f"llama_decode failed with code {rc}")

    def borrow_candidates(self) -> Candidates:
        return self._candidate_pool.pop() if self._candidate_pool else Candidates(self.n_vocab)

    def return_candidates(self, candidates: Candidates) -> None:
        self._candidate_pool.append(candidates)

    def _piece(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._render_piece(token)
        return piece

    def _piece_length(self, token: int) -> int:
        n = llama_cpp.llama_token_to_piece(self._vocab, token, self._probe, 256, 0, True)
        return abs(n)

    def _render_piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        return buf.raw[:n]

    def close(self) -> None:
        if self._llm is None:
            return
        if self._par_ctx is not None:
            llama_cpp.llama_free(self._par_ctx)
            self._par_ctx = None
        if self._pickers_pool is not None:
            self._pickers_pool.shutdown(wait=True)
            self._pickers_pool = None
        llama_cpp.llama_batch_free(self._tokens)
        llama_cpp.llama_batch_free(self._embeds)
        self._llm.close()
        self._llm = None


_GGML_TYPES = {"f32": 0, "f16": 1}  # ggml_type values for the KV cache
# Below this vocabulary size a token pick costs less than handing it to a thread (the demo bundle's
# 4-camera batch ran at 0.83x with threads on the H200, 150k-token vocabularies at 2.6-2.9x).
_PARALLEL_PICK_VOCAB = 16_384
