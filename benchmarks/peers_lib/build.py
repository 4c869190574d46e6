"""llama-server built from the llama.cpp that our llama-cpp-python vendors (its sdist's vendor/llama.cpp).

The sdist comes from pip's cache (`pip download --no-deps --no-binary :all:`) or a path. Builds are
cached under `~/.cache/edge-runtime/llama-server/<sdist sha256[:16]>[-cuda<arch>]/` (`EDGE_RUNTIME_CACHE`
moves the root): a new llama-cpp-python pin makes a new build, an unchanged one costs nothing.
Only the `llama-server` target is built (the CPU build takes ~10 minutes on 2 cores). The Web UI is
left out (LLAMA_BUILD_UI/LLAMA_USE_PREBUILT_UI off: no npm, no download), so are HTTPS and the tests.

    python benchmarks/peers_lib/build.py [--sdist FILE] [--cuda-arch 90] [--jobs N]   # prints the binary's path
    python benchmarks/peers_lib/build.py trim OUT.tar.gz [--sdist FILE]   # the few MB a device build needs
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"
VENDOR = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
               "-DLLAMA_OPENSSL=OFF", "-DBUILD_SHARED_LIBS=OFF"]
# What a server build does not read: dropped from the trimmed source a device machine gets carried.
_TRIM_DIRS = ("models/", "docs/", "media/", "benches/", "tests/", "examples/", "gguf-py/", "conversion/",
              "pocs/", "tools/ui/src/", "tools/ui/static/", "tools/ui/tests/", "tools/ui/scripts/",
              "tools/server/public", "tools/server/tests/", "tools/server/webui", "requirements/", "ci/",
              "ggml/src/ggml-vulkan/", "ggml/src/ggml-sycl/", "ggml/src/ggml-metal/", "ggml/src/ggml-opencl/",
              "ggml/src/ggml-cann/", "ggml/src/ggml-musa/", "ggml/src/ggml-hip/", "ggml/src/ggml-webgpu/",
              "ggml/src/ggml-zdnn/", "ggml/src/ggml-hexagon/", "ggml/src/ggml-openvino/", "ggml/src/ggml-et/", ".git")


def cache_root() -> Path:
    return Path(os.environ.get("EDGE_RUNTIME_CACHE", Path.home() / ".cache" / "edge-runtime"))


def find_sdist(explicit: Path | None = None) -> Path:
    """The llama-cpp-python sdist: the given path, one already kept in the cache, or pip's download."""
    if explicit is not None:
        return explicit
    kept = cache_root() / "sdist" / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if kept.is_file():
        return kept
    kept.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={LLAMA_CPP_PYTHON}",
                        "--no-deps", "--no-binary", ":all:", "-d", tmp, "-q"], check=True)
        (got,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        shutil.copyfile(got, kept.with_suffix(".part"))
        os.replace(kept.with_suffix(".part"), kept)
    return kept


def sdist_key(sdist: Path) -> str:
    h = hashlib.sha256()
    with open(sdist, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def _unpack_vendor(sdist: Path, dest: Path) -> None:
    """vendor/llama.cpp of the sdist into `dest` (whether it came whole or trimmed)."""
    stage = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(stage, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(VENDOR)]
        if not members:
            raise SystemExit(f"{sdist} has no {VENDOR}")
        tar.extractall(stage, members=members, filter="data")
    os.replace(stage / VENDOR, dest)
    shutil.rmtree(stage)


def build_server(sdist: Path | None = None, cuda_arch: str | None = None, jobs: int | None = None,
                 log: Path | None = None, cmake_args: list[str] | None = None) -> Path:
    """The cached llama-server binary, built first when missing (one builder at a time per key).
    `cmake_args` are the ones our llama-cpp-python was built with (the Makefile's LLAMA_CMAKE_ARGS)."""
    sdist = find_sdist(sdist)
    extra = list(cmake_args or [])
    key = sdist_key(sdist) + (f"-cuda{cuda_arch}" if cuda_arch else "")
    if extra:
        key += "-" + hashlib.sha256(" ".join(extra).encode()).hexdigest()[:8]
    root = cache_root() / "llama-server" / key
    binary = root / "build" / "bin" / "llama-server"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.is_file() and (root / "done").is_file():
            return binary
        if not (root / "src" / "CMakeLists.txt").is_file():
            shutil.rmtree(root / "src", ignore_errors=True)
            _unpack_vendor(sdist, root / "src")
        flags = [*CMAKE_FLAGS, *extra]
        if cuda_arch:
            flags += ["-DGGML_CUDA=on", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}"]
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        out = open(log or root / "build.log", "a")
        with out:
            subprocess.run(["cmake", "-S", str(root / "src"), "-B", str(root / "build"), *generator, *flags],
                           check=True, stdout=out, stderr=subprocess.STDOUT)
            subprocess.run(["cmake", "--build", str(root / "build"), "--target", "llama-server",
                            "-j", str(jobs or os.cpu_count() or 1)], check=True, stdout=out, stderr=subprocess.STDOUT)
        (root / "done").write_text(str(binary))
    return binary


def trim(sdist: Path, out: Path) -> Path:
    """The sdist less what a llama-server (or llama-cpp-python) build never reads: a few MB to carry."""
    top = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/"
    with tarfile.open(sdist) as src, tarfile.open(out, "w:gz") as dst:
        for m in src.getmembers():
            rel = m.name[len(VENDOR):] if m.name.startswith(VENDOR) else None
            if m.name.startswith(top + ".git") or "/.git/" in m.name or m.name.endswith("/.git"):
                continue
            if rel is not None and any(rel.startswith(d) for d in _TRIM_DIRS):
                continue
            dst.addfile(m, src.extractfile(m) if m.isfile() else None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", nargs="?", choices=("build", "trim"), default="build")
    ap.add_argument("out", nargs="?", type=Path, help="trim: the tarball to write")
    ap.add_argument("--sdist", type=Path)
    ap.add_argument("--cuda-arch", help="build with CUDA for this architecture (90 = H200, 87 = Orin)")
    ap.add_argument("--jobs", type=int)
    ap.add_argument("--cmake-args", default=os.environ.get("LLAMA_CMAKE_ARGS", ""),
                    help="more cmake flags, as our llama-cpp-python got them (default: $LLAMA_CMAKE_ARGS)")
    args = ap.parse_args()
    if args.action == "trim":
        if args.out is None:
            ap.error("trim needs OUT.tar.gz")
        print(trim(find_sdist(args.sdist), args.out))
    else:
        print(build_server(args.sdist, args.cuda_arch, args.jobs, cmake_args=args.cmake_args.split()))


if __name__ == "__main__":
    main()
