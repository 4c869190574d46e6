"""`bench` reports tokens per verdict and the share of them the schema's grammar forced (issue 25)."""

from __future__ import annotations

from edge_runtime.cli.bench_pair import forced_tokens
from edge_runtime.inference.inspector import Inspector
from tests.support.images import synthetic_frames


def test_forced_tokens_are_the_ones_fast_forward_decoded_without_the_model_choosing(inspector: Inspector) -> None:
    prefix, suffix = inspector.prompt_parts(inspector.default_prompt)
    embeds = inspector.encode(synthetic_frames(1, seed=61)[0]).embeds
    lm = inspector.language
    saved = lm.fast_forward
    try:
        lm.fast_forward = False  # one token per step: the model (under the mask) chose every one
        plain = inspector.generate(prefix, embeds, suffix, inspector.grammar, inspector.max_tokens)
        lm.fast_forward = True  # the keys, quotes and braces the schema fixes come in the steps' batches
        fast = inspector.generate(prefix, embeds, suffix, inspector.grammar, inspector.max_tokens)
    finally:
        lm.fast_forward = saved
    assert forced_tokens(plain) == 0
    assert 0 < forced_tokens(fast) < fast.tokens
    # what the model chose plus what the grammar forced is the whole verdict, and the steps saved
    # by fast-forward are exactly the forced tokens
    assert plain.steps - fast.steps == forced_tokens(fast) + (plain.tokens - fast.tokens)
