#!/usr/bin/env bash
# Issue 41 on a GPU: what inspection programs cost (benchmarks/programs.py) on the Qwen2.5-VL-3B-shape
# GGUF + mmproj pair, all layers and the mmproj on the GPU (model.gpu_layers -1). Random weights: speed only.
# Each figure is a ratio measured in one run (both sides interleaved frame by frame):
#   reference  per-frame time with one reference image over none (target <= 1.15x)
#   api        a repeated API image through a running daemon: encode time of the repeats, cache hit rate
#   regions    four regions of one frame in one batch over one region (target <= 2.0x on the H200)
#   regions_compact  the same, each region's schema a boolean and an enum (answers of even length)
#   regions_stream   regions_compact's ratio through a running daemon's two-stage worker, frames fed as a
#                    continuous camera feeds them (per-frame ms of the stream, and each frame's latency)
#   budgets    time per frame at three image token budgets (the ceiling, 1/2, 1/4) on the same frames
#   clip       a clip of 4 frames (sliding window, encoder cache on) over a single frame
# KV_CACHE=unified: model.batch_kv_cache of the parts (default per_sequence: rows of equal length per step).
# STREAM_FRAMES=N: frames of each camera in regions_stream (default 32).
# ENCODER_LANES=N: model.encoder_lanes of the parts (default 1: one crop encoded at a time).
# BATCH_SIZE=N: model.batch_size of the parts (default 512: four 144-token regions take two image decodes).
# VARIANTS=lanes1,lanes4,lanes4-unified: regions and regions_compact once per setting (lanes<N>: encoder lanes N,
#   -unified: the unified KV cache), each its own Inspector, interleaved frame by frame: one run compares them.
# DECODE_PROFILE=1: regions and regions_compact time each llama_decode (synchronized) by kind (image, tokens) and rows.
# Needs only gpu_peers.sh's (or gpu_pair.sh's) build: the CUDA llama-cpp-python in /tmp/site and the pair in
# /tmp/models/pair3b. One phase, within one 10-minute device call:
#   inspect  JSON into $OUT/programs.json, the log into $OUT/programs.log, a summary into $OUT/programs.txt
#   bash benchmarks/gpu_peers.sh build; bash benchmarks/gpu_inspect.sh inspect
# On a CPU (to check the script): BUNDLE=/tmp/prog-a/pair05b GPU_LAYERS=0 THREADS=2 FRAMES=2 REQUESTS=3 \
#   PYTHONPATH=. bash benchmarks/gpu_inspect.sh inspect
set -euo pipefail
OUT=${OUT:-$PWD/out}
HERE=$(cd "$(dirname "$0")" && pwd)
BUNDLE=${BUNDLE:-/tmp/models/pair3b}
mkdir -p "$OUT" /tmp/site
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
ln -sfn "$PWD/models" /tmp/site/edge_runtime_models

for PHASE in "${@:-inspect}"; do
if [ "$PHASE" = inspect ]; then
  # A fresh machine (the last one was given back) has no pair: say so rather than fail deep inside.
  [ -f "$BUNDLE/bundle.yaml" ] ||
    { echo "no pair at $BUNDLE: run 'bash benchmarks/gpu_peers.sh build' first" | tee -a "$OUT/exit.txt"; exit 1; }
  PROFILE=; [ "${DECODE_PROFILE:-0}" = 1 ] && PROFILE=--decode-profile
  python3 "$HERE/programs.py" "$BUNDLE" --gpu-layers "${GPU_LAYERS:--1}" --threads "${THREADS:-8}" \
    --frames "${FRAMES:-12}" ${STREAM_FRAMES:+--stream-frames "$STREAM_FRAMES"} --requests "${REQUESTS:-100}" --side "${SIDE:-672}" \
    --parts "${PARTS:-reference,api,regions,regions_compact,regions_stream,budgets,clip}" --json "$OUT/programs.json" \
    ${BATCH_SIZE:+--batch-size "$BATCH_SIZE"} ${KV_CACHE:+--kv-cache "$KV_CACHE"} ${ENCODER_LANES:+--encoder-lanes "$ENCODER_LANES"} \
    ${VARIANTS:+--variants "$VARIANTS"} ${PROFILE:+"$PROFILE"} \
    > /dev/null 2> "$OUT/programs.log" || { echo "programs.py exited with $?" | tee -a "$OUT/exit.txt"; tail -20 "$OUT/programs.log"; exit 1; }
  python3 - "$OUT/programs.json" <<'PY' | tee "$OUT/programs.txt"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"machine: {r['machine']}, {r['cores']} cores, load {r['load_before']:.1f} -> {r['load_after']:.1f}")
