"""Speculative decoding's draft: a small model of the same vocabulary guesses the next tokens, and the
language model checks all of them in one batch (speculate.py), as llama-server's `--model-draft` does.

Greedy decoding only: the language model still picks every token from its own logits under the
grammar, so the answer is the one it gives without a draft. A guess it agrees with saves that
token's own step; a wrong guess costs a batch row and the draft's step. On a GPU, where a step is
bound by kernel launches, the extra rows are nearly free; on a CPU each row costs its share.

A draft of the image embeddings' width (the language model cut to its first layers) reads the
prompt's image too; any other draft (a smaller text model of the family) its text alone. How many
tokens it guesses adapts (`DraftLength`): more while its guesses are taken, fewer when they are not,
and none for a while (longer each time) when even one is refused, so a draft that rarely agrees costs
about nothing. The guesses are the ones the sequence's grammar would allow (picker.guess), and the
tokens it forces after a guess are guessed with it.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path

from edge_runtime.core.errors import BundleError, ConfigError
from edge_runtime.inference.llm.feed import Feed, Segment
from edge_runtime.inference.llm.handles import Llama, Model, Vocab
from edge_runtime.inference.llm.picker import TokenPicker

log = logging.getLogger(__name__)

_VOCAB_SLACK = 128  # vocabularies may differ in padding at the end (llama.cpp's speculative check)
_PAUSE_FIRST, _PAUSE_MOST = 4, 64  # steps without drafting after a refused guess: doubles up to this
# The time rule: after _SAMPLES steps each way, guessing that costs more time per token than plain steps
# stops for _SLOW_FIRST steps, doubling up to _SLOW_MOST; every _PROBE-th step is plain, to keep measuring.
_SAMPLES, _PROBE, _SLOW_FIRST, _SLOW_MOST = 6, 16, 32, 2048
_EMA = 0.25  # weight of the newest step in the per-token averages


class DraftLength:
    """How many tokens to draft at the next step (0: none). Two rules. Per guess: more after a step
    whose guesses were all taken, as many as were right after a partly right one, none for a few
    steps (longer each time) after a wrong single guess. Per time: the step measures its seconds per
    answer token with and without guesses (`timed`); where guessing is the slower, it stops for a
    while (longer each time), so a draft that does not pay on this machine costs about nothing."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.now = most
        self._pause = 0  # steps left without drafting
        self._next_pause = _PAUSE_FIRST
        self._next_slow = _SLOW_FIRST
        self._steps = 0
        self._per_token: dict[bool, float] = {}  # guessed or not: seconds per answer token (moving average)
        self._samples = {True: 0, False: 0}
        self._owed = {True: 0.0, False: 0.0}  # seconds of steps that gave no new token
        self.proposed = 0  # drafted tokens, since load
        self.accepted = 0  # of them, those the language model picked too
        self.slow_pauses = 0  # times the time rule stopped the guessing

    def take(self) -> int:
        self._steps += 1
        if self._pause > 0:
            self._pause -= 1
            return 0
        # A plain step now and then: what a token costs without guesses, on this machine now (every
        # third step until there are enough such samples, so a draft that does not pay stops early).
        if self._steps % (_PROBE if self._samples[False] >= _SAMPLES else 3) == 0:
            return 0
        if min(self._samples.values()) >= _SAMPLES and self._per_token[True] > self._per_token[False]:
            self._pause, self._next_slow = self._next_slow, min(_SLOW_MOST, self._next_slow * 2)
            self._samples[True] = 0  # measured again after the pause
            self.slow_pauses += 1
            return 0
        return self.now

    def timed(self, guessed: bool, seconds: float, tokens: int) -> None:
        """One step of the sequence running alone took `seconds` and gave `tokens` answer tokens."""
        if tokens <= 0:  # a step that only fed tokens counted already: its time goes with the next one
            self._owed[guessed] += seconds
            return
        per = (seconds + self._owed[guessed]) / tokens
        self._owed[guessed] = 0.0
        last = self._per_token.get(guessed)
        self._per_token[guessed] = per if last is None or self._samples[guessed] == 0 else last + _EMA * (per - last)
        self._samples[guessed] += 1
        if guessed and min(self._samples.values()) >= _SAMPLES and self._per_token[True] <= self._per_token[False]:
            self._next_slow = _SLOW_FIRST  # guessing pays now: a later slow spell starts with a short pause

    def update(self, proposed: int, accepted: int) -> None:
        self.proposed += proposed
        self.accepted += accepted
        if accepted == proposed:
            self.now = min(self.most, self.now + 1)
            self._next_pause = _PAUSE_FIRST
        elif accepted > 0:
            self.now = max(1, accepted)
        elif self.now > 1:
            self.now //= 2
        else:
            self._pause, self._next_pause = self._next_pause, min(_PAUSE_MOST, self._next_pause * 2)


