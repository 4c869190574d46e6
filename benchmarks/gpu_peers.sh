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
# Phases, each within one 10-minute device call. The machine keeps /tmp between calls, but the end of a
# call kills every process it started, background jobs included, so no build may outlive its call:
#   build   gpu_pair.sh's build and pair in one call (CUDA llama-cpp-python wheel beside the checkpoint and
#           f16 conversion, then quantize Q4_K_M and `models import`): 426 s on the H200
#   server  the CUDA llama-server build, in the foreground on every core: 280 s on the H200
#   peers   both workloads, JSON and tables into $OUT: 103 s on the H200
#   steps   needs only build: our daemon with fast-forward on and off, 1 then 4 concurrent image chats
#           (benchmarks/chat_speed.py), two rounds each, from this tree and, when .device/base-src.tar.gz
#           is there (`git archive BASE edge_runtime | gzip`), from that commit's: what one graph per
#           batched step (llm/parallel.py) gives against the split steps before it
#   graphs  needs only build: benchmarks/step_graphs.py on the pair, 1 and 4 verdicts at once, fast-forward on
#           and off: llama.cpp graphs per step, CUDA graph captures and resets, ms per step
#   fabench, facam, faprofile  need only build (SHAPES="3b 1.5b" for both pairs): model.flash_attention on, then
#           off, on this tree: `edge-runtime bench` of each pair; our camera and chat routes at 1/2/4/8 clients
#           (peers.py --no-peer; OURS_SET=SECTION.KEY=VALUE one more setting, TAG its files' suffix);
#           benchmarks/parallel_profile.py (1-8 cameras as parallel sequences, both KV layouts)
#   shapes  needs only build: benchmarks/step_shapes.py on each pair in BUNDLES: ms per raw step by rows and tokens
#           per row, with the shape steady, changing every step, or changing every 10th step (CUDA graph replays)
#   steady  needs only build: model.steady_steps on, then off: `edge-runtime bench` of each pair in BUNDLES (BENCH=1),
#           the camera and chat routes at CLIENTS (CAMERA=1), CUDA graph captures and reuses (GRAPHS=1)
#   spec    needs only build: speculative decoding (model.draft_model) with the pair's language model cut to its
#           first DRAFT_LAYERS layers (models/draft.py; default "2 4"): `edge-runtime bench` of each pair in
#           BUNDLES without a draft, then with each; the camera route at CLIENTS (default 1,4) likewise
#   bash benchmarks/gpu_peers.sh build; bash benchmarks/gpu_peers.sh server; bash benchmarks/gpu_peers.sh peers
set -euo pipefail
OUT=${OUT:-$PWD/out}
ARCH=${CUDA_ARCH:-90}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT" /tmp/site
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 EDGE_RUNTIME_CACHE=/tmp/peers-cache

bench_pair() {  # CONFIG BUNDLE NAME LOG: `edge-runtime bench` of /tmp/models/BUNDLE into $OUT/NAME.json and .txt
  python3 -m edge_runtime --config "$1" --log-level warning bench --model "/tmp/models/$2" \
    --frames "${FRAMES:-12}" --json > "$OUT/$3.json" 2>> "$OUT/$4" || echo "bench $3 exited with $?" | tee -a "$OUT/exit.txt"
  python3 -c "import json,sys; from edge_runtime.cli.bench import BenchReport, render; print(render(BenchReport(**json.load(open(sys.argv[1])))))" \
    "$OUT/$3.json" | tee "$OUT/$3.txt"
}

for PHASE in "${@:-build}"; do
if [ "$PHASE" = build ]; then
  bash "$HERE/gpu_pair.sh" build pair
fi
if [ "$PHASE" = server ]; then
  if [ -x "$(cat /tmp/peers-build.done 2>/dev/null)" ]; then
    echo "llama-server already built: $(cat /tmp/peers-build.done)"; continue
  fi
  rm -rf /tmp/peers-cache && mkdir -p /tmp/peers-cache
  python3 "$HERE/peers_lib/build.py" --sdist .device/peers-sdist.tar.gz --cuda-arch "$ARCH" --jobs "$(nproc)" \
    > /tmp/peers-build.log 2>&1 || { tail -20 /tmp/peers-build.log; exit 1; }
  tail -1 /tmp/peers-build.log > /tmp/peers-build.done  # the binary's path
  tee "$OUT/peers-build.txt" < /tmp/peers-build.done
