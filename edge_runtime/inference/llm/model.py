"""The llama.cpp language model: text + image embeddings in, grammar-constrained text out.

The KV cache of the prompt's prefix (system text and everything before the image) is kept between
calls and reused when the next prompt starts the same way. Every native resource is owned by a
wrapper on one `ExitStack`: a step that fails in the constructor frees what the earlier ones built,
and `close()` (idempotent) frees it all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from edge_runtime.core.errors import BundleError, ConfigError, InferenceError, InputError, NoRoomToAnswer
from edge_runtime.inference.llm.constraint import VocabTokenizer, lark_for, tokenizer_for
from edge_runtime.inference.llm.draft import Drafter
from edge_runtime.inference.llm.feed import (
    Feed,
    Generation,
    Head,
    ImagePart,
    Prefix,
    Segment,
    head_cells,
    image_segments,
)
from edge_runtime.inference.llm.handles import Context, Llama, Model, Vocab
from edge_runtime.inference.llm.parallel import ParallelSequences
from edge_runtime.inference.llm.picker import GREEDY, Candidates, Sampling, TokenPicker
from edge_runtime.inference.llm.sequence import Admit, Finished, Item, Prompt

_GGML_TYPES = {"f32": 0, "f16": 1}  # ggml_type values for the KV cache


class LanguageModel:
    """Owns the llama.cpp model, its contexts and batches; `close()` frees them. Not thread-safe."""

    def __init__(self, path: Path, context_size: int, threads: int, gpu_layers: int,
                 batch_size: int = 512, reuse_prefix: bool = True, kv_cache_type: str = "f16",
                 constraint_engine: str = "llguidance", fast_forward: bool = True, model_key: str = "",
                 batch_kv_cache: str = "per_sequence", flash_attention: bool = True,
                 draft_path: Path | None = None, draft_tokens: int = 3, steady_steps: bool = False) -> None:
        self.batch_kv_cache = batch_kv_cache
        self.steady_steps = steady_steps
        self.constraint_engine = constraint_engine
        self.fast_forward = fast_forward and constraint_engine == "llguidance"
        self._model_key = model_key or str(path)
        self._path = str(path)
        self.kv_type = _GGML_TYPES[kv_cache_type]
        self.n_ctx = context_size
        self.n_batch = batch_size
        self.threads = threads
        self.reuse_prefix = reuse_prefix
        self._cached_prefix: Head = []
        self._llm: Llama | None = None
        self.drafter: Drafter | None = None
        with ExitStack() as stack:
            try:  # llama-cpp-python's Llama owns the model and the main context (its _internals)
                # The parallel context copies this choice (parallel_context.py): both compute attention alike.
                llm = Llama(str(path), context_size, batch_size, threads, gpu_layers, self.kv_type, flash_attention)
            except ValueError as exc:  # llama-cpp-python's only signal is "Failed to load model"
                raise BundleError(f"{path} could not be loaded by llama.cpp ({exc}); "
                                  "run with log level debug to see llama.cpp's reason") from None
            stack.callback(llm.close)
            self._llm = llm
            self.n_embd = llm.model.n_embd_inp()  # image embeddings' width (> n_embd on Qwen3-VL)
            # M-RoPE models (Qwen2-VL and later) place an image by its rows and columns: only libmtmd's
            # MediaEmbeds carry those positions, a bare embedding block would be read past its positions
            self.mrope = llm.model.uses_mrope()
            self.feed = Feed(batch_size, self.n_embd, on_error=self.forget_prefix)
            stack.callback(self.feed.close)
            if draft_path is not None:
                if llm.model.keeps_state():  # speculation drops the cells of refused guesses
                    raise ConfigError(f"model.draft_model: {path} keeps a recurrent state, which cannot drop "
                                      "the guesses it refuses; speculative decoding needs a transformer")
                self.drafter = Drafter(draft_path, llm.model, context_size, threads, gpu_layers,
                                       batch_size, self.kv_type, flash_attention, draft_tokens)
                stack.callback(self.drafter.close)
            self.parallel = ParallelSequences(self)
            stack.callback(self.parallel.close)
            # Per-token lookups done once per model, not once per generated token.
            vocab = llm.model.vocab
            self.n_vocab = vocab.n_tokens()
            self.eog = vocab.eog_tokens()
            self._pieces: dict[int, bytes] = {}
            # The longest token's bytes: a text longer than n_ctx times this cannot fit the context.
            self.max_token_bytes = vocab.longest_piece()
            # Full-vocabulary candidate arrays for the grammar pass, one per sequence sampled at once,
            # kept between generations (1.8 MB each for a 150k vocabulary).
            self._candidate_pool: list[Candidates] = []
            stack.callback(setattr, self, "_llm", None)  # runs first: the model reads as closed
            self._stack = stack.pop_all()

    def __enter__(self) -> LanguageModel:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Free the contexts, batches and model (once; later calls do nothing)."""
        self._stack.close()

    @property
    def closed(self) -> bool:
        return self._llm is None

    @property
    def llm(self) -> Llama:
        if self._llm is None:
            raise RuntimeError("language model is closed")
        return self._llm

    # -- the handles the picker, the parallel sequences and bench read --------------------------
    @property
    def ctx(self) -> Context:
        """The main context (a view: llama-cpp-python's Llama owns it)."""
        return self.llm.context

    @property
    def model(self) -> Model:
        """The model's weights (a view: llama-cpp-python's Llama owns them)."""
        return self.llm.model

    @property
    def model_ptr(self) -> Any:
        """The raw llama_model pointer, for libmtmd's context (mtmd.py)."""
        return self.llm.model.ptr

    @property
    def vocab(self) -> Vocab:
        return self.llm.model.vocab

    @property
    def context_params(self) -> Any:
        return self.llm.context_params

    def check_grammar(self, gbnf: str) -> None:
        """Translate the grammar for this model's constraint engine now, so a grammar it cannot
        take is refused up front (InputError), not in the middle of a generation."""
        if self.constraint_engine == "llguidance":
            lark_for(gbnf)

    def guidance_tokenizer(self) -> VocabTokenizer:
        """llguidance's view of this model's vocabulary (built once per model checksum)."""
        return tokenizer_for(self._path, self.n_vocab, self.eog, self._model_key)

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def with_bos(self, prefix: list[int]) -> list[int]:
        """`prefix` starting with the BOS token when the GGUF asks for one (tokenizer.ggml.add_bos_token)
        and the text did not already write it, as llama.cpp's own tokenizing with add_special does."""
        vocab = self.vocab
        bos = vocab.bos()
        if bos < 0 or not vocab.add_bos() or prefix[:1] == [bos]:
            return prefix
        return [bos, *prefix]

    # -- per-stage API: prefill, then generate from the logits it left ---------------------------
    def prefill(self, prefix: Head, image: ImagePart, suffix: list[int], max_tokens: int = 1) -> tuple[int, int]:
        """Decode the prompt into the main context (reusing the cached prefix when it matches), leaving
        the logits of its last token; return (prompt tokens, prompt tokens whose KV cache was reused)."""
        prefix, segments, suffix = self._check_prompt(prefix, image, suffix, max_tokens)
        reused = self._prefill_prefix(prefix)
        pos = self.feed.segments(self.ctx, segments, len(prefix), want_last_logits=not suffix)
        pos = self.feed.token_ids(self.ctx, suffix, pos, want_last_logits=True)
        return pos, reused

    def forget_prefix(self, clear: bool = False) -> None:
        """Drop the prefix cache (and, with `clear`, the whole KV cache of the main context)."""
        self._cached_prefix = []
        if clear:
            self.ctx.memory_clear()

    def decode(self, tokens: list[int], pos: int, want_last_logits: bool = True) -> int:
        """Decode `tokens` at positions pos.. of the main context; return the next position."""
        return self.feed.token_ids(self.ctx, tokens, pos, want_last_logits)

    def generate(
        self, prefix: Head, image: ImagePart, suffix: list[int],
        grammar: str | None, max_tokens: int, sampling: Sampling | None = None,
        on_text: Callable[[str], None] | None = None, stop: list[str] | None = None,
    ) -> Generation:
        """Prefill prefix + image + suffix, then generate until end or max_tokens."""
        if self.drafter is not None and (sampling or GREEDY).temperature <= 0 and max_tokens > 1:
            # Speculation lives in the parallel sequences' step: a prompt alone there is this one.
            return self._served(Prompt(prefix, image, suffix, grammar, max_tokens, sampling or GREEDY,
                                       tuple(stop or ()), on_text))
        t0 = time.perf_counter()
        pos, reused = self.prefill(prefix, image, suffix, max_tokens)
        prefill_ms = (time.perf_counter() - t0) * 1000
        prompt_tokens = pos
        out: list[bytes] = []
        ids: list[int] = []
        finish = "length"
        forced = 0
        t1 = time.perf_counter()
        calls0, decode0 = self.feed.decode_calls, self.feed.decode_s
        picker = TokenPicker(self, grammar, sampling or GREEDY)
        try:
            for _ in range(max_tokens):
                token, piece = picker.next_token()
                if token < 0:
                    finish = "stop"
                    break
                step = [(token, piece)]
                if self.fast_forward:
                    step += picker.forced(max_tokens - len(ids) - 1)
                    forced += len(step) - 1
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
                pos = self.decode([t for t, _ in step], pos)
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
            steps=self.feed.decode_calls - calls0, llama_decode_ms=(self.feed.decode_s - decode0) * 1000,
            forced=forced,
        )

    def _served(self, prompt: Prompt) -> Generation:
        outcome: list[Generation | Exception] = []
        self.serve([prompt], lambda _prompt, out: outcome.append(out))
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        return outcome[0]

    def prompt_logits(self, prefix: Head, image: ImagePart, suffix: list[int]) -> np.ndarray:
        """The logits after the whole prompt (a copy): what the first generated token is chosen from."""
        self.prefill(prefix, image, suffix)
        return self.ctx.logits_ith(-1).copy()

    def generate_batch(self, items: Sequence[Item | Prompt], grammar: str | None, max_tokens: int) -> list[Generation]:
        """Several prompts as parallel sequences of one llama.cpp batch (all of them, or an error).
        A (prefix, image, suffix) item is greedy under `grammar` and `max_tokens`; a `Prompt` brings its own."""
        prompts = [it if isinstance(it, Prompt) else Prompt(it[0], it[1], it[2], grammar, max_tokens) for it in items]
        if len(prompts) == 1:
            p = prompts[0]
            return [self.generate(p.prefix, p.image, p.suffix, p.grammar, p.max_tokens, p.sampling, p.on_text,
                                  list(p.stops))]
        out: list[Generation | Exception | None] = [None] * len(prompts)

        def finished(prompt: Prompt, outcome: Generation | Exception) -> None:
            out[prompt.tag] = outcome

        self.serve([replace(p, tag=i) for i, p in enumerate(prompts)], finished)
        for outcome in out:
            if isinstance(outcome, Exception):
                raise outcome
        return [o for o in out if isinstance(o, Generation)]

    def serve(self, prompts: Sequence[Prompt], finished: Finished, admit: Admit | None = None) -> int:
        """Generate the prompts, and those `admit` hands over meanwhile, as parallel sequences that
        join and leave between steps (parallel.py); `finished` hears of each once, with its Generation
        or the reason it failed (a prompt too long for the context fails alone, before it costs a decode).
        Returns the most sequences that ran at once."""
        def checked(batch: Sequence[Prompt]) -> list[Prompt]:
            ok = []
            for p in batch:
                try:
                    prefix, segments, suffix = self._check_prompt(p.prefix, p.image, p.suffix, p.max_tokens)
                except (InputError, InferenceError) as exc:
                    finished(p, exc)
                    continue
                ok.append(replace(p, prefix=prefix, image=segments, suffix=suffix))
            return ok

        more = None if admit is None else (lambda n: checked(admit(n)))
        return self.parallel.serve(checked(prompts), finished, more)

    def check_prompt(self, prompt: Prompt) -> None:
        """InputError (naming the field) when `prompt` cannot fit the context, as generating it would raise."""
        self._check_prompt(prompt.prefix, prompt.image, prompt.suffix, prompt.max_tokens)

    def _check_prompt(self, prefix: Head, image: ImagePart, suffix: list[int], max_tokens: int
                      ) -> tuple[Head, list[Segment], list[int]]:
        segments = image_segments(image)
        prompt_tokens = head_cells(prefix) + sum(len(seg) for seg in segments) + len(suffix)
        if prompt_tokens >= self.n_ctx:
            raise InputError(f"messages: the prompt is {prompt_tokens} tokens, the context holds "
                             f"{self.n_ctx}", field="messages")
        if prompt_tokens + max_tokens > self.n_ctx:
            raise NoRoomToAnswer(prompt_tokens, max_tokens, self.n_ctx)
        for seg in [*segments, *(prefix.segments if isinstance(prefix, Prefix) else ())]:
            if isinstance(seg, np.ndarray) and self.mrope:
                raise InferenceError("this language model uses M-RoPE: its images must come from libmtmd "
                                     "(MediaEmbeds with positions), not as a bare embedding block")
            if isinstance(seg, np.ndarray) and seg.shape[1] != self.n_embd:
                raise InferenceError(f"image embeddings are {seg.shape[1]} wide, the language "
                                     f"model expects {self.n_embd}")
        if not suffix and not segments:
            if isinstance(prefix, Prefix):
                raise InferenceError("a prompt with a fixed Prefix needs a suffix (the last token's logits)")
            if not prefix:
                raise InferenceError("the prompt is empty")
            prefix, suffix = prefix[:-1], prefix[-1:]  # the last prompt token must yield logits
        return prefix, segments, suffix

    def _prefill_prefix(self, prefix: Head) -> int:
        """Reuse the cached prefix KV when the prompt starts the same way; return tokens reused."""
        ctx = self.ctx
        if self.reuse_prefix and prefix and prefix == self._cached_prefix:
            # Drop everything after the prefix: the previous image, its question and answer.
            if ctx.memory_seq_rm(0, len(prefix), -1):
                return len(prefix)
        ctx.memory_clear()
        self._cached_prefix = []
        self.feed.head(self.ctx, prefix)
        self._cached_prefix = prefix if isinstance(prefix, Prefix) else list(prefix)
        return 0

    def borrow_candidates(self) -> Candidates:
        return self._candidate_pool.pop() if self._candidate_pool else Candidates(self.n_vocab)

    def return_candidates(self, candidates: Candidates) -> None:
        self._candidate_pool.append(candidates)

    def piece(self, token: int) -> bytes:
        """The bytes of one token (cached)."""
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self.vocab.piece(token)
        return piece