class Drafter:
    """Owns the draft model, its context and batches; proposes greedy continuations of one sequence.
    `close()` (idempotent) frees them. Not thread-safe (the language model's worker calls it)."""

    def __init__(self, path: Path, target: Model, context_size: int, threads: int, gpu_layers: int,
                 batch_size: int, kv_type: int, flash_attention: bool, tokens: int) -> None:
        self.path = path
        self.length = DraftLength(tokens)
        self._owner: object = None  # whose prompt the draft context holds
        self._prefix: list[int] = []  # that prompt's prefix, at positions 0..
        self._base = 0  # the position after that prompt
        self._held: list[int] = []  # the answer tokens decoded after it
        self.failures = 0  # proposals that raised (the answer went on without them)
        with ExitStack() as stack:
            try:
                llm = Llama(str(path), context_size, batch_size, threads, gpu_layers, kv_type, flash_attention)
            except ValueError as exc:
                raise BundleError(f"model.draft_model: {path} could not be loaded by llama.cpp ({exc})") from None
            stack.callback(llm.close)
            self._llm = llm
            self.n_vocab = _check_vocab(path, llm.model.vocab, target.vocab)
            # A draft of the image embeddings' width and positions (the language model cut to its first
            # layers, models/draft.py) reads the image too; any other reads the prompt's text alone.
            self.sees_images = (llm.model.n_embd_inp() == target.n_embd_inp()
                                and llm.model.uses_mrope() == target.uses_mrope())
            self.feed = Feed(batch_size, llm.model.n_embd_inp())
            stack.callback(self.feed.close)
            self._stack = stack.pop_all()

    def close(self) -> None:
        self._owner, self._held = None, []
        self._stack.close()

    def status(self) -> dict[str, object]:
        """Counters since load, for /api/v1/status and /metrics (read from another thread: plain ints)."""
        length = self.length
        return {"model": self.path.name, "guessed": length.proposed, "taken": length.accepted,
                "slow_pauses": length.slow_pauses, "failures": self.failures}

    def failed(self) -> None:
        """A proposal raised: count it, log it, and empty the draft context (its state is in doubt)."""
        self.failures += 1
        log.warning("the draft model %s failed (%d so far); this step runs without its guesses",
                    self.path.name, self.failures, exc_info=self.failures == 1)
        self._owner, self._held, self._prefix = None, [], []
        self._llm.context.memory_clear()

    def propose(self, owner: object, prompt: tuple[list[int], list[Segment], list[int]], answer: list[int],
                n: int, picker: TokenPicker) -> list[int]:
        """Up to `n` next tokens of the sequence `owner` after its `prompt` and the `answer` so far, each
        the one `picker` (the sequence's own, so its grammar) would take from the draft's logits; they
        are consumed by its grammar tentatively, and the caller undoes that (`forget_guesses`). The
        draft context keeps what it decoded: a call decodes only the tokens picked since the last."""
        ctx = self._llm.context
        if owner is not self._owner:
            self._start(owner, *prompt)
        keep = _common_prefix(self._held, answer)
        if keep == len(answer):
            keep -= 1  # decoded already: decode its last token again for its logits
        if keep < len(self._held):
            ctx.memory_seq_rm(0, self._base + keep, -1)
        self._held = answer[:keep]  # until the decode below succeeds
        pos = self.feed.token_ids(ctx, answer[keep:], self._base + keep, want_last_logits=True)
        self._held = list(answer)
        drafts: list[int] = []
        while len(drafts) < n:
            token = picker.guess(ctx.logits_ith(-1))
            if token < 0:
                break
            step = [token, *picker.guess_forced(n - len(drafts) - 1)]
            drafts += step
            if len(drafts) < n:
                pos = self.feed.token_ids(ctx, step, pos, want_last_logits=True)
                self._held += step
        return drafts

    def _start(self, owner: object, prefix: list[int], segments: list[Segment], suffix: list[int]) -> None:
        """Decode a new prompt, keeping the KV of the last prompt's prefix when it starts the same way."""
        ctx = self._llm.context
        self._owner = None
        keep = len(prefix) if prefix == self._prefix else 0
        if not ctx.memory_seq_rm(0, keep, -1):
            ctx.memory_clear()
            keep = 0
        self._prefix = []
        pos = self.feed.token_ids(ctx, prefix[keep:], keep, want_last_logits=False)
        self._prefix = list(prefix)
        parts: list[Segment] = segments if self.sees_images else [s for s in segments if isinstance(s, list)]
        pos = self.feed.segments(ctx, parts, pos, want_last_logits=False)
        self._base = self.feed.token_ids(ctx, suffix, pos, want_last_logits=False)
        self._owner, self._held = owner, []


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _check_vocab(path: Path, draft: Vocab, target: Vocab) -> int:
    """The draft must spell tokens as the language model does: same special tokens, the same
    pieces for every id both have. Returns the draft's vocabulary size."""
    n_draft, n_target = draft.n_tokens(), target.n_tokens()
    if abs(n_draft - n_target) > _VOCAB_SLACK:
        raise ConfigError(f"model.draft_model: {path} has {n_draft} tokens, the language model {n_target}: "
                          "a draft needs the same tokenizer")
    if (draft.bos(), draft.eos()) != (target.bos(), target.eos()):
        raise ConfigError(f"model.draft_model: {path}'s BOS/EOS tokens differ from the language model's")
    for token in range(min(n_draft, n_target)):
        if draft.piece(token, special=True) != target.piece(token, special=True):
            raise ConfigError(f"model.draft_model: {path} spells token {token} differently from the "
                              "language model: a draft needs the same tokenizer")
    return n_draft
