#!/usr/bin/env bash
# Cross-compile llama-cpp-python (the llama.cpp it vendors, CPU backend) into an aarch64 wheel on an x86_64 host.
#
#   build/arm64/llama_wheel.sh --tree TREE --wheelhouse DIR             # Jetson Orin CPU (Cortex-A78AE)
#   build/arm64/llama_wheel.sh --tree TREE --arch armv8-a --wheelhouse DIR   # any 64-bit ARM core
#   build/arm64/llama_wheel.sh --tree TREE --wheelhouse DIR --dry-run   # print what would run
#
# TREE is an arm64 Debian tree (build/arm64/tree.sh): the wheel is built for its Python. Needs Debian's
# crossbuild-essential-arm64, cmake and ninja; scikit-build-core comes in a venv of its own (--buildenv).
# Idempotent: an existing wheel of the same version in DIR is kept unless --force.
set -euo pipefail

VERSION=0.3.36
SKBUILD=scikit-build-core==1.1.2
# Jetson Orin: Cortex-A78AE cores, Armv8.2-A with the dot-product and half-precision extensions (no SVE,
# no i8mm). ggml turns this into -march=...; GGML_NATIVE=OFF, since the build host is not the target.
ARCH=armv8.2-a+dotprod+fp16
TREE=""
WHEELHOUSE=./wheelhouse
BUILDENV=""
BUILD_DIR=""
SDIST=""
JOBS=2
DRY_RUN=0
FORCE=0
HERE=$(cd "$(dirname "$0")" && pwd)

usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "error: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --tree) TREE=${2:?}; shift 2 ;;
    --wheelhouse) WHEELHOUSE=${2:?}; shift 2 ;;
    --arch) ARCH=${2:?}; shift 2 ;;
    --version) VERSION=${2:?}; shift 2 ;;
    --sdist) SDIST=${2:?}; shift 2 ;;
    --buildenv) BUILDENV=${2:?}; shift 2 ;;
    --build-dir) BUILD_DIR=${2:?}; shift 2 ;;
    --jobs) JOBS=${2:?}; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --force) FORCE=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$TREE" ] || die "--tree TREE is required (make one with build/arm64/tree.sh)"
[[ "$ARCH" =~ ^armv[0-9.]+-a(\+[a-z0-9]+)*$ ]] || die "--arch must look like armv8.2-a+dotprod+fp16, got '$ARCH'"
[[ "$JOBS" =~ ^[0-9]+$ ]] || die "--jobs must be a number, got '$JOBS'"
BUILDENV=${BUILDENV:-$WHEELHOUSE/.buildenv}
BUILD_DIR=${BUILD_DIR:-$WHEELHOUSE/.build}
WHEEL="$WHEELHOUSE/llama_cpp_python-$VERSION-py3-none-linux_aarch64.whl"

run() {
  echo "+ $*"
  if [ "$DRY_RUN" = 0 ]; then "$@"; fi
}

if [ -f "$WHEEL" ] && [ "$FORCE" = 0 ] && [ "$DRY_RUN" = 0 ]; then
  echo "already built: $WHEEL (use --force to rebuild)"
  exit 0
fi

echo "[1/5] check the toolchain and the tree"
# The tree's Python decides the headers and libpython handed to CMake (llama-cpp-python itself loads
# its libraries with ctypes and links no libpython; an extension module built this way would need them).
PY=$(basename "$(readlink "$TREE/usr/bin/python3" || echo python3.11)")
PY_INCLUDE="$TREE/usr/include/$PY"
PY_LIBRARY="$TREE/usr/lib/aarch64-linux-gnu/lib$PY.so"
if [ "$DRY_RUN" = 0 ]; then
  for tool in aarch64-linux-gnu-gcc aarch64-linux-gnu-g++ aarch64-linux-gnu-readelf cmake; do
    command -v "$tool" >/dev/null || die "step 1/5: $tool not found (apt-get install crossbuild-essential-arm64 cmake)"
  done
  [ -f "$PY_INCLUDE/Python.h" ] || die "step 1/5: $PY_INCLUDE/Python.h not found: is $TREE an arm64 tree from build/arm64/tree.sh?"
  [ -e "$PY_LIBRARY" ] || die "step 1/5: $PY_LIBRARY not found (the tree needs libpython3-dev)"
