"""Chats and camera verdicts in one batched decode (issue 28): each sequence has its own prefix,
grammar, sampling, length, stop strings and stream; sequences join a running batch and leave it when
done; and a greedy sequence gives exactly the tokens it gives alone. Real llama.cpp on the demo bundle."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from edge_runtime.config import Config
from edge_runtime.core.bundle.manifest import Bundle
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.feed import Generation, head_tokens
from edge_runtime.inference.llm.grammar import schema_to_grammar
from edge_runtime.inference.llm.picker import Sampling
from edge_runtime.inference.llm.sequence import Prompt
from tests.support.images import synthetic_frames

CHAT_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["defect", "notes"],
    "properties": {"defect": {"type": "boolean"}, "notes": {"type": "string", "maxLength": 30}},
}


@pytest.fixture(scope="module")
def ins(demo_bundle: Bundle, config: Config) -> Iterator[Inspector]:
    settings = config.model.model_copy(update={"warmup": False})
    inspector = Inspector(demo_bundle, settings, config.device_id)
    yield inspector
    inspector.close()


def _alone(ins: Inspector, p: Prompt) -> Generation:
    return ins.generate(p.prefix, p.image, p.suffix, p.grammar, p.max_tokens, p.sampling, None, list(p.stops))


def _serve(ins: Inspector, prompts: list[Prompt], joiners: Sequence[Prompt] = ()) -> tuple[list[Generation], int]:
    """Serve `prompts`; `joiners` are handed over one a step once the batch runs."""
    out: dict[int, Generation] = {}
    pending = list(joiners)

    def finished(prompt: Prompt, outcome: Generation | Exception) -> None:
        assert isinstance(outcome, Generation), outcome
        out[prompt.tag] = outcome

    def admit(n: int) -> list[Prompt]:
        return [pending.pop(0)] if pending and n > 0 else []

    peak = ins.language.serve(prompts, finished, admit)
    return [out[i] for i in sorted(out)], peak


def _prompts(ins: Inspector) -> list[Prompt]:
    """A camera verdict, a greedy chat under its own schema (another prefix: no image, its own system
    text), a sampled free-text chat and a second camera verdict."""
    frames = synthetic_frames(2, seed=41)
    chat_grammar = schema_to_grammar(CHAT_SCHEMA)
    verdict = [ins.sequence(ins.default_prompt, ins.encode(f)) for f in frames]
    chat = ins.sequence("Is the weld cracked? Answer as JSON.", None, "You check welds.")
    free = ins.sequence("Describe the part.", None, "You are terse.")
    return [
        Prompt(*verdict[0], ins.grammar, ins.max_tokens, tag=0),
        Prompt(*chat, chat_grammar, 40, tag=1),
        Prompt(*free, None, 24, Sampling(0.8, 0.9, seed=7), tag=2),
        Prompt(*verdict[1], ins.grammar, ins.max_tokens, tag=3),
    ]


def test_greedy_and_sampled_sequences_give_their_alone_tokens_in_a_mixed_batch(ins: Inspector) -> None:
    prompts = _prompts(ins)
    alone = [_alone(ins, p).token_ids for p in prompts]
    batched, peak = _serve(ins, prompts)
    assert peak == 4
    assert [g.token_ids for g in batched] == alone
    assert len({tuple(head_tokens(p.prefix)) for p in prompts}) == 3  # three different prefixes shared one batch


def test_a_prompt_that_arrives_meanwhile_joins_the_running_batch_with_its_alone_tokens(ins: Inspector) -> None:
    first, *rest = _prompts(ins)
    joined0 = ins.language.parallel.joined
    batched, peak = _serve(ins, [first], rest)
    assert ins.language.parallel.joined - joined0 == 3
    assert peak >= 2  # the joiners ran beside the first, not after it
    assert [g.token_ids for g in batched] == [_alone(ins, p).token_ids for p in [first, *rest]]


def test_each_sequence_keeps_its_own_length_stop_strings_and_stream(ins: Inspector) -> None:
    streamed: list[str] = []
    prefix, image, suffix = ins.sequence("Describe the part.", None, "You are terse.")
    long = Prompt(prefix, image, suffix, None, 30, tag=0)
    short = Prompt(prefix, image, suffix, None, 3, tag=1)
    reference = _alone(ins, long)
    text = reference.text
    stop = text[len(text) // 2: len(text) // 2 + 2]
    assert stop.strip()
    stopped = Prompt(prefix, image, suffix, None, 30, stops=(stop,), tag=2)
    streaming = Prompt(prefix, image, suffix, None, 30, on_text=streamed.append, tag=3)
    gens, _ = _serve(ins, [long, short, stopped, streaming])
    assert gens[0].text == text and gens[0].finish_reason == reference.finish_reason
    assert gens[1].tokens == 3 and gens[1].finish_reason == "length"
    assert gens[2].finish_reason == "stop" and gens[2].text == text.split(stop, 1)[0]
    assert "".join(streamed) == gens[3].text == text


def test_a_slot_keeps_its_prefix_for_the_next_batch_and_shares_it_by_copy(ins: Inspector) -> None:
    prompts = _prompts(ins)
    _serve(ins, prompts)
    again, _ = _serve(ins, prompts)
    assert [g.prefix_reused for g in again] == [len(p.prefix) for p in prompts]
    copies0 = ins.language.parallel.prefix_copies
    chat = prompts[1]
    twins = [Prompt(chat.prefix, chat.image, chat.suffix, chat.grammar, chat.max_tokens, tag=i) for i in range(3)]
    gens, _ = _serve(ins, twins)
    assert ins.language.parallel.prefix_copies - copies0 >= 1  # not every slot decoded the prefix itself
    assert all(g.token_ids == _alone(ins, chat).token_ids for g in gens)


def test_a_prompt_whose_grammar_is_refused_fails_alone(ins: Inspector) -> None:
    prompts = _prompts(ins)
    prompts[1].grammar = "root ::= [broken"
    outcomes: dict[int, Generation | Exception] = {}
    ins.language.serve(prompts, lambda p, o: outcomes.__setitem__(p.tag, o))
    assert isinstance(outcomes[1], Exception)
    assert all(isinstance(outcomes[i], Generation) for i in (0, 2, 3))
