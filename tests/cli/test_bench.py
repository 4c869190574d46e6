"""`edge-runtime bench` runs the real pipeline and the raw engines on the demo bundle."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from edge_runtime.cli.bench import _raw_llama
from edge_runtime.core.cpuinfo import read_cpuinfo
from edge_runtime.inference.inspector import Inspector
from tests.support.images import synthetic_frames


def test_bench_reports_stages_ratios_and_a_plot(tmp_path: Path, demo_dir: Path) -> None:
    plot = tmp_path / "stages.png"
    proc = subprocess.run([sys.executable, "-m", "edge_runtime", "--log-level", "warning", "bench", "--model",
                           str(demo_dir), "--frames", "4", "--json", "--plot", str(plot)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "EDGE_RUNTIME_DATA": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert set(report["stages_ms"]) == {"decode_image", "preprocess", "encode", "prefill", "generate", "total"}
    assert all(v["p95"] >= v["p50"] > 0 for v in report["stages_ms"].values())
    assert report["raw"]["gen_tok_s"] > 0 and report["tokens"]["gen_tok_s"] > 0
    ratios, ours = report["ratios"], report["tokens"]["gen_tok_s"]
    # The ratios are what they claim: ours over the raw engines measured in the same run.
    assert abs(ratios["generation_throughput_ours_vs_raw"] - ours / report["raw"]["gen_tok_s"]) < 0.002
    assert abs(ratios["generation_ours_vs_raw_unconstrained"] - ours / report["raw"]["gen_tok_s_unconstrained"]) < 0.002
    assert abs(ratios["encode_throughput_ours_vs_raw"]
               - report["raw"]["encode_ms_p50"] / report["stages_ms"]["encode"]["p50"]) < 0.002
    assert report["raw"]["gen_tok_s_unconstrained"] > 0 and report["tokens"]["engine"] == "llguidance"
    assert report["prefix_cache"]["fixed_prompt_tokens"] > 200
    assert report["throughput"]["sequential_per_s"] > 0 and report["peak_rss_mb"] > 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The CPU by name (cpuinfo, x86 and ARM alike), not just the architecture platform.processor() gave.
    cpu = read_cpuinfo()
    assert report["machine"]["cpu"] == (cpu.describe() if cpu else platform.machine())
    assert report["machine"]["arch"] == platform.machine()


def test_raw_engine_run_leaves_the_inspector_answering_as_before(inspector: Inspector) -> None:
    # bench's raw llama.cpp run shares the inspector's context: afterwards the prefix cache must not
    # claim KV cells the raw run cleared (the next verdict would be read without its prompt).
    prefix, suffix = inspector.prompt_parts(inspector.default_prompt)
    embeds = inspector.encode(synthetic_frames(1, seed=61)[0]).embeds
    before = inspector.generate(prefix, embeds, suffix, inspector.grammar, inspector.max_tokens)
    _raw_llama(inspector.language, prefix, embeds, suffix, inspector.grammar, inspector.max_tokens)
    after = inspector.generate(prefix, embeds, suffix, inspector.grammar, inspector.max_tokens)
    assert after.token_ids == before.token_ids
    assert after.prefix_reused == 0  # the prefix was read again, not trusted from a cleared cache