fi

echo "[2/5] a build venv with $SKBUILD"
if [ "$DRY_RUN" = 1 ] || ! "$BUILDENV/bin/python" -c 'import scikit_build_core' 2>/dev/null; then
  run python3 -m venv "$BUILDENV"
  run "$BUILDENV/bin/python" -m pip install --quiet "$SKBUILD" ninja \
    || die "step 2/5: could not install $SKBUILD into $BUILDENV"
fi

echo "[3/5] get the llama-cpp-python $VERSION sdist"
if [ -z "$SDIST" ]; then
  SDIST="$WHEELHOUSE/llama_cpp_python-$VERSION.tar.gz"
  if [ ! -f "$SDIST" ]; then
    run mkdir -p "$WHEELHOUSE"
    run "$BUILDENV/bin/python" -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
      -d "$WHEELHOUSE" "llama-cpp-python==$VERSION" || die "step 3/5: downloading the sdist failed"
  fi
fi
# Built from an unpacked copy that stays, with the CMake build folder beside it: a build stopped half-way
# (or a second one with other flags) goes on from the objects already compiled.
SRC="$BUILD_DIR/llama_cpp_python-$VERSION"
if [ "$DRY_RUN" = 1 ] || [ ! -f "$SRC/pyproject.toml" ]; then
  run mkdir -p "$BUILD_DIR"
  run tar -xzf "$SDIST" -C "$BUILD_DIR"
fi

echo "[4/5] cross-compile (-march=$ARCH, $JOBS jobs, nice 10)"
# _PYTHON_HOST_PLATFORM makes scikit-build-core tag the wheel linux_aarch64; python-hints=false keeps the
# x86 host's Python out of CMake, which gets the tree's headers and libpython instead.
CMAKE_ARGS="-DCMAKE_TOOLCHAIN_FILE=$HERE/aarch64-linux-gnu.cmake -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=$ARCH"
CMAKE_ARGS="$CMAKE_ARGS -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF"
for prefix in Python Python3; do
  CMAKE_ARGS="$CMAKE_ARGS -D${prefix}_INCLUDE_DIR=$PY_INCLUDE -D${prefix}_LIBRARY=$PY_LIBRARY"
done
run env CMAKE_ARGS="$CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" _PYTHON_HOST_PLATFORM=linux-aarch64 \
  nice -n 10 "$BUILDENV/bin/python" -m pip wheel --no-deps --no-build-isolation \
  -C cmake.python-hints=false -C build-dir="$BUILD_DIR/cmake" -w "$WHEELHOUSE.tmp" "$SRC" \
  || die "step 4/5: the cross build failed (see the compiler output above)"

echo "[5/5] check the wheel: tag, and every library aarch64 with its needs met by the wheel or the tree"
if [ "$DRY_RUN" = 0 ]; then
  built="$WHEELHOUSE.tmp/$(basename "$WHEEL")"
  [ -f "$built" ] || die "step 5/5: expected $(basename "$WHEEL"), got: $(ls "$WHEELHOUSE.tmp")"
  check=$(mktemp -d)
  trap 'rm -rf "$check"' EXIT
  python3 -m zipfile -e "$built" "$check"
  mapfile -t libs < <(find "$check" -name '*.so*' -type f)
  [ "${#libs[@]}" -gt 0 ] || die "step 5/5: the wheel holds no shared library"
  for lib in "${libs[@]}"; do
    machine=$(aarch64-linux-gnu-readelf -h "$lib" | sed -n 's/^ *Machine: *//p')
    [ "$machine" = AArch64 ] || die "step 5/5: $(basename "$lib") is built for '$machine', not AArch64"
    for needed in $(aarch64-linux-gnu-readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      [ -e "$(dirname "$lib")/$needed" ] || [ -e "$TREE/usr/lib/aarch64-linux-gnu/$needed" ] \
        || [ -e "$TREE/lib/aarch64-linux-gnu/$needed" ] \
        || die "step 5/5: $(basename "$lib") needs $needed, which neither the wheel nor the tree has"
    done
  done
  mkdir -p "$WHEELHOUSE"
  mv "$built" "$WHEEL"
  rm -rf "$WHEELHOUSE.tmp"
  echo "built: $WHEEL (${#libs[@]} aarch64 libraries)"
fi
