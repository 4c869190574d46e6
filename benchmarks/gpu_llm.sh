#!/usr/bin/env bash
# Issue 16's GPU measurements, in few device calls on a warm H200 machine (its /root and /tmp stay
# between calls while it is held). Run from the source tree; carried files in ../whl.
#   start   install the small wheels, start the CUDA build of llama.cpp in the background (setsid)
#   stash   copy the carried wheel parts (onnxruntime-gpu, Gemma 3 270M chunks) to /root/c
#   bench   join onnxruntime-gpu, build the bundles, bench 0.5B/1.5B shapes and real Gemma 270M
#           with the encoder on ORT's CUDA provider, where a batched step's time goes
#           (benchmarks/parallel_profile.py), and the parallel-vs-sequential agreement
set -uo pipefail
OUT=${OUT:-$PWD/out}
WHL=${WHL:-$PWD/../whl}
PHASE=${1:-bench}
FRAMES=${FRAMES:-10}
mkdir -p "$OUT" /tmp/site /root/c
export PYTHONUNBUFFERED=1

case "$PHASE" in
start)
  python3 -V; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$WHL"/*.whl
  rm -rf /tmp/llb && mkdir -p /tmp/llb && tar xzf "$WHL"/llama_cpp_python-*.tar.gz -C /tmp/llb
  cp "$WHL"/ort.part.* /root/c/ 2>/dev/null || true
  setsid bash -c 'cd /tmp/llb/llama_cpp_python-* && t0=$(date +%s) &&
    CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=OFF" \
    python3 -m pip wheel -q --no-deps --no-build-isolation -w /tmp/llb/wheel . > /tmp/llb/build.log 2>&1;
    echo "rc=$? seconds=$(( $(date +%s) - t0 ))" > /tmp/llb/done' < /dev/null > /dev/null 2>&1 &
  echo "build started"; ls -la /root/c ;;
stash)
  cp "$WHL"/ort.part.* "$WHL"/*.whl /root/c/ 2>/dev/null || true
  ls -la /root/c; cat /tmp/llb/done 2>/dev/null || tail -c 300 /tmp/llb/build.log ;;
bench)
  while [ ! -f /tmp/llb/done ]; do sleep 5; done; cat /tmp/llb/done; tail -3 /tmp/llb/build.log
  python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/llb/wheel/*.whl /root/c/*.whl
  if [ ! -d /tmp/ortgpu/onnxruntime ]; then
    cat /root/c/ort.part.* > /root/c/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
    python3 -m pip install -q --no-index --no-deps --target /tmp/ortgpu \
      /root/c/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
  fi
  ln -sfn "$PWD/models" /tmp/site/edge_runtime_models
  export PYTHONPATH=/tmp/ortgpu:/tmp/site:$PWD
  NV=$(python3 -c "import nvidia,os;print(os.path.dirname(nvidia.__path__[0]))" 2>/dev/null)/nvidia
  export LD_LIBRARY_PATH=$(find "$NV" -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u | paste -sd:):${LD_LIBRARY_PATH:-}
  python3 -c "import onnxruntime as o; print('ort', o.__version__, o.get_available_providers())"
  printf 'model:\n  gpu_layers: -1\n  threads: 8\n  providers: [CUDAExecutionProvider, CPUExecutionProvider]\n' > /tmp/gpu.yaml
  for b in ${BUNDLES:-siglip224-qwen0.5b siglip224-qwen1.5b siglip224-gemma270m}; do
    [ -f "/tmp/models/$b/bundle.yaml" ] || python3 -m edge_runtime models bench "$b" "/tmp/models/$b" | tail -1
    timeout 200 python3 -m edge_runtime --config /tmp/gpu.yaml --log-level warning bench --model "/tmp/models/$b" \
      --frames "$FRAMES" --json > "$OUT/bench-$b.json" 2> "$OUT/bench-$b.err" || tail -5 "$OUT/bench-$b.err"
    python3 -c "import json,sys; from edge_runtime.cli.bench import BenchReport, render; print(render(BenchReport(**json.load(open(sys.argv[1])))))" "$OUT/bench-$b.json"
  done
  for b in ${PROFILE_BUNDLES:-siglip224-qwen1.5b siglip224-qwen0.5b siglip224-gemma270m}; do
    [ -f "/tmp/models/$b/bundle.yaml" ] && timeout 120 python3 benchmarks/parallel_profile.py "/tmp/models/$b" \
      /tmp/gpu.yaml ${CPROFILE:---cprofile} 2>&1 | grep -v "^llama_context" | tee "$OUT/profile-$b.txt"
  done
  [ -f /tmp/models/siglip224-gemma270m/bundle.yaml ] && timeout 120 python3 benchmarks/parallel_agreement.py \
    /tmp/models/siglip224-gemma270m /tmp/gpu.yaml | tee "$OUT/agreement.txt"
  nvidia-smi --query-gpu=name,memory.total,power.draw,temperature.gpu --format=csv > "$OUT/gpu.csv" || true ;;
esac
