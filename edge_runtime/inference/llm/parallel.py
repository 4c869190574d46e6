"""Several prompts as parallel sequences of one llama.cpp context, on a second context.

Each prompt brings its own grammar, sampling, length, stop strings and stream (a camera's verdict
and a chat completion share one batch). Every step decodes the chosen token, plus the tokens the
grammar forces, of every running sequence in one llama_decode, which is how a GPU (bound by
per-token overhead, not bandwidth) and a CPU (bound by reading the weights) turn several cameras and
chat clients into more throughput. A prompt that arrives meanwhile is prefilled into a free slot and
joins at the next step; a finished one leaves at once, its caller answered.

A slot is one sequence id of the context. It keeps its prompt's prefix (system text, everything
before the image) when its sequence ends, so the next prompt with that prefix decodes only its own
part; a prefix that another slot holds is copied (llama_memory_seq_cp), not decoded again.

With a KV stream per sequence (the default), llama.cpp computes a batch as one graph only when its
rows are consecutive sequence ids in increasing order with the same number of tokens each
(llama_batch_allocr::split_equal); any other batch it splits into one graph per run, and on a GPU,
where a step costs its kernel launches, each graph costs a whole step. So rows go in slot order,
a prompt takes the lowest free slot, and a row's forced tokens are fed as many per step as every
other row has: the rest wait for the next steps, whose graph they join instead of adding one.

On a GPU a step costs its kernel launches unless ggml-cuda replays it as a captured CUDA graph, which it
does only after two steps of the same shape (tokens, outputs, KV view). With `steady_steps` a step of
several rows keeps one shape: one token and one logit row per sequence, forced tokens one per step. A
raw 4-row step then cost 2.9 ms on the H200 against 5.5 ms for changing shapes, but the camera route lost
more to the extra steps and to the changes of shape when cameras join and leave (docs/benchmarks.md).

A sequence that runs alone, greedy, on a model with a draft (draft.py) speculates: the draft's guesses
go into the step's batch after the row's own tokens, with logits for each, and the picks that match a
guess are taken from those rows without a step of their own (speculate.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from edge_runtime.core.errors import InferenceError
from edge_runtime.inference.llm.feed import Head, Prefix, head_cells, image_segments
from edge_runtime.inference.llm.handles import Context
from edge_runtime.inference.llm.parallel_context import ParallelHost, parallel_context
from edge_runtime.inference.llm.picker import TokenPicker
from edge_runtime.inference.llm.prefill import prefill_together
from edge_runtime.inference.llm.sequence import Admit, Finished, Item, Prompt, Running
from edge_runtime.inference.llm.speculate import speculate

# Picks go to threads only for llama.cpp's GBNF sampler on a large vocabulary: its full pass costs
# 1.5-2 ms of C with the GIL released, so four run side by side (150k-token vocabularies went from
# 2.6x to 2.9x on the H200). llguidance picks are ~0.2 ms, mostly numpy under the GIL: on the H200
# threads made a 4-camera step's picking 1.19 ms instead of 0.73 ms inline (docs/benchmarks.md).
_PARALLEL_PICK_VOCAB = 16_384
_MIN_SLOTS = 4
_MIN_SLOT_CELLS = 512  # a slot's KV room at least, so a short chat can join a batch of short verdicts


class ParallelSequences:
    """Owns the second context (created on the first batch, grown, never shrunk), its slots' kept
    prefixes and the picking threads."""

    def __init__(self, lm: ParallelHost) -> None:
        self.lm = lm
        self._ctx: Context | None = None
        self._slot_cells = 0  # KV cells each slot may take in the current context
        self._holds: list[Head | None] = []  # per slot: the prefix its KV holds at 0..len
        self._pool: ThreadPoolExecutor | None = None
        self.pick_threads: bool | None = None  # None: the engine's choice (above); benchmarks force it
        self.joined = 0  # prompts that joined a batch already running
        self.prefix_copies = 0  # prefixes copied from another slot instead of decoded

    def close(self) -> None:
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
        self._holds = []
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def serve(self, prompts: Sequence[Prompt], finished: Finished, admit: Admit | None = None) -> int:
        """Generate every prompt, and those `admit` hands over while they run; `finished` hears of each
        once, as it ends. Returns the most sequences that ran at once. A prompt the grammar engine
        refuses fails alone; a failed decode fails every unfinished prompt (the KV cache is in doubt)."""
        waiting = list(prompts)
        running: list[Running] = []
        peak = 0
        try:
            self._context(max(_MIN_SLOTS, len(waiting)), max((p.cells() for p in waiting), default=1))
            while True:
                # Nothing joins while a prompt waits for room (it would starve behind the joiners; with
                # nothing running the context grows for it).
                if admit is not None and running and not waiting:
                    free = self._free_slots(running)
                    more = list(admit(free)) if free > 0 else []
                    self.joined += len(more)
                    waiting += more
                if not waiting and not running:
                    break
                waiting = self._start_fitting(waiting, running, finished)
                peak = max(peak, len(running))
                if running:
                    self._step(running, finished)
        except Exception as exc:  # noqa: BLE001 - a failed decode: every unfinished prompt hears it
            self._forget()
            for seq in running:
                seq.picker.close()
            for prompt in [seq.prompt for seq in running] + waiting:
                finished(prompt, exc)
        return peak

    # -- slots --------------------------------------------------------------------------------------
    def _free_slots(self, running: list[Running]) -> int:
        return len(self._holds) - len(running)

    def _start_fitting(self, waiting: list[Prompt], running: list[Running], finished: Finished) -> list[Prompt]:
        """Start the waiting prompts that a free slot has room for; return the others. With nothing
        running the context grows first, so a prompt larger than every slot is never stuck."""
        if not running and waiting and max(p.cells() for p in waiting) > self._slot_cells:
            self._context(max(_MIN_SLOTS, len(waiting)), max(p.cells() for p in waiting))
        left: list[Prompt] = []
        started: list[Running] = []
        for prompt in waiting:
            busy = {seq.slot for seq in running}
            free = [s for s in range(len(self._holds)) if s not in busy]
            if not free or prompt.cells() > self._slot_cells:
                left.append(prompt)
                continue
            # A slot that already holds this prefix, else one holding nothing, else any: the lowest
            # such, so running rows stay consecutive ids (one graph a step, module docstring).
            slot = next((s for s in free if self._holds[s] == prompt.prefix), None)
            if slot is None:
                slot = next((s for s in free if self._holds[s] is None), free[0])
            try:
                picker = TokenPicker(self.lm, prompt.grammar, prompt.sampling)
            except Exception as exc:  # noqa: BLE001 - a grammar the engine refuses fails this prompt alone
                finished(prompt, exc)
                continue
            seq = Running(prompt, slot, picker, 0, time.perf_counter())
            running.append(seq)  # from here a failed decode reaches it through serve's handler
            started.append(seq)
        if started:
            self._prefill_all(started)
        return left

    def _prefill_all(self, seqs: list[Running]) -> None:
        """Prefill the sequences that start together: their prefixes placed (kept, copied or decoded),
        then the rest of every prompt, images and text, in as few decodes as n_batch allows (prefill.py):
        a frame's regions prefill their images in one decode, not one after the other."""
        for seq in seqs:
            seq.reused = self._place_prefix(seq.slot, seq.prompt.prefix)
        seqs = sorted(seqs, key=lambda seq: seq.slot)  # increasing sequence ids: one graph a batch
        ends = prefill_together(self.lm.feed, self._live_ctx,
                                [(seq.slot, len(seq.prompt.prefix), [*image_segments(seq.prompt.image),
                                                                     seq.prompt.suffix]) for seq in seqs],
                                lambda i, row: self._first_pick(seqs[i], row))
        for seq, end in zip(seqs, ends, strict=True):
            seq.pos = seq.prompt_tokens = end

    def _first_pick(self, seq: Running, row: int) -> None:
        feed = self.lm.feed
        seq.pending = seq.picker.next_token(self._live_ctx, row)  # now: the next decode overwrites the logits
        seq.prefill_ms = (time.perf_counter() - seq.t0) * 1000
        seq.t_decode = time.perf_counter()
        seq.calls0, seq.llama0 = feed.decode_calls, feed.decode_s

    def _place_prefix(self, slot: int, prefix: Head) -> int:
        """Make `slot` hold `prefix` at positions 0..len: kept, copied from another slot, or decoded.
        Returns the prefix tokens not decoded."""
        ctx, holds = self._live_ctx, self._holds
        if prefix and holds[slot] == prefix:
            return len(prefix)  # trimmed to its prefix when its last sequence ended
        ctx.memory_seq_rm(slot, 0, -1)
        holds[slot] = None
        if not prefix:
            holds[slot] = []
            return 0
        source = next((s for s, held in enumerate(holds) if s != slot and held == prefix), None)
        if source is not None:
            # Across KV streams llama.cpp copies a whole stream: copy, then drop what follows the prefix.
            ctx.memory_seq_cp(source, slot)
            if ctx.memory_seq_rm(slot, len(prefix), -1):
                holds[slot] = prefix
                self.prefix_copies += 1
                return len(prefix)
            ctx.memory_seq_rm(slot, 0, -1)
        self.lm.feed.head(ctx, prefix, seq=slot)
        holds[slot] = prefix if isinstance(prefix, Prefix) else list(prefix)
        return 0

    def _end(self, seq: Running, finish: str, finished: Finished) -> None:
        """Answer the sequence's caller; its slot keeps the prefix for the next prompt."""
        seq.picker.close()
        gen = seq.generation(finish, self.lm.feed)
        if not self._live_ctx.memory_seq_rm(seq.slot, len(seq.prompt.prefix), -1):
            self._live_ctx.memory_seq_rm(seq.slot, 0, -1)  # a model whose state cannot be cut: start over
            self._holds[seq.slot] = None
        finished(seq.prompt, gen)

    # -- one step -----------------------------------------------------------------------------------
    def _step(self, running: list[Running], finished: Finished) -> None:
        """One step of every running sequence; a greedy one running alone on a model with a draft is
        timed, so the draft's guessing stops where it costs more than it saves (draft.DraftLength)."""
        drafter = self.lm.drafter
        solo = running[0] if len(running) == 1 else None
        if drafter is None or solo is None or solo.prompt.sampling.temperature > 0:
            self._step_rows(running, finished)
            return
        t0, tokens0 = time.perf_counter(), len(solo.ids)
        guessed = self._step_rows(running, finished)
        if running:  # not its last step (that one decodes nothing)
            drafter.length.timed(guessed, time.perf_counter() - t0, len(solo.ids) - tokens0)

    def _step_rows(self, running: list[Running], finished: Finished) -> bool:
        """The step; True when the draft's guesses went into it."""
        lm, feed = self.lm, self.lm.feed
        room = max(0, lm.n_batch // len(running) - 1)  # forced tokens per sequence that fit one batch
        stepping: list[Running] = []
        ended: list[tuple[Running, str]] = []
        for seq in running:
            # A row with tokens left to decode has no pick yet: it only feeds them.
            finish = seq.ended or (None if seq.todo else seq.advance(room, lm.fast_forward))
            if finish is None:
                stepping.append(seq)
            else:
                ended.append((seq, finish))
        running[:] = stepping  # before their callers hear: a failure from here on is not theirs
        for seq, finish in ended:
            self._end(seq, finish, finished)
        if not stepping:
            return False
        stepping.sort(key=lambda seq: seq.slot)
        if len(stepping) == 1 and speculate(stepping[0], room, lm.drafter, feed, self._live_ctx, lm.n_batch,
                                            lm.fast_forward):
            return True
        # Steady: one token and one logit row per sequence, every step, so the shape changes only when a
        # sequence joins or leaves (ggml-cuda replays a graph after two steps of one shape). Otherwise
        # per-sequence streams compute a batch as one graph only with as many tokens in every row.
        steady = lm.steady_steps and len(stepping) > 1
        if steady:
            take = 1
        else:
            take = min(len(seq.todo) for seq in stepping) if self._equal_rows else lm.n_batch
        batch = feed.tokens.struct
        i, rows, picking = 0, [], []
        for seq in stepping:
            seq.shared += len(stepping)
            now, seq.todo = seq.todo[:take], seq.todo[take:]
            for k, tok in enumerate(now):
                batch.token[i] = tok
                batch.pos[i] = seq.pos
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq.slot
                # the next pick reads it; a steady step asks for every row's, read or not
                batch.logits[i] = int(k == len(now) - 1 and (steady or not seq.todo))
                seq.pos += 1
                i += 1
            if not seq.todo:
                rows.append(i - 1)
                picking.append(seq)
        batch.n_tokens = i
        feed.decode(self._live_ctx, batch)
        for seq, choice in zip(picking, self._pick_all(picking, rows), strict=True):
            seq.pending = choice
        return False

    @property
    def _equal_rows(self) -> bool:
        """Whether a step's rows must have as many tokens each to run as one graph."""
        return self.lm.batch_kv_cache != "unified" and len(self._holds) > 1

    def _pick_all(self, stepping: list[Running], rows: list[int]) -> list[tuple[int, bytes]]:
        """Next token of each stepping sequence; batch row rows[i] holds the logits of stepping[i]."""
        ctx = self._live_ctx

        def pick(i: int) -> tuple[int, bytes]:
            return stepping[i].picker.next_token(ctx, rows[i])

        threads = self.pick_threads
        if threads is None:
            threads = self.lm.constraint_engine == "gbnf" and self.lm.n_vocab >= _PARALLEL_PICK_VOCAB
        if not threads or len(stepping) == 1:
            return [pick(i) for i in range(len(stepping))]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=max(2, min(8, self.lm.threads)), thread_name_prefix="sampler")
        return list(self._pool.map(pick, range(len(stepping))))

    def prompt_logits(self, items: Sequence[Item], copy_prefix: bool = True, together: bool = False
                      ) -> list[np.ndarray]:
        """The logits after each prompt, each prefilled alone into this context (copies): with
        `copy_prefix` the prefix is decoded once into sequence 0 and copied to the others, as
        `serve` does; without it every sequence decodes its own prefix. A difference from the
        one-at-a-time context here comes from the context (unified KV, shared-prefix copy, size).
        With `together` the prompts after their prefixes are prefilled together, as `serve` starts
        sequences (prefill.py)."""
        feed = self.lm.feed
        own = [head_cells(pre) + sum(len(s) for s in image_segments(im)) + len(sf) + 1 for pre, im, sf in items]
        ctx = self._context(len(items), max(own))
        self._forget()
        if copy_prefix:
            feed.head(ctx, items[0][0], seq=0)
            for seq in range(1, len(items)):
                ctx.memory_seq_cp(0, seq)
        logits: list[np.ndarray] = []
        if together:
            if not copy_prefix:
                for seq, (prefix, _, _) in enumerate(items):
                    feed.head(ctx, prefix, seq=seq)
            got: dict[int, np.ndarray] = {}
            prefill_together(feed, ctx, [(seq, len(pre), [*image_segments(im), sf])
                                         for seq, (pre, im, sf) in enumerate(items)],
                             lambda i, row: got.__setitem__(i, ctx.logits_ith(row).copy()))
            self._forget()
            return [got[i] for i in range(len(items))]
        for seq, (prefix, image, suffix) in enumerate(items):
            if not copy_prefix:
                feed.head(ctx, prefix, seq=seq)
            p = feed.segments(ctx, image_segments(image), len(prefix), want_last_logits=not suffix, seq=seq)
            feed.token_ids(ctx, suffix, p, want_last_logits=True, seq=seq)
            logits.append(ctx.logits_ith(-1).copy())
        self._forget()  # the slots hold these prompts' tails, not prefixes
        return logits

    # -- the context --------------------------------------------------------------------------------
    @property
    def _live_ctx(self) -> Context:
        if self._ctx is None:
            raise InferenceError("the parallel context is closed")
        return self._ctx

    def _forget(self) -> None:
        """Empty the context: no slot holds a prefix any more."""
        if self._ctx is not None:
            self._ctx.memory_clear()
        self._holds = [None] * len(self._holds)

    def _context(self, sequences: int, cells: int) -> Context:
        """A context over the model's weights with `sequences` slots of at least `cells` KV cells each."""
        lm = self.lm
        per_slot = -(-max(cells, min(_MIN_SLOT_CELLS, lm.n_ctx)) // 256) * 256
        if self._ctx is not None and self._ctx.n_seq_max >= sequences and self._slot_cells >= cells:
            return self._ctx
        if self._ctx is not None:
            sequences = max(sequences, self._ctx.n_seq_max)
            per_slot = max(per_slot, self._slot_cells)
            self._ctx.close()
            self._ctx = None
            self._holds = []
        # Per sequence, each slot has its own KV stream of n_ctx / n_seq_max cells; unified, they share
        # one buffer that is sized as if they did not share their prefixes.
        n_ctx = max(lm.n_ctx, per_slot * sequences)
        self._ctx = parallel_context(lm, sequences, n_ctx)
        self._slot_cells = n_ctx // sequences
        self._holds = [None] * sequences
        return self._ctx
