"""Choosing each next token: a grammar (llguidance, or llama.cpp's GBNF sampler), then greedy or sampled.

The context belongs to the model (model.py, parallel.py); a picker only reads a row of its logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from edge_runtime.core.errors import InferenceError
from edge_runtime.inference.llm.constraint import GuidedPicker
from edge_runtime.inference.llm.handles import TOKEN_DATA, Context, Sampler, Vocab, token_data_array


@dataclass(frozen=True)
class Sampling:
    """Greedy when temperature is 0 (inspection verdicts); sampled otherwise (chat requests)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    # Refuse tokens that would make the output invalid UTF-8 (always, for verdicts). Off only to
    # compare raw token streams with a reference implementation.
    valid_utf8: bool = True


GREEDY = Sampling()


class PickerHost(Protocol):
    """What a picker needs of the language model that owns it (llm.model.LanguageModel), typed here
    so picker does not import model (which imports picker)."""

    n_vocab: int
    eog: frozenset[int]
    constraint_engine: str

    @property
    def vocab(self) -> Vocab: ...
    @property
    def ctx(self) -> Context: ...
    def guidance_tokenizer(self) -> Any: ...
    def borrow_candidates(self) -> Candidates: ...
    def return_candidates(self, candidates: Candidates) -> None: ...
    def piece(self, token: int) -> bytes: ...

_NEG_INF = np.float32(-np.inf)
_SHORTLIST = 64  # top logits checked against the grammar before a full-vocabulary pass
_RECHECK = 4096  # llguidance: tokens above the mask's best checked one by one (see _beyond_mask)
_SHORTLIST_PATIENCE = 4  # misses in a row before the shortlist is tried only now and then


