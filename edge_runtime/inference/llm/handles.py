"""Owning wrappers for raw llama.cpp handles, and the one place that calls llama.cpp (with mtmd.py
for libmtmd, runtime.py for the library as a whole): nobody else calls a `llama_cpp` function.

In the manner of llama-cpp-python's `_internals` (LlamaModel, LlamaContext, LlamaBatch): a
wrapper is created holding a live handle or not at all (its constructor raises), is a context
manager, and `close()` is idempotent, so a constructor can push it on an `ExitStack` and a later
failing step frees everything built before it. Its methods are the checked llama.cpp calls:
`Context.decode` raises `DecodeError` on a non-zero code, `Context.memory_seq_rm` says whether
it removed. `Llama` (llama-cpp-python's object) owns the main model and context; `Model.view` and
`Context.view` are non-owning wrappers of those, closed (unusable) with it.
"""

from __future__ import annotations

from edge_runtime.inference.engines import llama_cpp  # isort: skip - onnxruntime, then llama_cpp (see engines.py)

import ctypes
from types import TracebackType
from typing import Any, TypeVar

import numpy as np

from edge_runtime.core.errors import InferenceError

_H = TypeVar("_H", bound="_Handle")

TOKEN_ATTR_CONTROL = int(llama_cpp.LLAMA_TOKEN_ATTR_CONTROL)
TOKEN_ATTR_USER_DEFINED = int(llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED)
# llama_token_data as a numpy record (a Candidates array is filled through it, then handed to a sampler)
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class DecodeError(InferenceError):
    """llama_decode returned non-zero (1: no KV slot for the batch, 2: aborted, <0: an error)."""

    def __init__(self, code: int) -> None:
        super().__init__(f"llama_decode failed with code {code}")
        self.code = code


def _keep(_ptr: Any) -> None:
    """The `free` of a view: its owner frees the handle."""


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


Handle = _Handle  # for the other owning wrappers of this package (mtmd.py)


