#!/usr/bin/env bash
# Issue 25 on a GPU: llama-server (CUDA, built from the llama.cpp our llama-cpp-python vendors) against our
# daemon on the Qwen2.5-VL-3B-shape GGUF + mmproj pair of gpu_pair.sh, all layers and the mmproj on the GPU,
# one server at a time, the same client (benchmarks/peers.py): the image + schema verdict (ours through
# /v1/chat/completions, /api/v1/infer and camera triggers) and issue 28's text-only chat request.
# Random weights: speed only. llama-server runs with --no-jinja (PEER_ARGS): with its jinja template path
# the grammar of a json_schema request fails to initialise on this pair ("Failed to initialize samplers").
# Expects in .device/ what gpu_pair.sh expects, plus peers-sdist.tar.gz:
#   python benchmarks/peers_lib/build.py trim .device/peers-sdist.tar.gz   (about 6 MB; keeps what the
#   server build reads, which the trimmed sdist of gpu_pair.sh drops: scripts/ui-assets.cmake, tools/ui)
# Phases, each within one 10-minute device call (the machine keeps /tmp and background jobs between calls):
#   build   the CUDA llama-server build in the background, then gpu_pair.sh's build (wheel, checkpoint)
#   pair    gpu_pair.sh's pair (quantize Q4_K_M, `models import`)
#   peers   waits for the server build, runs both workloads, JSON and tables into $OUT
#   bash benchmarks/gpu_peers.sh build; bash benchmarks/gpu_peers.sh pair; bash benchmarks/gpu_peers.sh peers
set -euo pipefail
OUT=${OUT:-$PWD/out}
ARCH=${CUDA_ARCH:-90}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT" /tmp/site
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EDGE_RUNTIME_CACHE=/tmp/peers-cache

for PHASE in "${@:-build}"; do
if [ "$PHASE" = build ]; then
  if [ -f /tmp/peers-build.done ] && grep -q "rc=0" /tmp/peers-build.done; then
    echo "llama-server already built: $(cat /tmp/peers-build.done)"; continue
  fi
  rm -rf /tmp/peers-cache /tmp/peers-build.done && mkdir -p /tmp/peers-cache
  # Half the cores each: the server build and gpu_pair.sh's wheel build compile ggml-cuda side by side.
  JOBS=$(( $(nproc) / 2 > 1 ? $(nproc) / 2 : 1 ))
  ( python3 "$HERE/peers_lib/build.py" --sdist .device/peers-sdist.tar.gz --cuda-arch "$ARCH" --jobs "$JOBS" \
      > /tmp/peers-build.log 2>&1
    echo "llama-server build rc=$? at $(date +%T)" > /tmp/peers-build.done ) < /dev/null > /dev/null 2>&1 &
  # (its output is not this call's: a background job holding the call's stdout would hold the call open)
  bash "$HERE/gpu_pair.sh" build
  { cat /tmp/peers-build.done 2>/dev/null || echo 'llama-server build still running'; } | tee "$OUT/peers-build.txt"
fi
if [ "$PHASE" = pair ]; then
  bash "$HERE/gpu_pair.sh" pair
fi
if [ "$PHASE" = peers ]; then
  # A fresh machine (the last one was given back) has no build: say so rather than wait for one.
  [ -f /tmp/peers-build.done ] || pgrep -f peers_lib/build.py > /dev/null ||
    { echo "no llama-server build on this machine: run the build phase first" | tee -a "$OUT/exit.txt"; exit 1; }
  while [ ! -f /tmp/peers-build.done ]; do sleep 5; done
  cat /tmp/peers-build.done; tail -2 /tmp/peers-build.log
  BIN=$(python3 "$HERE/peers_lib/build.py" --sdist .device/peers-sdist.tar.gz --cuda-arch "$ARCH")  # cached: prints the path
  for W in image chat; do
    python3 "$HERE/peers.py" --bundle /tmp/models/pair3b --workload "$W" --peer-bin "$BIN" --gpu-layers -1 \
      --threads "${THREADS:-8}" --context 4096 --clients "${CLIENTS:-1,2,4,8}" --requests "${REQUESTS:-8}" \
      --peer-args="${PEER_ARGS:---no-jinja}" --out "$OUT/peers-$W.json" 2> "$OUT/peers-$W.log" | tee "$OUT/peers-$W.txt" ||
      { echo "peers $W exited with $?" | tee -a "$OUT/exit.txt"; tail -20 "$OUT/peers-$W.log"; }
  done
  nvidia-smi --query-gpu=name,memory.total,memory.used,power.draw,temperature.gpu --format=csv > "$OUT/gpu.csv" || true
fi
done
