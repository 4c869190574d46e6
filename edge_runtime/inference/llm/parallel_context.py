"""The llama.cpp context of the parallel sequences (parallel.py), and what they need of the model.

Its numerics are the one-at-a-time context's (a difference there changed real-weight verdicts); its
KV cache is one stream per sequence or one unified buffer (`model.batch_kv_cache`).
"""

from __future__ import annotations

from typing import Any, Protocol

from edge_runtime.core.errors import InferenceError
from edge_runtime.inference.llm.draft import Drafter
from edge_runtime.inference.llm.feed import Feed
from edge_runtime.inference.llm.handles import Context, Model
from edge_runtime.inference.llm.picker import PickerHost


class ParallelHost(PickerHost, Protocol):
    """What the parallel sequences need of the model that owns them (llm.model.LanguageModel)."""

    n_ctx: int
    n_batch: int
    threads: int
    kv_type: int
    batch_kv_cache: str
    fast_forward: bool
    steady_steps: bool
    feed: Feed
    drafter: Drafter | None

    @property
    def model(self) -> Model: ...
    @property
    def context_params(self) -> Any: ...


def parallel_context(lm: ParallelHost, sequences: int, n_ctx: int) -> Context:
    """A context over the model's weights of `n_ctx` KV cells in all, for `sequences` sequences."""
    params = Context.default_params()
    params.n_ctx = n_ctx
    params.n_batch = params.n_ubatch = lm.n_batch
    params.n_seq_max = sequences
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
        return Context(lm.model, params, n_ctx, sequences)
    except InferenceError:
        raise InferenceError("llama.cpp could not create a context for parallel sequences") from None
