#!/usr/bin/env bash
# Install the ONNX Runtime build with GPU providers that matches this device, and verify it.
#
#   build/onnxruntime_gpu.sh                       # detect JetPack from /etc/nv_tegra_release
#   build/onnxruntime_gpu.sh --jetpack 6 --index-url https://my.mirror/jp6/cu126
#   build/onnxruntime_gpu.sh --x86                 # onnxruntime-gpu from the default index
#   build/onnxruntime_gpu.sh --dry-run             # print what would run
#
# onnxruntime and onnxruntime-gpu overwrite each other's files: both are removed first, then only the
# GPU build is installed. On Jetson the wheel comes from NVIDIA's JetPack index, not PyPI.
set -euo pipefail

JETPACK=""
INDEX_URL=""
X86=0
DRY_RUN=0
PYTHON=${PYTHON:-python3}
RELEASE_FILE=${RELEASE_FILE:-/etc/nv_tegra_release}

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "error: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --jetpack) JETPACK=${2:?}; shift 2 ;;
    --index-url) INDEX_URL=${2:?}; shift 2 ;;
    --x86) X86=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

run() {
  echo "+ $*"
  if [ "$DRY_RUN" = 0 ]; then "$@"; fi
}

echo "[1/4] choose the wheel"
if [ "$X86" = 1 ]; then
  PACKAGE=onnxruntime-gpu
  INDEX_ARGS=()
  [ -n "$INDEX_URL" ] && INDEX_ARGS=(--index-url "$INDEX_URL")
else
  if [ -z "$JETPACK" ]; then
    [ -r "$RELEASE_FILE" ] || die "step 1/4: $RELEASE_FILE not found: not a Jetson? use --x86 or --jetpack N"
    L4T=$(sed -n 's/^# R\([0-9]*\) (release), REVISION: \([0-9.]*\).*/\1.\2/p' "$RELEASE_FILE")
    case "$L4T" in
      36.*) JETPACK=6 ;;
      35.*) JETPACK=5 ;;
      *) die "step 1/4: unsupported L4T release '$L4T' (JetPack 5 or 6 needed)" ;;
    esac
    echo "L4T $L4T -> JetPack $JETPACK"
  fi
  case "$JETPACK" in
    6) DEFAULT_INDEX=https://pypi.jetson-ai-lab.io/jp6/cu126 ;;
    5) DEFAULT_INDEX=https://pypi.jetson-ai-lab.io/jp5/cu114 ;;
    *) die "step 1/4: --jetpack must be 5 or 6, got '$JETPACK'" ;;
  esac
  PACKAGE=onnxruntime-gpu
  INDEX_ARGS=(--index-url "${INDEX_URL:-$DEFAULT_INDEX}")
fi

echo "[2/4] remove any ONNX Runtime (both packages share files)"
run "$PYTHON" -m pip uninstall -y onnxruntime onnxruntime-gpu

echo "[3/4] install $PACKAGE"
run "$PYTHON" -m pip install --no-cache-dir "${INDEX_ARGS[@]}" "$PACKAGE" \
  || die "step 3/4: installing $PACKAGE failed (is the index URL reachable from this device?)"

echo "[4/4] verify the providers load"
run "$PYTHON" -c "import onnxruntime as o, sys; p = o.get_available_providers(); print(p); sys.exit(0 if 'CUDAExecutionProvider' in p else 1)" \
  || die "step 4/4: CUDAExecutionProvider is not available; check CUDA/cuDNN versions against the wheel"