if "reference" in r:
    x = r["reference"]
    print(f"reference: none p50 {x['plain']['p50_ms']} ms, one reference p50 {x['ref']['p50_ms']} ms: "
          f"{x['ratio_p50']}x (TTFT {x['ratio_ttft_p50']}x)")
if "repeated_api_image" in r:
    x = r["repeated_api_image"]
    print(f"repeated API image: hit rate {x['hit_rate']} ({x['hits']}/{x['hits'] + x['misses']}), first encode "
          f"{x['first_encode_ms']} ms, repeats p50 {x['repeat_encode_p50_ms']} ms")
for part in ("regions", "regions_compact"):
    if part in r:
        x = r[part]
        print(f"{part} ({x.get('schema')} schema, batch {x.get('batch_size')}, {x.get('kv_cache')} KV, "
              f"{x.get('encoder_lanes', 1)} encoder lanes): "
              f"one p50 {x['one']['p50_ms']} ms ({x['one'].get('steps_mean')} steps), "
              f"four in one batch p50 {x['four']['p50_ms']} ms ({x['four'].get('steps_mean')} steps): {x['ratio_p50']}x "
              f"(to the regions' first tokens {x['one']['ttft_p50_ms']} -> {x['four']['ttft_p50_ms']} ms, "
              f"{x.get('ratio_ttft_p50', '?')}x; longest answer {x['one'].get('longest_answer_chars_mean')} -> "
              f"{x['four'].get('longest_answer_chars_mean')} chars)")
        if "stages_p50_ms" in x["one"]:
            print(f"  stages p50 ms, one: {x['one']['stages_p50_ms']}; four: {x['four']['stages_p50_ms']}")
        stage = lambda c: "/".join(str(c["stages_p50_ms"].get(s, "?")) for s in ("encode", "prefill", "decode"))
        for name, v in (x.get("variants") or {}).items():
            print(f"  {name:<16} ({v['encoder_lanes']} lanes, {v['kv_cache']} KV): one p50 {v['one']['p50_ms']} ms, "
                  f"four p50 {v['four']['p50_ms']} ms: {v['ratio_p50']}x; encode/prefill/decode p50 ms one "
                  f"{stage(v['one'])}, four {stage(v['four'])}; steps {v['one']['steps_mean']} -> {v['four']['steps_mean']}")
        for name, v in (x.get("variants") or {"": x}).items():
            for cam in ("one", "four"):
                d = v[cam].get("decode_profile")
                if d:
                    rows = ", ".join(f"{k} {t['calls_per_frame']:g}x{t['call_p50_ms']}ms" for k, t in d["by_kind_rows"].items())
                    print(f"  decodes {name or 'run'} {cam}: {d['calls_per_frame']} a frame, {d['decode_ms_frame_p50']} ms "
                          f"a frame p50; kind x rows: calls a frame x one call's p50: {rows}")
if "regions_stream" in r:
    x = r["regions_stream"]
    print(f"regions_stream ({x['schema']} schema, {x['frames']} frames a camera): one region "
          f"{x['one']['per_frame_ms']} ms a frame (latency p50 {x['one']['latency_p50_ms']} ms), four "
          f"{x['four']['per_frame_ms']} ms a frame (latency p50 {x['four']['latency_p50_ms']} ms): "
          f"{x['ratio_per_frame']}x per frame, {x['ratio_latency_p50']}x latency")
if "budgets" in r:
    x = r["budgets"]
    for k, v in x.items():
        if isinstance(v, dict) and "max" in v:
            print(f"budget max {v['max']}: {v['image_tokens']} image tokens, p50 {v['p50_ms']} ms "
                  f"(TTFT {v['ttft_p50_ms']} ms), {x['ratio_p50_to_quarter'][k]}x the quarter budget")
if "clip" in r:
    x = r["clip"]
    print(f"clip of {x['clip_frames']}: single frame p50 {x['plain']['p50_ms']} ms, clip p50 {x['clip']['p50_ms']} ms: "
          f"{x['ratio_p50']}x (TTFT {x['ratio_ttft_p50']}x)")
PY
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,memory.total,memory.used,power.draw,temperature.gpu --format=csv > "$OUT/gpu.csv" || true
  fi
fi
done
