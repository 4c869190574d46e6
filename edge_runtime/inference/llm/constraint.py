"""Grammar-constrained decoding at mask speed, on llguidance.

The constraint is the same GBNF grammar the llama.cpp path uses (grammar.py builds it from the JSON
schema), translated once to llguidance's Lark dialect, so both engines admit exactly the same
texts and greedy decoding picks the same tokens. Each step first takes the best raw logit and asks
the matcher whether it may follow (microseconds); only when it may not is the full token mask
computed (tens of microseconds, in Rust without the GIL). Tokens the grammar forces are handed back
so the caller can decode them in one batch.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from functools import lru_cache
from typing import Any

import llguidance
import numpy as np
from llguidance.gbnf_to_lark import gbnf_to_lark

from edge_runtime.core.errors import InferenceError, InputError
from edge_runtime.inference.llm.handles import TOKEN_ATTR_CONTROL, TOKEN_ATTR_USER_DEFINED, Model, Vocab

# Tokenizers are built from the GGUF vocabulary (seconds for a 262k vocabulary): keep the last few,
# keyed by the language model's sha256 from bundle.yaml.
_TOKENIZERS: OrderedDict[str, Any] = OrderedDict()
_TOKENIZERS_KEEP = 2
_TOKENIZERS_LOCK = threading.Lock()
# Per-step work is bounded (llguidance's fuel limits); grammar size is bounded by schema_budget.
_LIMITS = llguidance.LLParserLimits(verbose_errors=False)
_MATCHER_GRAMMARS = 16  # grammars whose spare matchers are kept
_MATCHERS_PER_GRAMMAR = 8  # a batch of cameras needs one each


class VocabTokenizer:
    """llguidance's tokenizer over a vocab-only load of the GGUF, which it owns: llguidance keeps
    llama.cpp's vocabulary pointer for tokenizing forced text, so the pointer must outlive every
    matcher (a tokenizer cached past its model's close() crashed the process)."""

    def __init__(self, path: str, n_vocab: int, eog: frozenset[int]) -> None:
        try:
            self._model = Model(path, vocab_only=True)
        except InferenceError:
            raise InferenceError(f"{path}: llama.cpp could not read the vocabulary") from None
        vocab = self._model.vocab
        self.lock = threading.Lock()
        self.matchers: dict[str, list[Any]] = {}  # reset matchers by grammar, for reuse
        self.tokenizer, pieces = _build_tokenizer(vocab, n_vocab, eog)
        # Token ids by first byte, for the exact greedy choice where the grammar forces text.
        first = np.array([p[0] if p else 256 for p in pieces], dtype=np.int32)
        order = np.argsort(first, kind="stable")
        bounds = np.searchsorted(first[order], np.arange(258))
        self.by_first_byte = [order[bounds[b]:bounds[b + 1]] for b in range(256)]

    def __del__(self) -> None:
        if getattr(self, "_model", None) is not None:
            self._model.close()


def tokenizer_for(path: str, n_vocab: int, eog: frozenset[int], key: str) -> VocabTokenizer:
    """The tokenizer for a model file, cached per checksum (seconds to build for 262k tokens)."""
    with _TOKENIZERS_LOCK:
        tok = _TOKENIZERS.get(key)
        if tok is None:
            tok = _TOKENIZERS[key] = VocabTokenizer(path, n_vocab, eog)
            while len(_TOKENIZERS) > _TOKENIZERS_KEEP:
                _TOKENIZERS.popitem(last=False)  # freed when the last picker using it is gone
        else:
            _TOKENIZERS.move_to_end(key)
        return tok


def _build_tokenizer(vocab: Vocab, n_vocab: int, eog: frozenset[int]) -> tuple[Any, list[bytes]]:
    """llguidance.llamacpp.lltokenizer_from_vocab without its deprecated llama.cpp call: each token's
    bytes, control tokens marked with a 0xFF prefix so no grammar text can produce them."""
    buf = ctypes.create_string_buffer(16 * 1024)
    tokens: list[bytes] = []
    for token in range(n_vocab):
        n = vocab.token_to_piece(token, buf, True)
        piece = buf.raw[:max(n, 0)]
        attr = vocab.attr(token)
        if attr & TOKEN_ATTR_CONTROL or (attr & TOKEN_ATTR_USER_DEFINED and piece.startswith(b"<")
                                         and piece.endswith(b">")):
            piece = b"\xff" + piece
        tokens.append(piece)
    eos = sorted(eog) or [vocab.eos()]
    tokenizer = llguidance.LLTokenizer.from_llamacpp(  # type: ignore[attr-defined]  # not in its stubs
        tokens=tokens, vocab_ptr=vocab.ptr, tokenize_fptr=vocab.tokenize_fptr, eos_token=eos, slices=None)
    return tokenizer, tokens


@lru_cache(maxsize=64)
def lark_for(gbnf: str) -> str:
    """The llguidance grammar (JSON-wrapped Lark) for a GBNF text; bounded cache of compiled schemas.
    A grammar the translator cannot take is an InputError (a 400 for a client's schema)."""
    field = "response_format.json_schema"
    try:
        grammar = str(llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(gbnf)))
        problem = llguidance.LLMatcher.validate_grammar(grammar)  # what building a matcher would refuse
    except RecursionError:
        raise InputError(f"{field}: the schema nests too deeply for the grammar translator", field=field) from None
    except Exception as exc:  # noqa: BLE001 - the translator raises its own error types
        raise InputError(f"{field}: the constraint engine cannot express this schema "
                         f"({type(exc).__name__}: {str(exc)[:160]})", field=field) from None
    if problem:
        first = next((line for line in problem.splitlines() if line.strip()), problem)
        raise InputError(f"{field}: the constraint engine cannot express this schema ({first[:160]})", field=field)
    return grammar


