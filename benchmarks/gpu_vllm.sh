#!/usr/bin/env bash
# Issue 45 on the H200: vLLM 0.26.0 beside our daemon on the Qwen2.5-VL-3B-shape checkpoint of
# realistic_pair.py (vLLM: the bf16 Hugging Face folder; ours: its GGUF pair), and vLLM as the central server
# our device offloads to. Random weights: speed and protocol only.
# Expects, carried and git-ignored:
#   .device/       bash benchmarks/device_kit.sh (what gpu_pair.sh needs; peers-sdist.tar.gz may be left out)
#   .vllm/pN       consecutive pieces (split -b) of one `tar | xz -9` of a `pip install --no-deps --target`
#                  of the wheels in ../shared/vllm-0.26-wheels.tsv (vLLM 0.26.0 and 86 dependencies, xgrammar
#                  0.2.7), made on the CPU machine: `bash benchmarks/gpu_vllm.sh pack` (PyPI; about 10 minutes)
# Phases (the machine keeps /tmp and /root between calls while it stays warm; the end of a call kills what
# it started, except the llama.cpp build of gpu_pair.sh, which runs in its own session):
#   pack     (CPU machine) download the wheels, install them into one folder, tar | xz -9, split into
#            .vllm/p0 (P0_MB, small: it travels beside .device) and .vllm/p1.. (PART_MB each); xz -9 of the
#            912 MB folder took 31 minutes on the busy 2-core machine (234.8 MB: 28 + 3x58 + 22 MiB)
#   part     copy every carried .vllm/pN to /root/vparts (one call per piece: 64 MiB a call)
#   build    gpu_pair.sh build, the checkpoint kept (KEEP_HF) and the llama.cpp build left running (BUILD_WAIT=0)
#   install  join /root/vparts, unpack into /tmp/vsite, `import vllm`
#   pair     gpu_pair.sh pair (Q4_K_M bundle pair3b) keeping the f16 GGUF, then the Q8_0 and F16 bundles
#            pair3b-q8 and pair3b-f16 (QUANTS="q8 f16")
#   peers    benchmarks/peers.py on the image workload: ours (chat, /api/v1/infer, camera triggers) then vLLM
#            (VLLM_BACKEND: xgrammar) at CLIENTS (default 1,4,16); JSON and tables into $OUT
#   ours     our chat route alone on each bundle in BUNDLES (default pair3b-q8 pair3b-f16), the same client
#   offload  benchmarks/offload_vllm.py: the device on pair3b, vLLM as the center, stopped and started again
# Measured on the H200 (2026-12-04, docs/benchmarks.md): build 117 s (the llama.cpp build then ran on for ~5
# minutes), pair 286 s (waiting for that build), install 19 s, vLLM's first start 150 s (65-85 s later, with
# its compile cache), peers with vLLM alone 177 s, ours on three bundles 106 s, offload 182 s.
#   bash benchmarks/gpu_vllm.sh part build; ... part; bash benchmarks/gpu_vllm.sh pair; ... part install peers
set -euo pipefail
OUT=${OUT:-$PWD/out}
HERE=$(cd "$(dirname "$0")" && pwd)
HF=/tmp/models/pair3b.work/hf
VSITE=/tmp/vsite
VLLM_ARGS=${VLLM_ARGS:-}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

for PHASE in "$@"; do
echo "== $PHASE $(date -u +%T)"
if [ "$PHASE" = pack ]; then
  DL=${DL:-/tmp/vllm-dl}; TSV=${TSV:-../shared/vllm-0.26-wheels.tsv}
  mkdir -p "$DL/whl" .vllm
  cut -f2 "$TSV" | sed -E 's/^([^-]+)-([^-]+)-.*/\1==\2/' > "$DL/reqs.txt"
  PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_27_x86_64
        --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any)
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --no-deps -d "$DL/whl" "${PLAT[@]}" -r "$DL/reqs.txt"
  rm -rf "$DL/vsite"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$DL/vsite" "${PLAT[@]}" --python-version 3.12 \
    --implementation cp --only-binary=:all: "$DL"/whl/*.whl
  tar -C "$DL/vsite" -cf - . | xz -9 -T0 > "$DL/vsite.tar.xz"
  rm -f .vllm/p*
  head -c "$(( ${P0_MB:-28} * 1048576 ))" "$DL/vsite.tar.xz" > .vllm/p0
  tail -c +"$(( ${P0_MB:-28} * 1048576 + 1 ))" "$DL/vsite.tar.xz" | split -b "${PART_MB:-58}M" -d -a 1 - .vllm/q
  i=1; for f in .vllm/q*; do mv "$f" ".vllm/p$i"; i=$((i + 1)); done
  sha256sum "$DL/vsite.tar.xz" | cut -d' ' -f1 > .vllm/sha256
  ls -l .vllm
fi
if [ "$PHASE" = part ]; then
  mkdir -p /root/vparts
  for f in .vllm/p*; do [ -f "$f" ] && cp "$f" /root/vparts/ && echo "part $(basename "$f") $(stat -c %s "$f")"; done
  [ -f .vllm/sha256 ] && cp .vllm/sha256 /root/vparts/sha256
  ls /root/vparts | tr '\n' ' '; echo
