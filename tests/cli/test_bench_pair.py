"""`edge-runtime bench` on a GGUF + mmproj bundle: every stage measured, ratios against libmtmd's
helper path + llama.cpp's sampler chain, the report rendered."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from edge_runtime.cli.bench import render, run_bench
from tests.inference.test_mtmd_paths import make_inspector
from tests.support.tiny_pairs import TinyPair


def test_bench_of_a_pair_bundle_measures_every_stage_against_the_raw_engine(
        tiny_pairs: Callable[[str], TinyPair], tmp_path: Path) -> None:
    with make_inspector(tiny_pairs("smolvlm"), tmp_path / "smolvlm") as ins:
        report = run_bench(ins, frames=2, progress=False)
    assert set(report.stages_ms) == {"decode_image", "preprocess", "encode", "prefill", "generate", "total"}
    assert all(v["p50"] > 0 for k, v in report.stages_ms.items() if k != "preprocess")
    assert all(v > 0 for v in report.ratios.values())
    assert report.raw["gen_tok_s"] > 0 and report.prefix_cache["fixed_prompt_tokens"] > 100
    assert report.throughput["cameras"] == 2 and report.throughput["parallel_same_verdicts"] == 2
    text = render(report)
    assert "mmproj idefics3" in text and "ratios (ours/raw throughput)" in text
