#!/usr/bin/env bash
# Issue 22 on a GPU: a Qwen2.5-VL-3B-shape GGUF + mmproj pair (libmtmd's encoder on CUDA) against the
# ONNX-encoder bundle of a Qwen2.5-3B-shape decoder, both through `edge-runtime bench` (per stage,
# ratios against the raw engines, 4 cameras as parallel sequences). Random weights: speed only.
# Expects (carried, git-ignored) in .device/: whl/ (the wheels the machine lacks), the trimmed
# llama-cpp-python sdist, convert/ (convert_hf_to_gguf.py, conversion/, gguf-py/ of the same llama.cpp):
# `bash benchmarks/device_kit.sh` gathers them (about 30 MB).
# SHAPES (default 3b; also 1.5b, 0.5b: realistic_pair.SHAPES) names the pairs that build and pair make, each
# into /tmp/models/pair<shape without its dot> (pair3b, pair15b).
# Phases, in order, each within one 10-minute device call (the machine keeps /tmp between calls, but the
# end of a call kills what it started, except the llama.cpp build, which runs in its own session; `build pair`
# in one call: 426 s on the H200 for the 3b pair):
#   build   CUDA build of llama.cpp (background) beside the pair's checkpoint and f16 conversion
#   pair    quantize the pair's decoder Q4_K_M and `models import` it
#   ort     the ONNX-encoder bundle of the same decoder shape (`models bench siglip224-qwen3b`)
#   bench   both benches, JSON and tables into $OUT
#   ortgpu  onnxruntime-gpu 1.31.1 for the ONNX bundle's encoder on CUDA: the 256 MB wheel arrives in
#           parts appended to /root/ort.whl by earlier calls; installed into /tmp/site-ort, which `bench`
#           and `eval` then put first (with the image's CUDA/cuDNN libraries on LD_LIBRARY_PATH)
#   eval    `edge-runtime eval` (issue 24) of both bundles on a generated labelled set (200 parts at
#           640x480, every third scratched): images/s batched across images as cameras are; needs the
#           eval extra's wheels in .device-eval/whl when the machine lacks scikit-learn/scipy/matplotlib
#   bash benchmarks/gpu_pair.sh build pair; bash benchmarks/gpu_pair.sh ort; bash benchmarks/gpu_pair.sh bench
set -euo pipefail
OUT=${OUT:-$PWD/out}
ARCH=${CUDA_ARCH:-90}
mkdir -p "$OUT" /tmp/site /tmp/models
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ln -sfn "$PWD/models" /tmp/site/edge_runtime_models

ort_gpu_env() {  # the ONNX bundle's encoder on CUDA when onnxruntime-gpu is installed (phase ortgpu)
  [ -d /tmp/site-ort/onnxruntime ] || return 0
  export PYTHONPATH=/tmp/site-ort:$PYTHONPATH
  LD_LIBRARY_PATH=$(python3 - <<'PY'
import pathlib, site
dirs = {str(p.parent) for s in site.getsitepackages() for p in pathlib.Path(s, "nvidia").rglob("lib*.so*")}
print(":".join(sorted(dirs)))
PY
)
  export LD_LIBRARY_PATH
  printf '  providers: [CUDAExecutionProvider, CPUExecutionProvider]\n' >> /tmp/gpu.yaml
}

wait_for_build() {
  # A fresh machine (the last one was given back) has no build and none running: say so, do not wait.
  [ -f /tmp/llb/done ] || pgrep -f "pip wheel" > /dev/null ||
    { echo "no llama-cpp-python build on this machine: run the build phase first" | tee -a "$OUT/exit.txt"; exit 1; }
  while [ ! -f /tmp/llb/done ]; do sleep 5; done
  cat /tmp/llb/done
}