fi
if [ "$PHASE" = build ]; then
  KEEP_HF=1 BUILD_WAIT=${BUILD_WAIT:-0} bash "$HERE/gpu_pair.sh" build
  ls -la "$HF" | head -20
fi
if [ "$PHASE" = install ]; then
  t0=$(date +%s)
  # the pieces in number order (p10 after p9), checked against the sum made with them
  PIECES=$(ls /root/vparts/p* | sort -V)
  if [ -f /root/vparts/sha256 ]; then
    echo "$(cat /root/vparts/sha256)  -" > /tmp/vsite.sha256
    cat $PIECES | sha256sum -c /tmp/vsite.sha256 || { echo "vLLM pieces do not add up" | tee -a "$OUT/exit.txt"; exit 1; }
  fi
  rm -rf "$VSITE" && mkdir -p "$VSITE"
  cat $PIECES | xz -d -T0 | tar -x -C "$VSITE"
  # (xgrammar has no __version__: the versions come from the installed metadata)
  PYTHONPATH=$VSITE python3 -c "import importlib.metadata as m, vllm; print(*(f'{p} {m.version(p)}' for p in ('vllm', 'torch', 'transformers', 'xgrammar', 'llguidance')))" 2>&1 | tail -3 | tee "$OUT/vllm-install.txt"
  echo "install $(( $(date +%s) - t0 )) s" | tee -a "$OUT/vllm-install.txt"
fi
if [ "$PHASE" = pair ]; then
  KEEP_F16=1 bash "$HERE/gpu_pair.sh" pair
  export PYTHONPATH=/tmp/site:$PWD
  W=/tmp/models/pair3b.work
  for Q in ${QUANTS:-q8 f16}; do
    if [ "$Q" = q8 ]; then
      python3 -c "import os, sys; from pathlib import Path; from edge_runtime_models.llama_cpp_tools import quantize; quantize(Path(sys.argv[1]), Path(sys.argv[2]), 'Q8_0', threads=os.cpu_count() or 1)" \
        "$W/lm-f16.gguf" "$W/lm-Q8_0.gguf"
      LM=$W/lm-Q8_0.gguf
    else
      LM=$W/lm-f16.gguf
    fi
    python3 -m edge_runtime models import "$LM" "$W/mmproj-f16.gguf" "/tmp/models/pair3b-$Q" --name "qwen2.5-vl-3b-shape-$Q" \
      --image-max-tokens 256 --link | tail -1 | tee -a "$OUT/pair.txt"
  done
  ls -la "$W" | tee -a "$OUT/pair.txt"
fi
if [ "$PHASE" = peers ]; then
  export PYTHONPATH=/tmp/site:$PWD EDGE_RUNTIME_CACHE=/tmp/peers-cache
  python3 "$HERE/peers.py" --bundle /tmp/models/pair3b --workload image --vllm-model "$HF" --vllm-pythonpath "$VSITE" \
    --vllm-backend "${VLLM_BACKEND:-xgrammar}" --vllm-args="$VLLM_ARGS" --gpu-layers -1 --threads "${THREADS:-8}" \
    --context 4096 --clients "${CLIENTS:-1,4,16}" --requests "${REQUESTS:-8}" ${PEERS_ARGS:-} \
    --out "$OUT/vllm-peers${TAG:-}.json" 2> "$OUT/vllm-peers${TAG:-}.log" | tee "$OUT/vllm-peers${TAG:-}.txt" ||
    { echo "peers exited with $?" | tee -a "$OUT/exit.txt"; tail -40 "$OUT/vllm-peers${TAG:-}.log"; }
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.csv" || true
fi
if [ "$PHASE" = ours ]; then
  export PYTHONPATH=/tmp/site:$PWD EDGE_RUNTIME_CACHE=/tmp/peers-cache
  for b in ${BUNDLES:-pair3b-q8 pair3b-f16}; do
    python3 "$HERE/peers.py" --bundle "/tmp/models/$b" --workload image --no-peer --routes "${ROUTES:-chat}" \
      --gpu-layers -1 --threads "${THREADS:-8}" --context 4096 --clients "${CLIENTS:-1,4,16}" --requests "${REQUESTS:-8}" \
      --out "$OUT/ours-$b.json" 2> "$OUT/ours-$b.log" | tee "$OUT/ours-$b.txt" ||
      { echo "ours $b exited with $?" | tee -a "$OUT/exit.txt"; tail -20 "$OUT/ours-$b.log"; }
  done
fi
if [ "$PHASE" = offload ]; then
  export PYTHONPATH=/tmp/site:$PWD
  python3 "$HERE/offload_vllm.py" --bundle /tmp/models/pair3b --vllm-model "$HF" --vllm-pythonpath "$VSITE" \
    --vllm-backend "${VLLM_BACKEND:-xgrammar}" --vllm-args="$VLLM_ARGS" --gpu-layers -1 --threads "${THREADS:-8}" \
    --out "$OUT/offload-vllm.json" 2>&1 | tee "$OUT/offload-vllm.txt" || echo "offload exited with $?" | tee -a "$OUT/exit.txt"
fi
done
