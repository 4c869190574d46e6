"""Every script in benchmarks/ still runs: a smoke run of each on the demo bundle with the smallest
arguments, so a refactor cannot silently break one (parallel_agreement.py once crashed on a private
attribute that had moved). The figures are not checked here; docs/benchmarks.md holds real runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import tiny_pairs
from tests.support.broker import Broker

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"

# script -> (arguments with {bundle}/{port}/{trace} filled in, a string its output must contain);
# {relative_bundle}: the bundle from the working directory, for scripts that write it into a config file
# elsewhere (whose relative paths are read from the file's folder)
# "script.py#mode": a second smoke run of one script, in another of its modes
SMOKE: dict[str, tuple[list[str], str]] = {
    "api_load.py": (["--seconds", "1", "--clients", "1", "--infer", "2"], "status_requests_per_s"),
    "chat_speed.py": (["--model", "{relative_bundle}", "--requests", "1", "--clients", "2", "--per-client", "1"],
                      '"concurrent_over_one"'),
    "daemon_rates.py": (["--seconds", "2"], "per_camera_per_s"),
    "encode_overlap.py": (["{pair}", "--gpu-layers", "0", "--threads", "2", "--lanes", "2", "--rounds", "1",
                           "--warmup", "0"], '"lanes_span_over_one_crop"'),
    "evidence_cost.py": (["--frames", "2", "--inspections", "2"], "difference_ms"),
    "gate.py": (["--model", "{bundle}", "--frames", "2", "--sizes", "100,500", "--train", "3"], '"share_of_encode"'),
    "gate_search.py": (["--banks", "100", "--threads", "1", "--repeats", "2", "--width", "64"], '"max_abs_diff"'),
    "gate_stream.py": (["--model", "{bundle}", "--frames", "20", "--train", "4", "--holdout", "2", "--chunk", "10",
                        "--warmup", "1"], '"speedup"'),
    "governor_run.py": (["--model", "{bundle}", "--gpu-layers", "0", "--seconds", "2", "--replay", "{trace}"],
                        '"governed"'),
    "health_under_load.py": (["--seconds", "2", "--clients", "2", "--model", "{bundle}"], '"crowd_answers_per_s"'),
    "inspection_queries.py": (["--results", "2000"], "export all defects"),
    "json_spelling.py": (["--model", "{bundle}", "--frames", "2", "--threads", "2"], '"steps_ratio"'),
    "line_io.py": (["--jobs", "2"], "trigger_to_result_valid_ms"),
    "line_soak.py": (["--minutes", "0.1", "--sample-s", "2", "--warmup-min", "0", "--cut-s", "2"], '"acked"'),
    "lineio_durable.py": (["--jobs", "5"], '"delivery_notify_ms"'),
    "offload_vllm.py": (["--bundle", "{bundle}", "--central-bundle", "{relative_bundle}", "--threads", "1",
                         "--context", "2048", "--parts", "6", "--probe", "2", "--before", "2", "--interval", "1.0",
                         "--open-s", "1"],
                        '"breaker_opened_and_closed": true'),
    "outbox_rate.py": (["--port", "{port}", "--results", "50"], "acknowledged_per_s"),
    "parallel_agreement.py": (["{bundle}"], "same verdicts"),
    "parallel_profile.py": (["{bundle}"], "one camera"),
    "programs.py": (["{pair}", "--frames", "1", "--requests", "3", "--threads", "2", "--stream-frames", "2", "--parts",
                     "reference,api,regions,regions_stream,budgets,clip"], '"ratio_per_frame"'),
    "rails_overhead.py": (["--iterations", "20", "--requests", "3"], "with 20 rails"),
    "realistic_pair.py": (["{tmp}/pair", "--converter", "{converter}", "--smoke", "--image-max-tokens", "16"],
                          '"quantize_s"'),
    "soak.py": (["--minutes", "0.25", "--warmup-min", "0", "--sample-s", "3", "--cameras", "1"], '"rss_mb"'),
    "soak.py#swaps": (["--swaps", "2", "--swap-between", "{bundle}", "{pair}", "--cameras", "0",
                       "--variants", "notrim,trim:arena2"], '"per_swap"'),
    "step_graphs.py": (["--model", "{bundle}", "--sequences", "2", "--threads", "1"], '"graphs_per_step"'),
    "step_shapes.py": (["{bundle}", "--rows", "1,2", "--tokens", "1", "--steps", "6"], "one row steady"),
    "token_profile.py": (["{bundle}", "2"], "µs/token"),
}
# Run against a real daemon by their own tests (peers.py: tests/benchmarks/test_peers.py, llama-server absent).
ELSEWHERE = {"peers.py", "device_kit.sh"}
# Shell drivers for the lent GPU machine (nvcc, CUDA): checked for syntax here, shellcheck'd in test_shipping.
GPU_ONLY = {"gpu_inspect.sh", "gpu_llm.sh", "gpu_pair.sh", "gpu_peers.sh", "gpu_run.sh", "gpu_vllm.sh"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = Broker(tmp_path_factory.mktemp("broker")).start()
    try:
        yield b
    finally:
        b.stop()


def test_every_benchmark_script_has_a_smoke_run() -> None:
    scripts = {p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh")}
    smoked = {name.partition("#")[0] for name in SMOKE}
    assert scripts == smoked | GPU_ONLY | ELSEWHERE, "give the new script a smoke run in SMOKE (or GPU_ONLY)"


def test_device_kit_gathers_what_the_gpu_scripts_read(tmp_path: Path) -> None:
    """The kit from PyPI: CPython 3.12 wheels of the daemon's compiled dependencies, the trimmed sdist
    under both names the GPU scripts read, and the converter with its gguf-py."""
    kit = tmp_path / "kit"
    env = {**os.environ, "KIT": str(kit), "PYTHON": sys.executable}
    subprocess.run(["bash", str(BENCH / "device_kit.sh")], check=True, cwd=ROOT, env=env, timeout=600,
                   capture_output=True)
    wheels = {p.name.split("-")[0].lower() for p in (kit / "whl").glob("*.whl")}
    assert {"flask", "pydantic", "pydantic_core", "llguidance", "paho_mqtt", "simplejpeg", "jsonschema"} <= wheels
    assert list((kit / "whl").glob("pydantic_core-*-cp312-*manylinux*.whl"))  # the machine's Python, not ours
    with tarfile.open(kit / "llama_cpp_python-0.3.36.tar.gz") as tar:
        names = set(tar.getnames())
    top = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
    assert {top + "CMakeLists.txt", top + "tools/mtmd/CMakeLists.txt", top + "tools/server/CMakeLists.txt"} <= names
    assert not any(n.startswith(top + "models/") for n in names)  # trimmed: vocab files are megabytes
    assert (kit / "peers-sdist.tar.gz").read_bytes() == (kit / "llama_cpp_python-0.3.36.tar.gz").read_bytes()
    assert (kit / "convert" / "convert_hf_to_gguf.py").is_file() and (kit / "convert" / "gguf-py" / "gguf").is_dir()


@pytest.mark.parametrize("script", sorted(GPU_ONLY))
def test_gpu_driver_scripts_parse(script: str) -> None:
    subprocess.run(["bash", "-n", str(BENCH / script)], check=True, timeout=30)


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_benchmark_runs_on_the_demo_bundle(script: str, demo_dir: Path, broker: Broker, tmp_path: Path) -> None:
    trace = tmp_path / "power.jsonl"
    trace.write_text("".join(json.dumps({"t": t, "total_power_w": 8 + t % 3, "temperatures": {"cpu": 50 + t}}) + "\n"
                             for t in range(6)))
    args, expected = SMOKE[script]
    converter = tiny_pairs.converter_dir() if "{converter}" in args else ""
    # a GGUF + mmproj bundle where the script needs one (references: programs.py)
    pair = (tiny_pairs.write_pair_bundle(tiny_pairs.tiny_pair("qwen2.5-vl"), tmp_path / "pair")
            if "{pair}" in args else "")
    relative_bundle = os.path.relpath(demo_dir, tmp_path)  # the scripts run in tmp_path
    argv = [a.format(bundle=demo_dir, relative_bundle=relative_bundle, port=broker.port, trace=trace, tmp=tmp_path,
                     converter=converter, pair=pair) for a in args]
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "EDGE_RUNTIME_DATA": str(tmp_path / "data")}
    proc = subprocess.run([sys.executable, str(BENCH / script.partition("#")[0]), *argv], capture_output=True,
                          text=True, timeout=240, cwd=tmp_path, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert expected in output, output[-3000:]
