"""The llguidance constraint engine (issue 16): exact greedy equivalence with the GBNF path,
strict-JSON schema-valid verdicts, forced tokens in one batch."""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import pytest

from edge_runtime.config import Config
from edge_runtime.core.bundle.manifest import Bundle
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.feed import Feed
from tests.support.images import synthetic_frames


@pytest.fixture(scope="module")
def exact_inspector(demo_bundle: Bundle, config: Config) -> Iterator[Inspector]:
    """llguidance, one token per step (fast_forward off): the mode that must match GBNF token for token."""
    settings = config.model.model_copy(update={"fast_forward": False, "warmup": False})
    ins = Inspector(demo_bundle, settings, config.device_id)
    yield ins
    ins.close()


def generations(ins: Inspector, n: int, seed: int) -> list[tuple[str, list[int]]]:
    prefix, suffix = ins.prompt_parts(ins.default_prompt)
    out = []
    for frame in synthetic_frames(n, seed=seed):
        gen = ins.generate(prefix, ins.encode(frame).embeds, suffix, ins.grammar, 200)
        out.append((gen.text, gen.token_ids))
    return out


def test_llguidance_picks_exactly_the_gbnf_tokens_under_greedy(exact_inspector: Inspector,
                                                               gbnf_inspector: Inspector) -> None:
    assert exact_inspector.language.constraint_engine == "llguidance"
    assert gbnf_inspector.language.constraint_engine == "gbnf"
    ours = generations(exact_inspector, 12, seed=33)
    theirs = generations(gbnf_inspector, 12, seed=33)
    assert ours == theirs


def test_llguidance_matches_gbnf_on_an_openai_json_object(exact_inspector: Inspector,
                                                          gbnf_inspector: Inspector) -> None:
    from edge_runtime.inference.llm.grammar import schema_to_grammar

    grammar = schema_to_grammar({"type": "object"})

    def run(ins: Inspector) -> list[int]:
        prefix, image, suffix = ins.sequence("Describe the part as JSON.", None)
        return ins.generate(prefix, image, suffix, grammar, 60).token_ids

    assert run(exact_inspector) == run(gbnf_inspector)


def test_every_llguidance_verdict_is_strict_json_and_schema_valid(inspector: Inspector) -> None:
    assert inspector.language.fast_forward  # the default: forced tokens in one batch
    schema = inspector.bundle.manifest.verdict_schema
    for text, _ in generations(inspector, 30, seed=7):
        verdict = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict constant {c}"))
        jsonschema.validate(verdict, schema)


def test_parallel_llguidance_verdicts_are_schema_valid(inspector: Inspector) -> None:
    prefix, suffix = inspector.prompt_parts(inspector.default_prompt)
    items = [(prefix, inspector.encode(f).embeds, suffix) for f in synthetic_frames(4, seed=12)]
    for gen in inspector.language.generate_batch(items, inspector.grammar, 200):
        jsonschema.validate(json.loads(gen.text), inspector.bundle.manifest.verdict_schema)


def test_forced_tokens_are_decoded_in_one_batch(inspector: Inspector, monkeypatch: pytest.MonkeyPatch) -> None:
    decodes: list[int] = []
    real = Feed.decode

    def counting(self: Feed, ctx, batch) -> None:
        decodes.append(batch.n_tokens)
        real(self, ctx, batch)

    prefix, suffix = inspector.prompt_parts(inspector.default_prompt)
    embeds = inspector.encode(synthetic_frames(1, seed=3)[0]).embeds
    inspector.generate(prefix, embeds, suffix, inspector.grammar, 200)  # fills the prefix cache
    monkeypatch.setattr(Feed, "decode", counting)
    gen = inspector.generate(prefix, embeds, suffix, inspector.grammar, 200)
    # One token a decode would need a decode per token plus the prefill's; the keys the grammar
    # forces (`"category":`, `"confidence":`, ...) come several tokens a decode.
    assert len(decodes) < gen.tokens - 5, (len(decodes), gen.tokens)


@pytest.mark.parametrize("fast_forward", [False, True])
def test_parallel_sequences_give_exactly_the_one_at_a_time_verdicts(demo_bundle: Bundle, config: Config,
                                                                    fast_forward: bool) -> None:
    settings = config.model.model_copy(update={"fast_forward": fast_forward, "warmup": False})
    ins = Inspector(demo_bundle, settings, config.device_id)
    try:
        prefix, suffix = ins.prompt_parts(ins.default_prompt)
        items = [(prefix, ins.encode(f).embeds, suffix) for f in synthetic_frames(4, seed=21)]
        one_at_a_time = [ins.generate(*item, ins.grammar, 200).token_ids for item in items]
        parallel = [g.token_ids for g in ins.language.generate_batch(items, ins.grammar, 200)]
    finally:
        ins.close()
    assert parallel == one_at_a_time