class TokenPicker:
    """Chooses each next token: grammar first, then greedy or temperature sampling.

    llama.cpp's grammar decodes UTF-8 leniently (it accepts bytes like 0xF8 and overlong forms),
    so a byte-level vocabulary could otherwise emit bytes that strict JSON parsers reject; every
    candidate is checked to keep the output a valid UTF-8 prefix.
    """

    def __init__(self, lm: PickerHost, grammar: str | None, sampling: Sampling) -> None:
        self.lm = lm
        self.sampling = sampling
        self.rng = np.random.default_rng(sampling.seed)
        self.n_vocab = lm.n_vocab
        self.grammar: Sampler | None = None
        self.guide: GuidedPicker | None = None
        if grammar and lm.constraint_engine == "llguidance":
            self.guide = GuidedPicker(lm.guidance_tokenizer(), grammar, lm.n_vocab, lm.eog)
        elif grammar:
            try:
                self.grammar = Sampler.grammar(lm.vocab, grammar)
            except InferenceError:
                raise InferenceError("the JSON schema could not be turned into a llama.cpp grammar") from None
        self._candidates: Candidates | None = None  # borrowed from the model on the first full pass
        self.shortlist = _SHORTLIST
        self._short = np.zeros(min(_SHORTLIST, self.n_vocab), dtype=TOKEN_DATA)
        self._short_c = token_data_array(self._short)
        self._misses = 0  # shortlist misses in a row
        self._steps = 0
        self.pending = b""  # bytes of an unfinished UTF-8 character
        self.emitted = b""
        self._reported = 0
        self._guessed = 0  # tokens a draft's guesses consumed in the grammar (forget_guesses undoes them)

    def next_token(self, ctx: Context | None = None, index: int = -1) -> tuple[int, bytes]:
        """(token, its bytes), or (-1, b"") at end of generation. `index`: which logits row of the batch."""
        logits = (ctx or self.lm.ctx).logits_ith(index)
        if self.guide is not None:
            return self._next_guided(self.guide, logits)
        if self.grammar is not None and self.sampling.temperature <= 0 and self.shortlist and self._try_shortlist():
            # Exact fast path for greedy decoding: the constrained argmax is the best grammar-accepted
            # token; if one of the top-K logits is accepted, nothing outside them can beat it, so the
            # full-vocabulary grammar pass (milliseconds on a 150k vocabulary) is skipped.
            chosen = self._from_shortlist(logits)
            self._misses = 0 if chosen is not None else self._misses + 1
            if chosen is not None:
                return chosen
        if self.grammar is None:
            scores = logits.copy()
        else:
            if self._candidates is None:
                self._candidates = self.lm.borrow_candidates()
            cand, arr = self._candidates.data, self._candidates.c_array
            cand["logit"] = logits
            arr.size, arr.selected, arr.sorted = self.n_vocab, -1, False
            self.grammar.apply(arr)
            scores = cand["logit"].copy()
        while True:
            token = self._choose(scores)
            if token < 0:
                return -1, b""
            chosen = self._take(token)
            if chosen is not None:
                return chosen
            scores[token] = _NEG_INF

    def _next_guided(self, guide: GuidedPicker, logits: np.ndarray) -> tuple[int, bytes]:
        """llguidance: under greedy decoding the best raw logit is taken when the grammar allows it
        (a few microseconds, no mask); otherwise the best token of the full mask. Exact: if the raw
        argmax is allowed, no allowed token can beat it (ties go to the lowest id, as np.argmax's)."""
        if guide.is_stopped():
            return -1, b""  # the grammar is complete and admits nothing more: end, as an EOG token would
        if self.sampling.temperature <= 0:
            best = int(np.argmax(logits))
            if self._keeps_utf8(best) and guide.try_take(best):
                return self._commit(best)
        scores = np.where(guide.allowed(), logits, _NEG_INF)
        if self.sampling.temperature <= 0:
            token = self._beyond_mask(guide, logits, scores)
            if token >= 0:
                return self._commit(token)
        while True:
            token = self._choose(scores)
            if token < 0:
                return -1, b""
            if self._keeps_utf8(token) and guide.consume(token):
                return self._commit(token)
            scores[token] = _NEG_INF

    def _beyond_mask(self, guide: GuidedPicker, logits: np.ndarray, scores: np.ndarray) -> int:
        """Where the grammar forces text, llguidance's mask holds only its canonical tokenization
        (`defect`, not `d` then `efect`); GBNF admits every spelling. For the exact greedy choice,
        the tokens starting with the forced byte that beat the mask's best are tried, best first."""
        candidates = guide.forced_candidates()
        if candidates.size == 0:
            return -1
        above = candidates[logits[candidates] > scores.max()]
        if above.size > _RECHECK:
            above = above[np.argpartition(-logits[above], _RECHECK)[:_RECHECK]]
        above = above[np.lexsort((above, -logits[above]))]  # best first; ties by id, as np.argmax
        for token in above.tolist():
            if self._keeps_utf8(token) and guide.try_take(token):
                return int(token)
        return -1

    def _keeps_utf8(self, token: int) -> bool:
        """The UTF-8 guard: a token may follow if the output stays a valid UTF-8 prefix; an end only
        between characters. llguidance's byte-level lexer checks this too; the guard costs ~1 µs."""
        if token in self.lm.eog:
            return not self.pending
        if not self.sampling.valid_utf8:
            return True
        piece = self.lm.piece(token)
        return bool(piece) and _utf8_prefix(self.pending + piece)[0]

    def _commit(self, token: int) -> tuple[int, bytes]:
        if token in self.lm.eog:
            return -1, b""
        piece = self.lm.piece(token)
        if self.sampling.valid_utf8:
            self.pending = _utf8_prefix(self.pending + piece)[1]
        self.emitted += piece
        return token, piece

    def forced(self, limit: int) -> list[tuple[int, bytes]]:
        """Up to `limit` tokens the grammar forces next, already accepted (llguidance only): the caller
        decodes them with the chosen token in one batch instead of one llama_decode each."""
        return [self._commit(t) for t in self._forced_ids(limit)]

    def _forced_ids(self, limit: int) -> list[int]:
        """Up to `limit` tokens the grammar forces next, consumed by it (llguidance only)."""
        if self.guide is None or limit <= 0:
            return []
        ids = self.guide.forced()
        if len(ids) > limit:
            self.guide.rollback(len(ids) - limit)
            ids = ids[:limit]
        return ids

    # -- a draft model's guesses (draft.py): what this picker would take from the draft's logits ----
    def guess(self, logits: np.ndarray) -> int:
        """The token this picker would take next, greedy, from a draft model's `logits` (its vocabulary
        may be a little larger or smaller), given what it took and guessed so far: consumed by the
        grammar until `forget_guesses`. -1: none (an end, or nothing the grammar allows)."""
        logits = logits[: self.n_vocab]
        best = int(np.argmax(logits))
        if best in self.lm.eog:
            return -1
        guide = self.guide
        if guide is None:
            return best  # no grammar, or llama.cpp's GBNF sampler (checked by the real pick)
        if guide.is_stopped():
            return -1
        if guide.try_take(best):
            self._guessed += 1
            return best
        allowed = guide.allowed(count=False)[: logits.shape[0]]
        scores = np.where(allowed, logits, _NEG_INF)
        token = int(np.argmax(scores))
        if not np.isfinite(scores[token]) or token in self.lm.eog or not guide.consume(token):
            return -1
        self._guessed += 1
        return token

    def guess_forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens the grammar forces after the guesses so far (consumed, as guesses)."""
        ids = self._forced_ids(limit)
        self._guessed += len(ids)
        return ids

    def forget_guesses(self) -> None:
        """Undo what `guess` and `guess_forced` consumed: the grammar is where the real picks left it."""
        if self._guessed and self.guide is not None:
            self.guide.rollback(self._guessed)
        self._guessed = 0

    def _try_shortlist(self) -> bool:
        """After a run of misses (a model whose top logits the grammar keeps rejecting, e.g. random
        weights) try the shortlist only on every 8th token, so it costs ~nothing when it cannot help."""
        self._steps += 1
        return self._misses < _SHORTLIST_PATIENCE or self._steps % 8 == 0

    def _take(self, token: int) -> tuple[int, bytes] | None:
        """Accept `token` if it keeps the output valid UTF-8 (and ends only between characters)."""
        if token in self.lm.eog:
            return None if self.pending else (-1, b"")  # never stop inside a character
        piece = self.lm.piece(token)
        if not self.sampling.valid_utf8:
            self.emitted += piece
            if self.grammar is not None:
                self.grammar.accept(token)
            return token, piece
        ok, pending = _utf8_prefix(self.pending + piece)
        if not ok or (not piece and self.grammar is not None):
            return None
        self.pending = pending
        self.emitted += piece
        if self.grammar is not None:
            self.grammar.accept(token)
        return token, piece

    def _from_shortlist(self, logits: np.ndarray) -> tuple[int, bytes] | None:
        k = self._short.shape[0]
        top = np.argpartition(logits, -k)[-k:]
        top = top[np.lexsort((top, -logits[top]))]  # best first; ties by token id, as np.argmax breaks them
        short = self._short
        short["id"], short["logit"] = top, logits[top]
        arr = self._short_c
        arr.size, arr.selected, arr.sorted = k, -1, False
        assert self.grammar is not None  # the shortlist is tried with a llama.cpp grammar only
        self.grammar.apply(arr)
        for token, logit in zip(short["id"].tolist(), short["logit"].tolist(), strict=True):
            if logit != float("-inf"):
                chosen = self._take(int(token))
                if chosen is not None:
                    return chosen
        return None  # nothing acceptable in the shortlist: take the full pass

    def _choose(self, scores: np.ndarray) -> int:
        best = int(np.argmax(scores))
        if not np.isfinite(scores[best]):
            return -1  # nothing allowed: treat as the end
        if self.sampling.temperature <= 0:
            return best
        finite = np.isfinite(scores)
        z = (scores[finite] - scores[best]) / self.sampling.temperature
        probs = np.exp(z)
        probs /= probs.sum()
        ids = np.flatnonzero(finite)
        if self.sampling.top_p < 1.0:
            order = np.argsort(-probs)
            keep = order[: int(np.searchsorted(np.cumsum(probs[order]), self.sampling.top_p)) + 1]
            ids, probs = ids[keep], probs[keep] / probs[keep].sum()
        return int(self.rng.choice(ids, p=probs))

    def text_so_far_delta(self) -> str:
        """Complete characters emitted since the last call (for streaming)."""
        complete = self.emitted[: len(self.emitted) - len(self.pending)]
        delta = complete[self._reported:]
        self._reported = len(complete)
        return delta.decode("utf-8")

    def close(self) -> None:
        if self.guide is not None:
            self.guide.close()
            self.guide = None
        if self.grammar is not None:
            self.grammar.close()
            self.grammar = None
        if self._candidates is not None:
            self.lm.return_candidates(self._candidates)
            self._candidates = None


class Candidates:
    """A llama_token_data array over the whole vocabulary, with a numpy view for filling logits."""

    def __init__(self, n_vocab: int) -> None:
        self.data = np.zeros(n_vocab, dtype=TOKEN_DATA)
        self.data["id"] = np.arange(n_vocab, dtype=np.int32)
        self.c_array = token_data_array(self.data)


def _utf8_prefix(data: bytes) -> tuple[bool, bytes]:
    """Is `data` valid UTF-8 up to a possibly unfinished last character? Returns (ok, unfinished)."""
    try:
        data.decode("utf-8")
        return True, b""
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data" and exc.end == len(data):
            return True, data[exc.start:]
        return False, b""