class Vocab:
    """A model's vocabulary: owned by the model, usable while it is open."""

    def __init__(self, model: _Handle) -> None:
        self._model = model
        self._ptr = llama_cpp.llama_model_get_vocab(model.ptr)

    @property
    def ptr(self) -> Any:
        """The llama_vocab pointer (llguidance keeps it: the model must outlive its tokenizer)."""
        if self._model.closed:
            raise RuntimeError("a model is closed")
        return self._ptr

    def n_tokens(self) -> int:
        return int(llama_cpp.llama_vocab_n_tokens(self.ptr))

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.ptr, token))

    def eog_tokens(self) -> frozenset[int]:
        """Every end-of-generation token (looked up once per model, not once per generated token)."""
        ptr, is_eog = self.ptr, llama_cpp.llama_vocab_is_eog
        return frozenset(t for t in range(self.n_tokens()) if is_eog(ptr, t))

    def bos(self) -> int:
        return int(llama_cpp.llama_vocab_bos(self.ptr))

    def eos(self) -> int:
        return int(llama_cpp.llama_vocab_eos(self.ptr))

    def add_bos(self) -> bool:
        """Whether the GGUF asks for a BOS token before the text (tokenizer.ggml.add_bos_token)."""
        return bool(llama_cpp.llama_vocab_get_add_bos(self.ptr))

    def attr(self, token: int) -> int:
        """The token's llama_token_attr bits (TOKEN_ATTR_CONTROL, TOKEN_ATTR_USER_DEFINED, ...)."""
        return int(llama_cpp.llama_vocab_get_attr(self.ptr, token))

    def token_to_piece(self, token: int, buf: Any, special: bool) -> int:
        """llama_token_to_piece into `buf` (a ctypes string buffer): the bytes written, or minus the
        size it needs when it does not fit."""
        return int(llama_cpp.llama_token_to_piece(self.ptr, token, buf, len(buf), 0, special))

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token (the buffer grown when a piece is longer than 64 bytes)."""
        buf = ctypes.create_string_buffer(64)
        n = self.token_to_piece(token, buf, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self.token_to_piece(token, buf, special)
        return buf.raw[:n]

    def tokenize(self, text: bytes, add_special: bool = False, parse_special: bool = False) -> list[int]:
        """The tokens of `text` (the array grown once when llama_tokenize says it needs more)."""
        size = len(text) + 8
        for _ in range(2):
            tokens = (llama_cpp.llama_token * size)()
            n = int(llama_cpp.llama_tokenize(self.ptr, text, len(text), tokens, size, add_special, parse_special))
            if n >= 0:
                return list(tokens[:n])
            size = -n
        raise InferenceError(f"llama_tokenize wanted {size} tokens for {len(text)} bytes")

    def longest_piece(self) -> int:
        """The byte length of the longest token, rendered with its special text (at least 1)."""
        ptr, to_piece, probe = self.ptr, llama_cpp.llama_token_to_piece, ctypes.create_string_buffer(256)
        return max(1, max((abs(to_piece(ptr, t, probe, 256, 0, True)) for t in range(self.n_tokens())), default=0))

    @property
    def tokenize_fptr(self) -> int:
        """The address of llama.cpp's llama_tokenize (llguidance calls it to tokenize forced text)."""
        return int(ctypes.cast(llama_cpp.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value or 0)


_MROPE_TYPES = frozenset({llama_cpp.LLAMA_ROPE_TYPE_MROPE, llama_cpp.LLAMA_ROPE_TYPE_VISION,
                          getattr(llama_cpp, "LLAMA_ROPE_TYPE_IMROPE", 40)})


class Model(_Handle):
    """A model loaded from a GGUF file (`vocab_only`: the vocabulary alone, no weights)."""

    def __init__(self, path: str, vocab_only: bool = False) -> None:
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = vocab_only
        super().__init__(llama_cpp.llama_model_load_from_file(path.encode(), params), llama_cpp.llama_model_free,
                         f"a model from {path}")
        self.vocab = Vocab(self)

    @classmethod
    def view(cls, ptr: Any) -> Model:
        """A non-owning wrapper of a model another owner frees (llama-cpp-python's Llama)."""
        model = cls.__new__(cls)
        _Handle.__init__(model, ptr, _keep, "a model")
        model.vocab = Vocab(model)
        return model

    def n_embd_inp(self) -> int:
        """The width of the input embeddings the model takes (wider than n_embd on Qwen3-VL)."""
        return int(llama_cpp.llama_model_n_embd_inp(self.ptr))

    def keeps_state(self) -> bool:
        """Whether the model carries a recurrent state (Mamba, RWKV, LFM2's convolutions) whose
        positions cannot be cut from the end, as a KV cache's can."""
        return bool(llama_cpp.llama_model_is_recurrent(self.ptr) or llama_cpp.llama_model_is_hybrid(self.ptr))

    def uses_mrope(self) -> bool:
        """Whether the model's positions are M-RoPE's 4 sections (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, ...)."""
        return int(llama_cpp.llama_model_rope_type(self.ptr)) in _MROPE_TYPES


class Context(_Handle):
    """A context (KV cache, logits) over a model's weights; `params`: llama_context_params."""

    def __init__(self, model: Model, params: Any, n_ctx: int, n_seq_max: int) -> None:
        super().__init__(llama_cpp.llama_init_from_model(model.ptr, params), llama_cpp.llama_free, "a context")
        self._setup(n_ctx, n_seq_max)

    @classmethod
    def view(cls, ptr: Any, n_ctx: int, n_seq_max: int = 1) -> Context:
        """A non-owning wrapper of a context another owner frees (llama-cpp-python's Llama)."""
        ctx = cls.__new__(cls)
        _Handle.__init__(ctx, ptr, _keep, "a context")
        ctx._setup(n_ctx, n_seq_max)
        return ctx

    def _setup(self, n_ctx: int, n_seq_max: int) -> None:
        self.n_ctx = n_ctx
        self.n_seq_max = n_seq_max
        model = llama_cpp.llama_get_model(self._ptr)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)))
        self._memory = llama_cpp.llama_get_memory(self._ptr)

    @staticmethod
    def default_params() -> Any:
        """llama.cpp's default llama_context_params (not llama-cpp-python's)."""
        return llama_cpp.llama_context_default_params()

    @property
    def memory(self) -> Any:
        self.ptr  # noqa: B018 - raises once closed
        return self._memory

    def decode(self, batch: Any) -> None:
        """llama_decode of a llama_batch struct, checked: DecodeError when it returns non-zero."""
        rc = llama_cpp.llama_decode(self.ptr, batch)
        if rc != 0:
            raise DecodeError(rc)

    def decode_next(self, token: int) -> None:
        """One token after everything decoded so far (llama.cpp places it), as llama-cpp-python alone
        does; DecodeError when llama_decode fails."""
        arr = (llama_cpp.llama_token * 1)(token)
        self.decode(llama_cpp.llama_batch_get_one(arr, 1))

    def synchronize(self) -> None:
        """Wait until the backend (the GPU) has finished the decodes queued so far."""
        llama_cpp.llama_synchronize(self.ptr)

    def logits_ith(self, i: int) -> np.ndarray:
        """The logits of batch row `i` (-1: the last with logits) as a float32 view [n_vocab] of
        llama.cpp's buffer, valid until the next decode (copy it to keep it)."""
        ptr = llama_cpp.llama_get_logits_ith(self.ptr, i)
        if not ptr:
            raise InferenceError(f"llama.cpp has no logits for batch row {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def set_causal_attn(self, causal: bool) -> None:
        """Causal (the default) or bidirectional attention for the next decodes (Gemma 3's image)."""
        llama_cpp.llama_set_causal_attn(self.ptr, causal)

    def memory_clear(self, data: bool = True) -> None:
        """Empty the KV cache (`data`: the buffers too, not only the metadata)."""
        llama_cpp.llama_memory_clear(self.memory, data)

    def memory_seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        """Drop positions [p0, p1) of sequence `seq` (-1: to the end); False when llama.cpp cannot
        (a partial removal from a recurrent model's state)."""
        return bool(llama_cpp.llama_memory_seq_rm(self.memory, seq, p0, p1))

    def memory_seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Share sequence `src`'s KV cells [p0, p1) with sequence `dst` (-1, -1: all of them)."""
        llama_cpp.llama_memory_seq_cp(self.memory, src, dst, p0, p1)


class Llama(_Handle):
    """llama-cpp-python's Llama: the owner of the main model and context (its `_internals`), with
    `model` and `context` as views of them that read as closed once this is."""

    def __init__(self, path: str, n_ctx: int, n_batch: int, threads: int, gpu_layers: int, kv_type: int,
                 flash_attn: bool = True) -> None:
        llm = llama_cpp.Llama(  # ValueError when the file does not load (its only signal)
            model_path=path, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
            n_threads=threads, n_threads_batch=threads, n_gpu_layers=gpu_layers, verbose=False,
            type_k=kv_type, type_v=kv_type, flash_attn=flash_attn,
        )
        super().__init__(llm, self._close_llm, "a llama.cpp model")
        try:
            self.model = Model.view(llm.model)
            self.context = Context.view(llm.ctx, n_ctx)
        except BaseException:
            llm.close()
            raise
        self.context_params: Any = llm.context_params

    def _close_llm(self, llm: Any) -> None:
        self.context.close()
        self.model.close()
        llm.close()

    def tokenize(self, text: bytes, add_bos: bool, special: bool) -> list[int]:
        return list(self.ptr.tokenize(text, add_bos=add_bos, special=special))


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
        # The address of llama_batch_init's own array, as a number: reading the struct's `pos` field
        # gives a ctypes view of the field itself, which would follow every later assignment (then
        # close() handed our owned array to llama_batch_free: a double free at exit).
        self._pos_type = type(self._batch.pos)
        self._plain_addr = ctypes.cast(self._batch.pos, ctypes.c_void_p).value

    def _plain_pos(self) -> Any:
        return ctypes.cast(ctypes.c_void_p(self._plain_addr), self._pos_type)

    def _free_batch(self, batch: Any) -> None:
        batch.pos = self._plain_pos()
        llama_cpp.llama_batch_free(batch)

    def use_positions(self, positions: Any) -> None:
        """Positions of this batch's entries: [n_tokens] (the plain array) or [n_pos * n_tokens]
        section-major (the owned one), copied in."""
        n = len(positions)
        if n <= self.size:
            self._batch.pos = target = self._plain_pos()
        elif self._own_pos is not None and n <= len(self._own_pos):
            self._batch.pos = ctypes.cast(self._own_pos, self._pos_type)
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


def token_data_array(data: np.ndarray) -> Any:
    """A llama_token_data_array over `data` (a TOKEN_DATA array the caller keeps alive), unsorted,
    nothing selected: what `Sampler.apply` filters in place."""
    if data.dtype != TOKEN_DATA or not data.flags.c_contiguous:
        raise ValueError("a token data array needs a contiguous TOKEN_DATA array")
    return llama_cpp.llama_token_data_array(data.ctypes.data_as(llama_cpp.llama_token_data_p), data.shape[0], -1, False)


class Sampler(_Handle):
    """A llama.cpp sampler: one grammar, or a chain of them (`add` hands ownership to the chain)."""

    def __init__(self, ptr: Any, what: str = "a sampler") -> None:
        super().__init__(ptr, llama_cpp.llama_sampler_free, what)

    @classmethod
    def grammar(cls, vocab: Vocab, gbnf: str) -> Sampler:
        return cls(llama_cpp.llama_sampler_init_grammar(vocab.ptr, gbnf.encode(), b"root"), "a grammar sampler")

    @classmethod
    def chain(cls) -> Sampler:
        return cls(llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params()),
                   "a sampler chain")

    @classmethod
    def greedy(cls) -> Sampler:
        return cls(llama_cpp.llama_sampler_init_greedy(), "a greedy sampler")

    def sample(self, ctx: Context, row: int = -1) -> int:
        """The token this sampler (chain) picks from the logits of `row` (accepted into its state)."""
        return int(llama_cpp.llama_sampler_sample(self.ptr, ctx.ptr, row))

    def apply(self, candidates: Any) -> None:
        """Filter a llama_token_data_array (from `token_data_array`) in place: refused tokens' logits
        become -inf."""
        llama_cpp.llama_sampler_apply(self.ptr, ctypes.byref(candidates))

    def accept(self, token: int) -> None:
        """Advance this sampler's state (a grammar's) past `token`."""
        llama_cpp.llama_sampler_accept(self.ptr, token)

    def add(self, sampler: Sampler) -> None:
        """Move `sampler` into this chain: the chain frees it from now on."""
        llama_cpp.llama_sampler_chain_add(self.ptr, sampler.ptr)
        sampler._ptr = None
