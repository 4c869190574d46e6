"""Prompt sizes are checked before tokenizing; the tokenization cache is bounded by bytes (issue 14 item 8)."""

from __future__ import annotations

import pytest

from edge_runtime.config import Config
from edge_runtime.core.bundle.manifest import Bundle
from edge_runtime.core.errors import InputError
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.token_cache import TokenCache


def test_ten_megabyte_prompt_is_refused_before_it_is_tokenized(inspector: Inspector,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def no_tokenizing(text: str) -> list[int]:
        raise AssertionError(f"tokenized a {len(text)}-character prompt")

    monkeypatch.setattr(inspector.language, "tokenize", no_tokenizing)
    with pytest.raises(InputError) as err:
        inspector.sequence("x" * 10_000_000, None)
    assert err.value.field == "messages" and "context" in str(err.value)


def test_prompt_longer_than_the_context_names_messages(inspector: Inspector) -> None:
    # Under the byte bound, but more tokens than the context holds.
    prompt = " ".join(f"w{i}" for i in range(inspector.language.n_ctx))
    prefix, image, suffix = inspector.sequence(prompt, None)
    with pytest.raises(InputError) as err:
        inspector.generate(prefix, image, suffix, None, 4)
    assert err.value.field == "messages"


def test_max_tokens_beyond_the_context_names_max_tokens(inspector: Inspector) -> None:
    prefix, image, suffix = inspector.sequence("hello", None)
    with pytest.raises(InputError) as err:
        inspector.generate(prefix, image, suffix, None, 8192)
    assert err.value.field == "max_tokens" and "at most" in str(err.value)


def test_tokenization_cache_holds_its_byte_budget_not_64_entries(demo_bundle: Bundle, config: Config) -> None:
    budget = 300_000
    settings = config.model.model_copy(update={"token_cache_bytes": budget, "warmup": False})
    ins = Inspector(demo_bundle, settings, config.device_id)
    try:
        limit = ins.max_prompt_bytes
        n = 3 * budget // limit + 8  # fewer than 64 distinct prompts near the byte bound, over the budget
        for i in range(n):
            ins.sequence(f"{i} " + "ab " * (limit // 4), None)
        cache = ins.prompts.token_cache
        assert n < 64 and 0 < cache.size <= budget
        assert cache.size == sum(TokenCache.cost(t, ids) for t, ids in cache._items.items())
    finally:
        ins.close()


def test_token_cache_evicts_least_recently_used_and_skips_giants() -> None:
    cache = TokenCache(budget=10_000)
    cache.put("a" * 100, [1] * 10)
    cache.put("b" * 100, [2] * 10)
    assert cache.get("a" * 100) == [1] * 10  # a is now the most recent
    for i in range(30):
        cache.put(f"{i}" * 100, [3] * 10)
    assert cache.size <= 10_000 and cache.get("b" * 100) is None
    cache.put("g" * 3000, [4])  # over a quarter of the budget: not kept
    assert cache.get("g" * 3000) is None