class GuidedPicker:
    """One sequence's constrained token choice; the same interface as language._TokenPicker."""

    def __init__(self, vocab: VocabTokenizer, gbnf: str, n_vocab: int, eog: frozenset[int]) -> None:
        self.vocab = vocab  # keeps the vocabulary alive while this matcher lives
        self._key = lark_for(gbnf)
        # A new LLMatcher costs ~5 ms (its lexer is built); a finished one is reset and reused.
        with vocab.lock:
            spare = vocab.matchers.get(self._key)
            matcher = spare.pop() if spare else None
        if matcher is None:
            matcher = llguidance.LLMatcher(vocab.tokenizer, self._key, log_level=0, limits=_LIMITS)
            if matcher.is_error():
                raise InferenceError(f"the grammar could not be compiled: {matcher.get_error()[:200]}")
        self.matcher: Any = matcher
        self.n_vocab = n_vocab
        self.eog = eog
        self.mask = np.zeros((n_vocab + 31) // 32, dtype=np.int32)
        self.full_masks = 0  # steps whose best raw logit the grammar refused (for the bench)

    def close(self) -> None:
        """Hand the matcher back for the next generation under the same grammar (bounded pool)."""
        matcher, self.matcher = self.matcher, None
        if matcher is None or matcher.is_error() or not matcher.reset():
            return
        with self.vocab.lock:
            if self._key not in self.vocab.matchers and len(self.vocab.matchers) >= _MATCHER_GRAMMARS:
                self.vocab.matchers.pop(next(iter(self.vocab.matchers)))
            spare = self.vocab.matchers.setdefault(self._key, [])
            if len(spare) < _MATCHERS_PER_GRAMMAR:
                spare.append(matcher)

    def allowed(self, count: bool = True) -> np.ndarray:
        """Bool per token: may it come next? Computed in Rust with the GIL released. `count`: one more
        step whose best raw logit was refused (a draft's guesses are not counted)."""
        self.matcher.unsafe_compute_mask_ptr(self.mask.ctypes.data, self.mask.nbytes)
        self.full_masks += count
        bits = np.unpackbits(self.mask.view(np.uint8), bitorder="little")[: self.n_vocab]
        return bits.view(bool)

    def try_take(self, token: int) -> bool:
        """Consume `token` if the grammar allows it next (an end-of-generation token when it may end)."""
        if token in self.eog:
            return bool(self.matcher.is_accepting())
        return bool(self.matcher.try_consume_tokens([token]) == 1)

    def forced(self) -> list[int]:
        """Tokens the grammar forces next (already consumed): decode them as one batch."""
        if self.matcher.is_stopped():
            return []
        ff = list(self.matcher.compute_ff_tokens())
        if ff and self.matcher.try_consume_tokens(ff) != len(ff):
            raise InferenceError("llguidance refused its own forced tokens")
        return ff

    def forced_candidates(self) -> np.ndarray:
        """Where the grammar forces bytes, every token starting with the first of them (the mask
        holds only the canonical one); empty elsewhere."""
        forced = self.matcher.compute_ff_bytes()
        if not forced:
            return np.empty(0, dtype=np.int64)
        return self.vocab.by_first_byte[forced[0]]

    def is_stopped(self) -> bool:
        return bool(self.matcher.is_stopped())

    def rollback(self, n: int) -> None:
        self.matcher.rollback(n)

    def consume(self, token: int) -> bool:
        if token in self.eog:
            return bool(self.matcher.is_accepting())
        return bool(self.matcher.consume_token(token))
