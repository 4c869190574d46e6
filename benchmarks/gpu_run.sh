#!/usr/bin/env bash
# The GPU measurements of docs/benchmarks.md, on a machine with an NVIDIA GPU and nvcc, no network.
# Expects in .whl/: the Python wheels the package needs that the machine lacks, and a (trimmed)
# llama-cpp-python sdist. Builds llama.cpp with CUDA, the realistic bundles, then runs
# `edge-runtime bench` on each and the governor under a power budget. Results go to $OUT (or ./out).
set -euo pipefail
OUT=${OUT:-$PWD/out}
ARCH=${CUDA_ARCH:-90}
PHASE=${1:-all}          # build | bench | governor | all
mkdir -p "$OUT" /tmp/site
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ln -sfn "$PWD/models" /tmp/site/edge_runtime_models

if [ "$PHASE" = build ] || [ "$PHASE" = all ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
  rm -rf /tmp/llb && mkdir -p /tmp/llb && tar xzf .whl/llama_cpp_python-*.tar.gz -C /tmp/llb
  ( cd /tmp/llb/llama_cpp_python-* &&
    CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$ARCH -DLLAMA_BUILD_TESTS=OFF" \
      python3 -m pip wheel -q --no-deps --no-build-isolation -w /tmp/llb/wheel . ) 2>&1 | tail -5
  python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/llb/wheel/*.whl
  python3 -c "import llama_cpp; print('gpu offload:', llama_cpp.llama_supports_gpu_offload())"
  for b in siglip224-qwen0.5b siglip224-qwen1.5b; do
    [ -f "/tmp/models/$b/bundle.yaml" ] || python3 -m edge_runtime models bench "$b" "/tmp/models/$b" | tail -1
  done
fi
if [ "$PHASE" = bench ] || [ "$PHASE" = all ]; then
  printf 'model:\n  gpu_layers: -1\n  threads: 8\n' > /tmp/gpu.yaml
  python3 -m edge_runtime --config /tmp/gpu.yaml models demo /tmp/models/demo >/dev/null
  for b in demo siglip224-qwen0.5b siglip224-qwen1.5b; do
    python3 -m edge_runtime --config /tmp/gpu.yaml --log-level warning bench --model "/tmp/models/$b" \
      --frames 20 --json > "$OUT/bench-$b.json"
    python3 -c "import json,sys; from edge_runtime.cli.bench import BenchReport, render; print(render(BenchReport(**json.load(open(sys.argv[1])))))" "$OUT/bench-$b.json"
  done
  nvidia-smi --query-gpu=name,memory.total,power.draw,temperature.gpu --format=csv > "$OUT/gpu.csv" || true
fi
if [ "$PHASE" = governor ] || [ "$PHASE" = all ]; then
  python3 benchmarks/governor_run.py --model /tmp/models/siglip224-qwen1.5b --gpu-layers -1 --seconds 90 \
    --out "$OUT/governor-trace.jsonl" | tee "$OUT/governor.json"
fi