fi
if [ "$PHASE" = peers ]; then
  BIN=$(cat /tmp/peers-build.done 2>/dev/null || true)
  # A fresh machine (the last one was given back) has no build: say so rather than run without one.
  [ -x "$BIN" ] || { echo "no llama-server build on this machine: run the server phase first" | tee -a "$OUT/exit.txt"; exit 1; }
  for W in image chat; do
    python3 "$HERE/peers.py" --bundle /tmp/models/pair3b --workload "$W" --peer-bin "$BIN" --gpu-layers -1 \
      --threads "${THREADS:-8}" --context 4096 --clients "${CLIENTS:-1,2,4,8}" --requests "${REQUESTS:-8}" \
      --peer-args="${PEER_ARGS:---no-jinja}" --out "$OUT/peers-$W.json" 2> "$OUT/peers-$W.log" | tee "$OUT/peers-$W.txt" ||
      { echo "peers $W exited with $?" | tee -a "$OUT/exit.txt"; tail -20 "$OUT/peers-$W.log"; }
  done
  nvidia-smi --query-gpu=name,memory.total,memory.used,power.draw,temperature.gpu --format=csv > "$OUT/gpu.csv" || true
fi
if [ "$PHASE" = fabench ] || [ "$PHASE" = facam ] || [ "$PHASE" = faprofile ]; then
  # model.flash_attention on and off (as llama-server's -fa auto and the setting before it), the same tree
  for FA in ${FA_SETTINGS:-true false}; do
    printf 'model:\n  gpu_layers: -1\n  threads: %s\n  context_size: 4096\n  flash_attention: %s\n' \
      "${THREADS:-8}" "$FA" > "/tmp/fa-$FA.yaml"
    if [ "$PHASE" = fabench ]; then
      for b in ${BUNDLES:-pair3b pair15b}; do
        bench_pair "/tmp/fa-$FA.yaml" "$b" "bench-$b-fa-$FA" fa.log
      done
    fi
    if [ "$PHASE" = facam ]; then
      python3 "$HERE/peers.py" --bundle "/tmp/models/${BUNDLE:-pair3b}" --workload image --no-peer --gpu-layers -1 \
        --routes "${ROUTES:-camera,chat}" --threads "${THREADS:-8}" --context 4096 --clients "${CLIENTS:-1,2,4,8}" \
        --requests "${REQUESTS:-8}" --ours-set "model.flash_attention=$FA" ${OURS_SET:+--ours-set "$OURS_SET"} --out "$OUT/facam-$FA${TAG:-}.json" \
        2>> "$OUT/fa.log" | tee "$OUT/facam-$FA${TAG:-}.txt" || echo "facam fa=$FA exited with $?" | tee -a "$OUT/exit.txt"
    fi
    if [ "$PHASE" = faprofile ]; then
      python3 "$HERE/parallel_profile.py" "/tmp/models/${BUNDLE:-pair3b}" "/tmp/fa-$FA.yaml" 2>> "$OUT/fa.log" |
        tee "$OUT/faprofile-$FA.txt"
    fi
  done
fi
if [ "$PHASE" = spec ]; then
  for b in ${BUNDLES:-pair15b pair3b}; do
    for L in ${DRAFT_LAYERS:-2 4}; do
      [ -f "/tmp/models/$b-draft$L.gguf" ] || PYTHONPATH=.device/convert/gguf-py:$PYTHONPATH python3 models/draft.py \
        "/tmp/models/$b/lm-Q4_K_M.gguf" \
        "/tmp/models/$b-draft$L.gguf" --layers "$L" | tee -a "$OUT/spec.log"
    done
    for D in none ${DRAFT_LAYERS:-2 4}; do
      printf 'model:\n  gpu_layers: -1\n  threads: %s\n  context_size: 4096\n' "${THREADS:-8}" > "/tmp/spec-$D.yaml"
      [ "$D" = none ] || printf '  draft_model: /tmp/models/%s-draft%s.gguf\n' "$b" "$D" >> "/tmp/spec-$D.yaml"
      python3 -m edge_runtime --config "/tmp/spec-$D.yaml" --log-level warning bench --model "/tmp/models/$b" \
        --frames "${FRAMES:-12}" --json > "$OUT/spec-$b-$D.json" 2>> "$OUT/spec.log" ||
        echo "bench $b draft=$D exited with $?" | tee -a "$OUT/exit.txt"
      python3 -c "import json,sys; from edge_runtime.cli.bench import BenchReport, render; print(render(BenchReport(**json.load(open(sys.argv[1])))))" \
        "$OUT/spec-$b-$D.json" | tee "$OUT/spec-$b-$D.txt"
      SET=(); [ "$D" = none ] || SET=(--ours-set "model.draft_model=/tmp/models/$b-draft$D.gguf")
      [ -n "${CAMERA:-1}" ] && python3 "$HERE/peers.py" --bundle "/tmp/models/$b" --workload image --no-peer --gpu-layers -1 \
        --routes camera --threads "${THREADS:-8}" --context 4096 --clients "${CLIENTS:-1,4}" --requests "${REQUESTS:-8}" \
        "${SET[@]}" --out "$OUT/speccam-$b-$D.json" 2>> "$OUT/spec.log" | tee "$OUT/speccam-$b-$D.txt" ||
        echo "camera $b draft=$D exited with $?" | tee -a "$OUT/exit.txt"
    done
  done
