#!/usr/bin/env bash
# Build a llama-cpp-python wheel with CUDA for a target GPU into a wheelhouse.
#
#   build/llama_cpp_cuda.sh --target orin --wheelhouse ./wheelhouse       # Jetson Orin (sm_87)
#   build/llama_cpp_cuda.sh --target xavier                                # Jetson Xavier (sm_72)
#   build/llama_cpp_cuda.sh --target x86 --archs "86;89;90"                # desktop/datacenter GPUs
#   build/llama_cpp_cuda.sh --target orin --dry-run                        # print what would run
#
# Idempotent: an existing wheel for the same version and architectures is kept unless --force.
set -euo pipefail

VERSION=0.3.36
TARGET=orin
ARCHS=""
WHEELHOUSE=./wheelhouse
SDIST=""
JOBS=""
DRY_RUN=0
FORCE=0

usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "error: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --target) TARGET=${2:?}; shift 2 ;;
    --archs) ARCHS=${2:?}; shift 2 ;;
    --version) VERSION=${2:?}; shift 2 ;;
    --wheelhouse) WHEELHOUSE=${2:?}; shift 2 ;;
    --sdist) SDIST=${2:?}; shift 2 ;;
    --jobs) JOBS=${2:?}; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --force) FORCE=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

# The CPU backend's instruction sets (what runs on the CPU: layers not offloaded, sampling, the image
# preprocessing): with GGML_NATIVE=OFF ggml would build for plain armv8-a. Orin's Cortex-A78AE has the
# dot product and FP16 (build/arm64/llama_wheel.sh cross-builds and emulates the same flags); Xavier's
# Carmel cores have FP16 but no dot product (`doctor` fails a build that needs what the CPU lacks).
case "$TARGET" in
  orin) ARCHS=${ARCHS:-87}; JETSON=1; CPU_ARCH=armv8.2-a+dotprod+fp16 ;;
  xavier) ARCHS=${ARCHS:-72}; JETSON=1; CPU_ARCH=armv8.2-a+fp16 ;;
  x86) [ -n "$ARCHS" ] || die "--target x86 needs --archs, e.g. \"86;89;90\""; JETSON=0; CPU_ARCH="" ;;
  *) die "unknown --target '$TARGET' (orin, xavier or x86)" ;;
esac
[[ "$ARCHS" =~ ^[0-9]+(\;[0-9]+)*$ ]] || die "--archs must look like 87 or \"86;89;90\", got '$ARCHS'"

CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$ARCHS -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF"
if [ "$JETSON" = 1 ]; then
  # Jetson: no virtual memory management in the integrated GPU driver; unified memory for big contexts.
  CMAKE_ARGS="$CMAKE_ARGS -DGGML_CUDA_NO_VMM=ON -DGGML_CPU_ARM_ARCH=$CPU_ARCH"
fi
JOBS=${JOBS:-$(nproc)}
STAMP="$WHEELHOUSE/.llama_cpp_python-$VERSION-cuda-${ARCHS//;/_}"

run() {
  echo "+ $*"
  if [ "$DRY_RUN" = 0 ]; then "$@"; fi
}
step() { echo "[$1] $2"; }

if [ -f "$STAMP" ] && [ "$FORCE" = 0 ] && [ "$DRY_RUN" = 0 ]; then
  echo "already built: $(cat "$STAMP") (use --force to rebuild)"
  exit 0
fi

step 1/3 "check the toolchain"
if [ "$DRY_RUN" = 0 ]; then
  command -v nvcc >/dev/null || die "step 1/3: nvcc not found; install the CUDA toolkit (JetPack includes it) and add /usr/local/cuda/bin to PATH"
  command -v cmake >/dev/null || die "step 1/3: cmake not found (pip install cmake)"
fi
run mkdir -p "$WHEELHOUSE"

step 2/3 "get the llama-cpp-python $VERSION sdist"
if [ -z "$SDIST" ]; then
  run python3 -m pip download --no-deps --no-binary :all: --no-build-isolation -d "$WHEELHOUSE" "llama-cpp-python==$VERSION"
  SDIST="$WHEELHOUSE/llama_cpp_python-$VERSION.tar.gz"
fi

step 3/3 "build the wheel (CUDA archs $ARCHS, $JOBS jobs)"
run env CMAKE_ARGS="$CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
  python3 -m pip wheel --no-deps --no-build-isolation -w "$WHEELHOUSE" "$SDIST" \
  || die "step 3/3: the CUDA build failed (see the compiler output above)"
if [ "$DRY_RUN" = 0 ]; then
  ls "$WHEELHOUSE"/llama_cpp_python-"$VERSION"-*.whl > "$STAMP"
  echo "built: $(cat "$STAMP")"
fi
