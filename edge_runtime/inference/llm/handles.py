"""Owning wrappers for raw llama.cpp handles: each frees its handle once, on the first `close()`.

In the manner of llama-cpp-python's `_internals` (LlamaModel, LlamaContext, LlamaBatch): a
wrapper is created holding a live handle or not at all (its constructor raises), is a context
manager, and `close()` is idempotent, so a constructor can push it on an `ExitStack` and a later
failing step frees everything built before it.
"""

from __future__ import annotations

from edge_runtime.inference.engines import llama_cpp  # isort: skip - onnxruntime, then llama_cpp (see engines.py)

import ctypes
from types import TracebackType
from typing import Any, TypeVar

import numpy as np

from edge_runtime.core.errors import InferenceError

_H = TypeVar("_H", bound="_Handle")


class _Handle:
    """A native pointer and the function that frees it."""

    def __init__(self, ptr: Any, free: Any, what: str) -> None:
        if not ptr:
            raise InferenceError(f"llama.cpp could not create {what}")
        self._ptr: Any = ptr
        self._free = free
        self._what = what

    @property
    def ptr(self) -> Any:
        if self._ptr is None:
            raise RuntimeError(f"{self._what} is closed")
        return self._ptr

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            self._free(ptr)

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class Model(_Handle):
    """A model loaded from a GGUF file (`vocab_only`: the vocabulary alone, no weights)."""

    def __init__(self, path: str, vocab_only: bool = False) -> None:
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = vocab_only
        super().__init__(llama_cpp.llama_model_load_from_file(path.encode(), params), llama_cpp.llama_model_free,
                         f"a model from {path}")

    @property
    def vocab(self) -> Any:
        return llama_cpp.llama_model_get_vocab(self.ptr)


class Context(_Handle):
    """A context (KV cache, logits) over a model's weights; `params`: llama_context_params."""

    def __init__(self, model: Any, params: Any, n_ctx: int, n_seq_max: int) -> None:
        super().__init__(llama_cpp.llama_init_from_model(model, params), llama_cpp.llama_free, "a context")
        self.n_ctx = n_ctx
        self.n_seq_max = n_seq_max

    @property
    def memory(self) -> Any:
        return llama_cpp.llama_get_memory(self.ptr)


Handle = _Handle  # for the other owning wrappers of this package (mtmd.py)


class Batch(_Handle):
    """A llama_batch of up to `size` tokens, or of embeddings `embd` wide when `embd` > 0.

    `n_pos` > 1: room for that many positions per entry (M-RoPE: 4, section-major over the batch's
    n_tokens), in an array this wrapper owns; llama_batch_init's own `pos` is put back before freeing."""

    def __init__(self, size: int, embd: int = 0, n_pos: int = 1) -> None:
        self._batch = llama_cpp.llama_batch_init(size, embd, 1)
        self._own_pos: Any = None
        if n_pos > 1:
            self._own_pos = (llama_cpp.llama_pos * (size * n_pos))()
        # llama_batch_init returns the struct by value: keep it, and free that struct
        super().__init__(self._batch, self._free_batch, "a batch")
        self.size = size
        self.n_pos = n_pos
        self._plain_pos = self._batch.pos

    def _free_batch(self, batch: Any) -> None:
        batch.pos = self._plain_pos
        llama_cpp.llama_batch_free(batch)

    def use_positions(self, positions: Any) -> None:
        """Positions of this batch's entries: [n_tokens] (the plain array) or [n_pos * n_tokens]
        section-major (the owned one), copied in."""
        n = len(positions)
        if n <= self.size:
            self._batch.pos = self._plain_pos
            target = self._plain_pos
        elif self._own_pos is not None and n <= len(self._own_pos):
            self._batch.pos = ctypes.cast(self._own_pos, type(self._plain_pos))
            target = self._own_pos
        else:
            raise InferenceError(f"{n} positions do not fit a batch of {self.size}")
        arr = np.ascontiguousarray(positions, dtype=np.int32)
        ctypes.memmove(target, arr.ctypes.data, n * ctypes.sizeof(llama_cpp.llama_pos))

    @property
    def struct(self) -> Any:  # llama_batch (typed loosely: its seq_id is an array of arrays)
        if self.closed:
            raise RuntimeError("a batch is closed")
        return self._batch


class Sampler(_Handle):
    """A llama.cpp sampler: one grammar, or a chain of them (`add` hands ownership to the chain)."""

    def __init__(self, ptr: Any, what: str = "a sampler") -> None:
        super().__init__(ptr, llama_cpp.llama_sampler_free, what)

    @classmethod
    def grammar(cls, vocab: Any, gbnf: str) -> Sampler:
        return cls(llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root"), "a grammar sampler")

    @classmethod
    def chain(cls) -> Sampler:
        return cls(llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params()),
                   "a sampler chain")

    @classmethod
    def greedy(cls) -> Sampler:
        return cls(llama_cpp.llama_sampler_init_greedy(), "a greedy sampler")

    def sample(self, ctx: Any, row: int = -1) -> int:
        """The token this sampler (chain) picks from the logits of `row` (accepted into its state)."""
        return int(llama_cpp.llama_sampler_sample(self.ptr, ctx, row))

    def add(self, sampler: Sampler) -> None:
        """Move `sampler` into this chain: the chain frees it from now on."""
        llama_cpp.llama_sampler_chain_add(self.ptr, sampler.ptr)
        sampler._ptr = None


def is_end_of_generation(vocab: Any, token: int) -> bool:
    return bool(llama_cpp.llama_vocab_is_eog(vocab, token))


def decode(ctx: Any, batch: Any) -> None:
    """llama_decode, checked: InferenceError when it returns non-zero (1: no KV slot, <0: an error)."""
    rc = llama_cpp.llama_decode(ctx, batch)
    if rc != 0:
        raise InferenceError(f"llama_decode failed with code {rc}")


def set_causal_attn(ctx: Any, causal: bool) -> None:
    """Causal (the default) or bidirectional attention for the next decodes of `ctx` (Gemma 3's image)."""
    llama_cpp.llama_set_causal_attn(ctx, causal)


def n_embd_inp(model: Any) -> int:
    """The width of the input embeddings the model takes (wider than n_embd on Qwen3-VL)."""
    return int(llama_cpp.llama_model_n_embd_inp(model))


_MROPE_TYPES = frozenset({llama_cpp.LLAMA_ROPE_TYPE_MROPE, llama_cpp.LLAMA_ROPE_TYPE_VISION,
                          getattr(llama_cpp, "LLAMA_ROPE_TYPE_IMROPE", 40)})


def uses_mrope(model: Any) -> bool:
    """Whether the model's positions are M-RoPE's 4 sections (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, ...)."""
    return int(llama_cpp.llama_model_rope_type(model)) in _MROPE_TYPES


def decode_next(ctx: Any, token: int) -> None:
    """One token after everything decoded so far (llama.cpp places it), as llama-cpp-python alone does;
    InferenceError when llama_decode fails."""
    arr = (llama_cpp.llama_token * 1)(token)
    code = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, 1))
    if code != 0:
        raise InferenceError(f"llama_decode failed ({code})")


def engine_info() -> dict[str, object]:
    """The llama.cpp build: the binding's version and whether it offloads to a GPU."""
    return {"llama_cpp_python": llama_cpp.__version__, "gpu_offload": bool(llama_cpp.llama_supports_gpu_offload())}
