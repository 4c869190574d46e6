#!/usr/bin/env bash
# Make an arm64 Debian tree to run aarch64 programs under qemu-user on an x86_64 host (no binfmt needed):
#
#   build/arm64/tree.sh --out ~/.cache/edge-runtime/arm64/tree       # bookworm: Python 3.11, glibc 2.36
#   qemu-aarch64 -L TREE TREE/usr/bin/python3 -c 'import platform; print(platform.machine())'
#   build/arm64/tree.sh --out DIR --dry-run                           # print what would run
#
# The packages are extracted, not configured (mmdebstrap --variant=extract): the Python interpreter, its
# headers and libpython (what a cross build of an extension module needs), and the C/C++ runtime that
# llama.cpp and the wheels link against. Idempotent: an existing tree with the same inputs is kept.
set -euo pipefail

SUITE=bookworm
MIRROR=http://deb.debian.org/debian
# python3 for the daemon, libpython3-dev for a cross build's headers and libpython, libgomp1 and
# libstdc++6 for llama.cpp (OpenMP) and the C++ wheels (ONNX Runtime, OpenCV).
PACKAGES=python3,libpython3-dev,libgomp1,libstdc++6
OUT=""
DRY_RUN=0

usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "error: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=${2:?}; shift 2 ;;
    --suite) SUITE=${2:?}; shift 2 ;;
    --mirror) MIRROR=${2:?}; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$OUT" ] || die "--out DIR is required (see --help)"

STAMP="$OUT/.edge-runtime-tree"
WANT="$SUITE $MIRROR $PACKAGES"
if [ "$DRY_RUN" = 0 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  echo "tree: kept $OUT ($WANT)"
  exit 0
fi

run() {
  echo "+ $*"
  if [ "$DRY_RUN" = 0 ]; then "$@"; fi
}

echo "[1/2] check the tools"
if [ "$DRY_RUN" = 0 ]; then
  command -v mmdebstrap >/dev/null || die "step 1/2: mmdebstrap not found (apt-get install mmdebstrap)"
  command -v qemu-aarch64 >/dev/null || die "step 1/2: qemu-aarch64 not found (apt-get install qemu-user)"
fi

echo "[2/2] extract $PACKAGES ($SUITE, arm64) into $OUT"
run rm -rf "$OUT.tmp"
run mmdebstrap --quiet --arch=arm64 --variant=extract --include="$PACKAGES" "$SUITE" "$OUT.tmp" "$MIRROR" \
  || die "step 2/2: mmdebstrap failed (is $MIRROR reachable?)"
if [ "$DRY_RUN" = 0 ]; then
  echo "$WANT" > "$OUT.tmp/.edge-runtime-tree"
  rm -rf "$OUT"
  mv "$OUT.tmp" "$OUT"
  version=$(qemu-aarch64 -L "$OUT" "$OUT/usr/bin/python3" -c 'import platform; print(platform.python_version(), platform.machine(), *platform.libc_ver())') \
    || die "step 2/2: the tree's python3 does not start under qemu-aarch64"
  echo "tree: $OUT (Python $version)"
fi
