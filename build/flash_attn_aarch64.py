#!/usr/bin/env python3
"""Build a flash-attn wheel for Jetson Orin (aarch64, sm_87), offline-safe.

Upstream's setup.py (2.8.x) builds sm_80/90/100/120 only and, unless FLASH_ATTENTION_FORCE_BUILD is
set, tries to download a prebuilt wheel from GitHub (none exists for aarch64, and devices in
factories have no internet). This script fetches the sdist from the package index, patches setup.py
so that sm_87 is compiled and no download is ever attempted, sizes parallel jobs for the Jetson's
shared memory, and builds a wheel. The patch is idempotent and refuses an upstream file whose shape
changed (it names the anchor it could not find).

    build/flash_attn_aarch64.py --out wheelhouse            # fetch, patch, build
    build/flash_attn_aarch64.py --sdist flash_attn-2.8.3.post2.tar.gz --patch-only --out /tmp/fa
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import urllib.parse
import urllib.request
from pathlib import Path

MARKER = "# edge-runtime patch: sm_87, offline build"
# (anchor found in upstream setup.py, replacement). Each must match exactly once.
REPLACEMENTS = [
    ('FORCE_BUILD = os.getenv("FLASH_ATTENTION_FORCE_BUILD", "FALSE") == "TRUE"',
     'FORCE_BUILD = True  # edge-runtime: never download prebuilt wheels (offline devices)'),
    ('return os.getenv("FLASH_ATTN_CUDA_ARCHS", "80;90;100;120").split(";")',
     'return os.getenv("FLASH_ATTN_CUDA_ARCHS", "87").split(";")  # edge-runtime: Jetson Orin default'),
    ('    if "80" in cuda_archs():\n'
     '        cc_flag.append("-gencode")\n'
     '        cc_flag.append("arch=compute_80,code=sm_80")\n',
     '    if "80" in cuda_archs():\n'
     '        cc_flag.append("-gencode")\n'
     '        cc_flag.append("arch=compute_80,code=sm_80")\n'
     '    if "87" in cuda_archs():  # edge-runtime: Jetson Orin (Ampere, sm_87)\n'
     '        cc_flag.append("-gencode")\n'
     '        cc_flag.append("arch=compute_87,code=sm_87")\n'),
]


class PatchError(RuntimeError):
    pass


def patch_setup_py(text: str) -> tuple[str, bool]:
    """Return (patched text, changed). Already patched: verified and returned unchanged."""
    if MARKER in text:
        missing = [new.splitlines()[0] for _, new in REPLACEMENTS if new not in text]
        if missing:
            raise PatchError(f"setup.py carries the patch marker but lacks: {missing[0]!r}")
        return text, False
    for anchor, new in REPLACEMENTS:
        count = text.count(anchor)
        if count != 1:
            raise PatchError(f"upstream setup.py changed shape: expected this line once, found it {count} "
                             f"times: {anchor.splitlines()[0].strip()!r}")
        text = text.replace(anchor, new)
    return MARKER + "\n" + text, True


def fetch_sdist(version: str | None, index: str, dest: Path) -> Path:
    """Download the sdist from the package index's JSON API (no torch needed, unlike pip download)."""
    url = f"{index.rstrip('/')}/flash-attn/json"
    with urllib.request.urlopen(url, timeout=60) as resp:
        meta = json.load(resp)
    files = meta["urls"] if version in (None, meta["info"]["version"]) else meta.get("releases", {}).get(version, [])
    sdist = next((u for u in files if u["packagetype"] == "sdist"), None)
    if sdist is None:
        raise SystemExit(f"no sdist for flash-attn {version or meta['info']['version']} on {index}")
    target = dest / sdist["filename"]
    if not target.exists():
        with urllib.request.urlopen(urllib.parse.urljoin(url, sdist["url"]), timeout=300) as resp:
            data = resp.read()
        if hashlib.sha256(data).hexdigest() != sdist["digests"]["sha256"]:
            raise SystemExit(f"{sdist['filename']}: sha256 does not match the index")
        target.write_bytes(data)
    return target


def parallel_jobs(mem_per_job_gb: float = 9.0) -> int:
    """Jetson RAM is shared with the GPU: one nvcc job per ~9 GB available, at most half the cores."""
    try:
        avail_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                        if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        avail_kb = 8 * 1024 * 1024
    return max(1, min((os.cpu_count() or 2) // 2, int(avail_kb / 1024 / 1024 / mem_per_job_gb)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", help="flash-attn version (default: the index's latest)")
    ap.add_argument("--sdist", type=Path, help="use this sdist instead of downloading one")
    ap.add_argument("--index", default="https://pypi.org/pypi", help="package index JSON API base")
    ap.add_argument("--archs", default="87", help="CUDA architectures, ';'-separated (default 87 = Orin)")
    ap.add_argument("--jobs", type=int, help="parallel compile jobs (default: from free memory)")
    ap.add_argument("--out", type=Path, default=Path("wheelhouse"), help="where the wheel goes")
    ap.add_argument("--patch-only", action="store_true", help="fetch and patch, do not compile")
    ap.add_argument("--dry-run", action="store_true", help="print the build command instead of running it")
    args = ap.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    try:
        sdist = args.sdist or fetch_sdist(args.version, args.index, args.out)
        print(f"[1/3] sdist: {sdist}")
        with tarfile.open(sdist) as tar:
            top = tar.getnames()[0].split("/")[0]
            tar.extractall(args.out, filter="data")
        src = args.out / top
        setup_py = src / "setup.py"
        patched, changed = patch_setup_py(setup_py.read_text())
        setup_py.write_text(patched)
        print(f"[2/3] patched {setup_py}" if changed else f"[2/3] {setup_py} already patched")
    except PatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    jobs = args.jobs or parallel_jobs()
    env = {"FLASH_ATTN_CUDA_ARCHS": args.archs, "FLASH_ATTENTION_FORCE_BUILD": "TRUE", "MAX_JOBS": str(jobs),
           "NVCC_THREADS": "2"}
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(args.out.resolve()),
           str(src.resolve())]
    print("[3/3] " + " ".join(f"{k}={v}" for k, v in env.items()) + " " + " ".join(cmd))
    if args.patch_only or args.dry_run:
        return 0
    result = subprocess.run(cmd, env={**os.environ, **env})
    if result.returncode != 0:
        print("error: step 3 (compile) failed; see the compiler output above", file=sys.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