fi
if [ "$PHASE" = graphs ]; then
  for FF in on off; do
    python3 "$HERE/step_graphs.py" --model /tmp/models/pair3b --gpu-layers -1 --threads "${THREADS:-8}" \
      --sequences 1,4 --fast-forward "$FF" 2>> "$OUT/graphs.log" | tee -a "$OUT/graphs.jsonl"
  done
fi
if [ "$PHASE" = shapes ]; then
  printf 'model:\n  gpu_layers: -1\n  threads: %s\n  context_size: 4096\n  flash_attention: true\n' "${THREADS:-8}" \
    > /tmp/shapes.yaml
  for b in ${BUNDLES:-pair15b pair3b}; do
    for KV in ${KVS:-per_sequence}; do
      python3 "$HERE/step_shapes.py" "/tmp/models/$b" /tmp/shapes.yaml --rows "${ROWS:-1,2,4,8}" --tokens "${TOKENS:-1,2,4}" \
        --kv "$KV" 2>> "$OUT/shapes.log" | tee "$OUT/shapes-$b-$KV.txt"
    done
  done
fi
if [ "$PHASE" = steady ]; then
  # model.steady_steps on, then off (STEADY_SETTINGS), the same tree: bench of each pair in BUNDLES (BENCH=1), the
  # camera and chat routes on BUNDLE (CAMERA=1), CUDA graph captures and reuses per step (GRAPHS=1)
  for ST in ${STEADY_SETTINGS:-true false}; do
    printf 'model:\n  gpu_layers: -1\n  threads: %s\n  context_size: 4096\n  steady_steps: %s\n' "${THREADS:-8}" "$ST" \
      > "/tmp/steady-$ST.yaml"
    if [ -n "${BENCH:-}" ]; then
      for b in ${BUNDLES:-pair15b pair3b}; do
        bench_pair "/tmp/steady-$ST.yaml" "$b" "steady-bench-$b-$ST${TAG:-}" steady.log
      done
    fi
    if [ -n "${CAMERA:-}" ]; then
      python3 "$HERE/peers.py" --bundle "/tmp/models/${BUNDLE:-pair3b}" --workload image --no-peer --gpu-layers -1 \
        --routes "${ROUTES:-camera,chat}" --threads "${THREADS:-8}" --context 4096 --clients "${CLIENTS:-1,4,8}" \
        --requests "${REQUESTS:-8}" --ours-set "model.steady_steps=$ST" --out "$OUT/steady-cam-$ST${TAG:-}.json" \
        2>> "$OUT/steady.log" | tee "$OUT/steady-cam-$ST${TAG:-}.txt" || echo "camera steady=$ST exited with $?" | tee -a "$OUT/exit.txt"
    fi
    if [ -n "${GRAPHS:-}" ]; then
      python3 "$HERE/step_graphs.py" --model "/tmp/models/${BUNDLE:-pair3b}" --gpu-layers -1 --threads "${THREADS:-8}" \
        --sequences 1,4 --steady "$ST" 2>> "$OUT/steady.log" | tee -a "$OUT/steady-graphs.jsonl"
    fi
  done
fi
if [ "$PHASE" = steps ]; then
  TREES=(new)
  if [ -f .device/base-src.tar.gz ]; then
    rm -rf /tmp/base-src && mkdir -p /tmp/base-src && tar xzf .device/base-src.tar.gz -C /tmp/base-src && TREES+=(base)
  fi
  for FF in on off; do
    for TREE in "${TREES[@]}"; do
      SRC=$PWD; [ "$TREE" = base ] && SRC=/tmp/base-src
      # The daemon (`python -m`, a subprocess) imports edge_runtime from its working folder first.
      (cd "$SRC" && PYTHONPATH=$SRC:$PYTHONPATH python3 "$HERE/chat_speed.py" --model /tmp/models/pair3b --image \
        --gpu-layers -1 --context 4096 --threads "${THREADS:-8}" --requests 8 --clients 4 --per-client 8 --rounds 2 \
        --fast-forward "$FF" 2>> "$OUT/steps.log") | tail -1 | sed "s/^{/{\"tree\": \"$TREE\", /" | tee -a "$OUT/steps.jsonl"
    done
  done
fi
done
