"""One sequence of the parallel context: the prompt it generates (`Prompt`) and its state while it runs.

A `Prompt` brings its own grammar, sampling, length, stop strings and stream; `Running` is that prompt
in its slot (parallel.py): the tokens it emitted, the ones the grammar forced that wait for a step, and
its timings for the `Generation` it ends with.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from edge_runtime.inference.llm.feed import Feed, Generation, Head, ImagePart, head_cells, image_segments
from edge_runtime.inference.llm.picker import GREEDY, Sampling, TokenPicker

Item = tuple[Head, ImagePart, list[int]]


@dataclass
class Prompt:
    """One sequence to generate and how: its grammar, sampling, length, stop strings and stream."""

    prefix: Head
    image: ImagePart
    suffix: list[int]
    grammar: str | None
    max_tokens: int
    sampling: Sampling = GREEDY
    stops: Sequence[str] = ()
    on_text: Callable[[str], None] | None = None  # each complete piece of text, as it is generated
    tag: Any = None  # the caller's own handle on this prompt (what `Finished` hands back)

    def cells(self) -> int:
        """KV cells the whole sequence may take: prompt plus answer."""
        return (head_cells(self.prefix) + sum(len(s) for s in image_segments(self.image)) + len(self.suffix)
                + self.max_tokens)


# Called once for every prompt served (first or joined): its Generation, or why it failed.
Finished = Callable[[Prompt, Generation | Exception], None]
# Up to n more prompts that are ready now (never blocks); [] when there are none or none may join.
Admit = Callable[[int], Sequence[Prompt]]


class Running:
    """One sequence in its slot: what it emitted so far and the token chosen for it next."""

    def __init__(self, prompt: Prompt, slot: int, picker: TokenPicker, reused: int, t0: float) -> None:
        self.prompt, self.slot, self.picker, self.reused, self.t0 = prompt, slot, picker, reused, t0
        self.pos = self.prompt_tokens = 0  # the next position; the prompt's positions
        self.pending: tuple[int, bytes] = (-1, b"")
        self.out: list[bytes] = []
        self.ids: list[int] = []
        self.todo: list[int] = []  # emitted tokens not decoded yet; the next pick waits for the last
        self.prefill_ms = 0.0
        self.t_decode = 0.0
        self.calls0 = 0
        self.llama0 = 0.0
        self.shared = 0  # sequences decoded with this one, summed over its steps (its share of the work)
        self.ended: str | None = None  # the finish reason, when it came with a draft's guess (speculate.py)
        self.forced = self.drafted = self.draft_accepted = 0

    def advance(self, room: int, fast_forward: bool) -> str | None:
        """Take the chosen token (and the forced ones after it); the finish reason once it is done."""
        token, piece = self.pending
        if token < 0:
            return "stop"
        p, picker = self.prompt, self.picker
        step = [(token, piece)]
        if fast_forward:
            step += picker.forced(min(room, p.max_tokens - len(self.ids) - 1))
            self.forced += len(step) - 1
        self.out.extend(b for _, b in step)
        self.todo = [t for t, _ in step]
        self.ids.extend(self.todo)
        if p.stops and any(s in picker.emitted.decode("utf-8", "ignore") for s in p.stops):
            return "stop"
        if p.on_text is not None:
            delta = picker.text_so_far_delta()
            if delta:
                p.on_text(delta)
        return "length" if len(self.ids) >= p.max_tokens else None

    def generation(self, finish: str, feed: Feed) -> Generation:
        text = b"".join(self.out).decode("utf-8", errors="replace")
        for s in self.prompt.stops:
            text = text.split(s, 1)[0]  # OpenAI semantics: the stop string is not returned
        steps = max(1, feed.decode_calls - self.calls0)
        return Generation(text, len(self.out), self.prompt_tokens, self.prefill_ms,
                          (time.perf_counter() - self.t_decode) * 1000, finish, self.reused, self.ids,
                          feed.decode_calls - self.calls0, (feed.decode_s - self.llama0) * 1000,
                          batched=max(1.0, self.shared / steps), forced=self.forced, drafted=self.drafted,
                          draft_accepted=self.draft_accepted)