for PHASE in "${@:-build}"; do
if [ "$PHASE" = build ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .device/whl/*.whl
  rm -rf /tmp/llb && mkdir -p /tmp/llb && tar xzf .device/llama_cpp_python-*.tar.gz -C /tmp/llb
  # In its own session: a call that runs out of time ends, the build does not (the next call waits for it).
  ARCH=$ARCH setsid bash -c 'cd /tmp/llb/llama_cpp_python-* &&
    CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$ARCH -DLLAMA_BUILD_TESTS=OFF" \
      python3 -m pip wheel -q --no-deps --no-build-isolation -w /tmp/llb/wheel . > /tmp/llb/log 2>&1 &&
    python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/llb/wheel/*.whl >> /tmp/llb/log 2>&1
    echo "build rc=$? at $(date +%T)" > /tmp/llb/done' < /dev/null > /dev/null 2>&1 &
  t0=$(date +%s)
  # The HF checkpoints (GPU init) and their f16 conversions run beside the build; quantizing needs llama.cpp.
  for SHAPE in ${SHAPES:-3b}; do
    D=/tmp/models/pair${SHAPE//./}.work
    SHAPE=$SHAPE D=$D python3 - <<'PY' 2>&1 | tail -3
import os, sys, time; sys.path.insert(0, "benchmarks")
import realistic_pair as rp
from pathlib import Path
work = Path(os.environ["D"]); work.mkdir(parents=True, exist_ok=True)
text, vision, px, _quant, _name = rp.SHAPES[os.environ["SHAPE"]]
t = time.perf_counter(); rp.build_checkpoint(work / "hf", text, vision, image_px=px)
print(os.environ["SHAPE"], "checkpoint", round(time.perf_counter() - t, 1), "s")
t = time.perf_counter()
rp.convert(Path(".device/convert"), work / "hf", work / "lm-f16.gguf", "f16", mmproj=False)
rp.convert(Path(".device/convert"), work / "hf", work / "mmproj-f16.gguf", "f16", mmproj=True)
print(os.environ["SHAPE"], "convert", round(time.perf_counter() - t, 1), "s")
PY
    [ -n "${KEEP_HF:-}" ] || rm -rf "$D/hf"  # KEEP_HF=1: vLLM serves it (gpu_vllm.sh)
  done
  for _ in $(seq 1 "${BUILD_WAIT:-80}"); do [ -f /tmp/llb/done ] && break; sleep 5; done  # leave the rest to `pair`
  echo "build+checkpoint $(( $(date +%s) - t0 )) s; $(cat /tmp/llb/done 2>/dev/null || echo 'build still running')" | tee "$OUT/build.txt"
fi
if [ "$PHASE" = pair ]; then
  wait_for_build; tail -3 /tmp/llb/log || true
  python3 -c "import llama_cpp; print('gpu offload:', llama_cpp.llama_supports_gpu_offload())" | tee -a "$OUT/pair.txt"
  for SHAPE in ${SHAPES:-3b}; do
    D=/tmp/models/pair${SHAPE//./}
    D=$D KEEP_F16=${KEEP_F16:-} python3 - <<'PY' | tee -a "$OUT/pair.txt"
import os, time
from pathlib import Path
from edge_runtime_models.llama_cpp_tools import quantize
w = Path(os.environ["D"] + ".work"); t = time.perf_counter()
quantize(w / "lm-f16.gguf", w / "lm-Q4_K_M.gguf", "Q4_K_M", threads=os.cpu_count() or 1)
if not os.environ.get("KEEP_F16"):  # KEEP_F16=1: gpu_vllm.sh makes Q8_0 and F16 bundles from it
    (w / "lm-f16.gguf").unlink()
print(w, "quantize", round(time.perf_counter() - t, 1), "s;", {p.name: p.stat().st_size for p in w.glob("*.gguf")})
PY
    NAME=$(cd benchmarks && python3 -c "import realistic_pair as rp; print(rp.SHAPES['$SHAPE'][4])")
    python3 -m edge_runtime models import "$D.work/lm-Q4_K_M.gguf" "$D.work/mmproj-f16.gguf" "$D" --name "$NAME" \
      --image-max-tokens 256 --link | tail -1 | tee -a "$OUT/pair.txt"
  done
fi
if [ "$PHASE" = ort ]; then
  [ -f /tmp/models/siglip224-qwen3b/bundle.yaml ] ||
    python3 -m edge_runtime models bench siglip224-qwen3b /tmp/models/siglip224-qwen3b | tail -1 | tee "$OUT/ort.txt"
fi
if [ "$PHASE" = ortgpu ]; then
  rm -rf /tmp/site-ort && cp /root/ort.whl /tmp/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-ort \
    /tmp/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
  printf 'model:\n' > /tmp/gpu.yaml; ort_gpu_env
  python3 -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())" | tee "$OUT/ortgpu.txt"
fi
if [ "$PHASE" = bench ]; then
  printf 'model:\n  gpu_layers: -1\n  threads: 8\n  context_size: 4096\n' > /tmp/gpu.yaml
  ort_gpu_env
  for b in ${BUNDLES:-pair3b siglip224-qwen3b}; do
    python3 -m edge_runtime --config /tmp/gpu.yaml --log-level warning bench --model "/tmp/models/$b" \
      --frames "${FRAMES:-12}" --json > "$OUT/bench-$b.json" || echo "bench $b exited with $?" | tee -a "$OUT/exit.txt"
    python3 -c "import json,sys; from edge_runtime.cli.bench import BenchReport, render; print(render(BenchReport(**json.load(open(sys.argv[1])))))" \
      "$OUT/bench-$b.json" | tee "$OUT/bench-$b.txt"
  done
  nvidia-smi --query-gpu=name,memory.total,memory.used,power.draw,temperature.gpu --format=csv > "$OUT/gpu.csv" || true
fi
if [ "$PHASE" = eval ]; then
  python3 -c "import sklearn, scipy, matplotlib" 2>/dev/null ||
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device-eval/whl/*.whl
  python3 - <<'PY'
import json
from pathlib import Path
import cv2
from edge_runtime.core.samples import part_image
d = Path("/tmp/labelled"); d.mkdir(exist_ok=True); lines = []
for i in range(int(__import__("os").environ.get("EVAL_IMAGES", "200"))):
    bad = i % 3 == 2
    cv2.imwrite(str(d / f"part{i:03d}.jpg"), part_image(i, 640, 480, defect=bad))
    lines.append(json.dumps({"id": f"part{i:03d}", "image": f"part{i:03d}.jpg", "defect": bad,
                             "category": "scratch" if bad else "none"}))
(d / "labels.jsonl").write_text("\n".join(lines) + "\n")
PY
  printf 'model:\n  gpu_layers: -1\n  threads: 8\n  context_size: 4096\n' > /tmp/gpu.yaml
  ort_gpu_env
  for b in ${BUNDLES:-pair3b siglip224-qwen3b}; do
    for batch in 4 1; do
      printf 'inspection:\n  max_batch: %s\n' "$batch" | cat /tmp/gpu.yaml - > "/tmp/eval-b$batch.yaml"
      rm -rf "/tmp/eval-$b-$batch"
      /usr/bin/time -v python3 -m edge_runtime --config "/tmp/eval-b$batch.yaml" --log-level warning eval \
        /tmp/labelled/labels.jsonl --model "/tmp/models/$b" --out "/tmp/eval-$b-$batch" --quiet \
        > "$OUT/eval-$b-b$batch.txt" 2> "$OUT/eval-$b-b$batch.err" || echo "eval $b b$batch exited with $?" | tee -a "$OUT/exit.txt"
      grep -E "images/s|this run" "$OUT/eval-$b-b$batch.txt" "$OUT/eval-$b-b$batch.err" | tail -2
      cp "/tmp/eval-$b-$batch/report.json" "$OUT/eval-$b-b$batch.json" 2>/dev/null || true
    done
  done
fi
done
