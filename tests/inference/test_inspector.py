"""The real pipeline on the demo bundle: ONNX Runtime encoder + llama.cpp decoder."""

from __future__ import annotations

import json
import time

import jsonschema
import numpy as np
import pytest

from edge_runtime.config import Config
from edge_runtime.core.bundle.manifest import Bundle
from edge_runtime.core.result import STAGES
from edge_runtime.inference.inspector import Inspector
from tests.support.images import synthetic_frames


def test_every_verdict_is_strict_json_valid_against_the_schema(inspector: Inspector,
                                                               demo_bundle: Bundle) -> None:
    frames = synthetic_frames(60)
    for i, frame in enumerate(frames):
        result = inspector.inspect(frame, camera="t", seq=i)
        parsed = json.loads(result.text, strict=True)
        jsonschema.validate(parsed, demo_bundle.manifest.verdict_schema)
        assert parsed == result.verdict
        assert result.frame.width == frame.shape[1] and result.frame.height == frame.shape[0]


def test_result_has_the_design_fields_and_stage_timings(inspector: Inspector) -> None:
    t0 = time.perf_counter()
    result = inspector.inspect(synthetic_frames(1)[0], camera="cam1", seq=7).to_dict()
    wall_ms = (time.perf_counter() - t0) * 1000
    assert {"id", "device", "camera", "ts", "frame", "verdict", "text", "model", "timings_ms",
            "governor"} <= result.keys()
    assert result["device"] == "test-device" and result["camera"] == "cam1"
    assert result["frame"]["seq"] == 7 and result["ts"].endswith("Z")
    assert set(result["timings_ms"]) == set(STAGES)
    t = result["timings_ms"]
    # Measured from outside: every stage took time, and the total accounts for the wall time in ms
    # (a clock in seconds, or a stage left out of the total, fails one of these).
    assert all(t[stage] > 0 for stage in ("preprocess", "encode", "prefill", "decode")), t
    assert 0.5 * wall_ms <= t["total"] <= wall_ms + 0.5, (t, wall_ms)


def test_same_image_gives_the_same_verdict(inspector: Inspector) -> None:
    frame = synthetic_frames(3, seed=5)[2]
    first, second = inspector.inspect(frame), inspector.inspect(frame)
    assert first.text == second.text and first.id != second.id


def test_different_images_give_different_embeddings(inspector: Inspector) -> None:
    a, b = synthetic_frames(2, seed=9)
    ea, eb = inspector.encode(a).embeds, inspector.encode(b).embeds
    assert ea.shape == eb.shape == (49, 128)
    assert not np.allclose(ea, eb, atol=1e-3)


def test_prefix_cache_reuse_gives_the_same_verdicts(demo_bundle: Bundle, config: Config,
                                                    inspector: Inspector) -> None:
    settings = config.model.model_copy(update={"reuse_prefix_cache": False, "warmup": False})
    fresh = Inspector(demo_bundle, settings, config.device_id)
    try:
        for frame in synthetic_frames(6, seed=11):
            assert inspector.inspect(frame).text == fresh.inspect(frame).text
    finally:
        fresh.close()
    prefix, _ = inspector.prompt_parts(inspector.default_prompt)
    gen = inspector.generate(prefix, inspector.encode(synthetic_frames(1)[0]).embeds, [],
                             inspector.grammar, 200)
    assert gen.prefix_reused == len(prefix)


def test_a_custom_prompt_is_recorded(inspector: Inspector) -> None:
    result = inspector.inspect(synthetic_frames(1)[0], prompt="Is the weld seam continuous?")
    assert result.prompt == "Is the weld seam continuous?"


def test_parallel_sequences_give_schema_valid_verdicts(inspector: Inspector, demo_bundle: Bundle) -> None:
    prefix, suffix = inspector.prompt_parts(inspector.default_prompt)
    embeds = [inspector.encode(f).embeds for f in synthetic_frames(4, seed=21)]
    gens = inspector.language.generate_batch([(prefix, e, suffix) for e in embeds], inspector.grammar, 200)
    assert len(gens) == 4
    for gen in gens:
        jsonschema.validate(json.loads(gen.text, strict=True), demo_bundle.manifest.verdict_schema)
    # A batch of one is the single-sequence path itself.
    one = inspector.language.generate_batch([(prefix, embeds[0], suffix)], inspector.grammar, 200)[0]
    assert one.text == inspector.generate(prefix, embeds[0], suffix, inspector.grammar, 200).text


def test_grammar_shortlist_gives_exactly_the_full_pass_tokens(gbnf_inspector: Inspector,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from edge_runtime.inference.llm import picker

    inspector = gbnf_inspector
    prefix, suffix = inspector.prompt_parts(inspector.default_prompt)
    frames = synthetic_frames(12, seed=33)
    fast = [inspector.generate(prefix, inspector.encode(f).embeds, suffix, inspector.grammar, 200).text
            for f in frames]
    monkeypatch.setattr(picker, "_SHORTLIST", 0)  # every token through the full-vocabulary grammar pass
    full = [inspector.generate(prefix, inspector.encode(f).embeds, suffix, inspector.grammar, 200).text
            for f in frames]
    assert fast == full


def test_parallel_sequences_pick_the_same_tokens_in_threads_as_in_turn(inspector: Inspector,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from edge_runtime.inference.llm import parallel

    prefix, suffix = inspector.prompt_parts(inspector.default_prompt)
    items = [(prefix, inspector.encode(f).embeds, suffix) for f in synthetic_frames(4, seed=45)]
    monkeypatch.setattr(parallel, "_PARALLEL_PICK_VOCAB", 10**9)
    in_turn = [g.text for g in inspector.language.generate_batch(items, inspector.grammar, 200)]
    monkeypatch.setattr(parallel, "_PARALLEL_PICK_VOCAB", 0)  # the demo vocabulary is small: force threads
    threaded = [g.text for g in inspector.language.generate_batch(items, inspector.grammar, 200)]
    assert threaded == in_turn


def test_parallel_sequences_get_kv_room_beyond_one_context(demo_bundle: Bundle, config: Config) -> None:
    # Four prompts of ~170 tokens plus 200 tokens of answer each need more KV cells than a 512-token
    # context holds: the batch context grows to fit instead of failing mid-generation.
    settings = config.model.model_copy(update={"context_size": 512, "warmup": False})
    small = Inspector(demo_bundle, settings, "test")
    try:
        items = [small.sequence(small.default_prompt, small.encode(f)) for f in synthetic_frames(4, seed=51)]
        gens = small.language.generate_batch(items, small.grammar, 200)
        for gen in gens:
            jsonschema.validate(json.loads(gen.text, strict=True), demo_bundle.manifest.verdict_schema)
    finally:
        small.close()
