"""Steady steps (`model.steady_steps`): a batched step of several sequences keeps one shape, one token and one
logit row per sequence, so llama.cpp's CUDA backend can replay it as a captured graph. The shape changes
only when a sequence joins or leaves; the tokens the grammar forces go in one per step, and every
answer is the one the packed steps give.

Real llama.cpp on the demo bundle (CPU: the shapes are the same on a GPU; what they cost there, and why the
setting is off by default, is in docs/benchmarks.md, "Steady steps")."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from edge_runtime.config import Config
from edge_runtime.core.bundle.manifest import Bundle
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.feed import Generation
from edge_runtime.inference.llm.sequence import Prompt
from tests.support.images import synthetic_frames

FRAMES = synthetic_frames(4, seed=41)
Served = dict[bool, tuple[list[Generation], list[dict[str, Any]]]]  # steady or not: answers, decodes


def _serve(bundle: Bundle, config: Config, steady: bool) -> tuple[list[Generation], list[dict[str, Any]]]:
    """Four verdicts served together, and every decode's rows (sequence ids) and logit flags."""
    settings = config.model.model_copy(update={"warmup": False, "steady_steps": steady})
    with Inspector(bundle, settings, config.device_id) as ins:
        prompts = [Prompt(*ins.sequence(ins.default_prompt, ins.encode(f)), ins.grammar, ins.max_tokens, tag=i)
                   for i, f in enumerate(FRAMES)]
        feed, steps, parallel = ins.language.feed, [], ins.language.parallel
        decode, prefill_all = feed.decode, parallel._prefill_all
        prefilling = [False]

        def recorded(ctx: Any, batch: Any) -> None:
            n = batch.n_tokens
            steps.append({"rows": [batch.seq_id[i][0] for i in range(n)], "prefill": prefilling[0],
                          "logits": [batch.logits[i] for i in range(n)], "tokens": bool(batch.token)})
            decode(ctx, batch)

        def marked(seqs: Any) -> None:  # the starting sequences' prefill decodes several sequences too
            prefilling[0] = True
            try:
                prefill_all(seqs)
            finally:
                prefilling[0] = False

        feed.decode = recorded  # type: ignore[method-assign]
        parallel._prefill_all = marked  # type: ignore[method-assign]
        done: dict[int, Generation | Exception] = {}
        ins.language.serve(prompts, lambda p, g: done.__setitem__(p.tag, g), None)
    gens = [done[i] for i in range(len(FRAMES))]
    assert all(isinstance(g, Generation) for g in gens), gens
    return [g for g in gens if isinstance(g, Generation)], steps


@pytest.fixture(scope="module")
def served(demo_bundle: Bundle, config: Config) -> Served:
    return {steady: _serve(demo_bundle, config, steady) for steady in (False, True)}


def _batched(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The generation steps of more than one sequence (not the prefill)."""
    return [s for s in steps if s["tokens"] and not s["prefill"] and len(set(s["rows"])) > 1]


def test_a_steady_step_has_one_token_and_one_logit_row_per_sequence(served: Served) -> None:
    batched = _batched(served[True][1])
    assert len(batched) > 10
    for s in batched:
        assert len(s["rows"]) == len(set(s["rows"])), s  # one token per sequence
        assert s["rows"] == sorted(s["rows"])  # slot order: one llama.cpp graph
        assert all(s["logits"]), s  # a logit row each, read or not: the outputs' count holds too


def test_steady_steps_change_shape_only_when_a_sequence_joins_or_leaves(served: Served) -> None:
    def shape_changes(steps: list[dict[str, Any]]) -> int:
        batched = _batched(steps)
        shapes = [(len(s["rows"]), sum(s["logits"])) for s in batched]
        return sum(a != b for a, b in itertools.pairwise(shapes))

    packed, steady = shape_changes(served[False][1]), shape_changes(served[True][1])
    # Four sequences leave one by one: at most three changes of the row count among the batched steps.
    assert steady <= 3
    assert packed > steady  # the packed steps' forced tokens and skipped logits changed the shape more often


def test_steady_steps_give_the_answers_the_packed_steps_give(served: Served) -> None:
    packed, steady = served[False][0], served[True][0]
    assert [g.token_ids for g in steady] == [g.token_ids for g in packed]
    assert [g.text for g in steady] == [g.text for g in packed]
    assert [g.forced for g in steady] == [g.forced for g in packed]
    # The forced tokens no longer ride in their pick's step: more steps, as many tokens.
    assert _batched(served[True][1]) and len(_batched(served[True][1])) > len(_batched(served[False][1]))
