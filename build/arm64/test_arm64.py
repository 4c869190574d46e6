#!/usr/bin/env python3
"""`make test-arm64`: the daemon on aarch64 code, proven on an x86_64 host by cross-compiling and emulating.

Steps (each timed; the table at the end is what docs/deploy.md quotes):
  tree      an arm64 Debian tree (build/arm64/tree.sh), cached by the script's hash
  wheel     the edge-runtime wheel (pure Python), from a copy of the sources
  resolve   every dependency as an aarch64 wheel from the index (build/arm64/resolve.py); names what has none
  llama     llama-cpp-python cross-compiled for the Orin's CPU (build/arm64/llama_wheel.sh), cached by its inputs
  install   the wheels into a site folder for the tree's Python, cached by the wheels' names
  then under qemu-aarch64: imports, models demo, doctor, infer, run --demo, and the tiny Qwen2.5-VL pair
  (generated on the host with torch + transformers, then `models import` and `infer` emulated).

The cache (default ~/.cache/edge-runtime/arm64, or $EDGE_RUNTIME_CACHE/arm64) keeps one entry of each kind:
a second run with unchanged inputs skips the tree, the cross build and the install.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
import emulated  # noqa: E402
import resolve  # noqa: E402

LLAMA_VERSION = "0.3.36"
TINY_FAMILY = "qwen2.5-vl"


def digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:16]


class Steps:
    """Runs named steps in order, prints each with its wall time, and the table at the end."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, str]] = []

    def __call__(self, name: str, fn: Callable[[], str]) -> None:
        print(f"[{len(self.rows) + 1}] {name} ...", flush=True)
        t0 = time.monotonic()
        try:
            note = fn()
        except (emulated.Failed, resolve.NoWheel, subprocess.CalledProcessError) as exc:
            self.rows.append((name, time.monotonic() - t0, "FAILED"))
            self.table()
            detail = exc.stderr if isinstance(exc, subprocess.CalledProcessError) else ""
            raise SystemExit(f"test-arm64: step '{name}' failed: {exc}\n{detail or ''}") from None
        self.rows.append((name, time.monotonic() - t0, note))
        print(f"    {time.monotonic() - t0:7.1f} s  {note}", flush=True)

    def table(self) -> None:
        print(f"\n{'step':<38} {'wall s':>8}  result")
        for name, secs, note in self.rows:
            print(f"{name:<38} {secs:8.1f}  {note[:150]}")
        print(f"{'total':<38} {sum(r[1] for r in self.rows):8.1f}")


def sh(*cmd: str | Path, timeout: float = 3600, **kw: object) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, check=True, **kw)
    return proc.stdout


def keep_only(cache: Path, kind: str, used: list[Path]) -> None:
    """Drop the other cache entries of one kind (older inputs), so the cache does not grow."""
    for old in cache.glob(f"{kind}-*"):
        if old not in used:
            shutil.rmtree(old, ignore_errors=True)


def product_wheel(out: Path) -> Path:
    """The edge-runtime wheel, built from a copy of what the images copy (setuptools writes build/)."""
    src = out / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("edge_runtime", "models"):
        shutil.copytree(ROOT / name, src / name, ignore=skip)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    sh(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", out, src, cwd=out)
    (wheel,) = out.glob("edge_runtime-*.whl")
    return wheel


def llama_sdist(cache: Path) -> Path:
    sdist = cache / "sdist" / f"llama_cpp_python-{LLAMA_VERSION}.tar.gz"
    if not sdist.is_file():
        sh(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
           "-d", sdist.parent, f"llama-cpp-python=={LLAMA_VERSION}")
    return sdist


def install(site: Path, wheels: list[Path], target: list[str]) -> None:
    """The wheels into `site` for the tree's Python (pip on the host; nothing compiles)."""
    tmp = site.with_name(site.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    sh(sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--no-index",
       "--target", tmp, *target, "--platform", "linux_aarch64", *wheels)
    tmp.rename(site)


def tiny_pair_bundle(emu: emulated.Emulator, work: Path) -> tuple[Path, dict[str, object]]:
    """The tests' tiny Qwen2.5-VL GGUF + mmproj, made on the host (torch + transformers), copied into the
    tree, then imported by the emulated `models import`."""
    from tests.support.tiny_pairs import TINY_SCHEMA, tiny_pair

    pair = tiny_pair(TINY_FAMILY)
    inside = emu.tree / "opt/tiny" / TINY_FAMILY
    inside.mkdir(parents=True, exist_ok=True)
    for src in (pair.language, pair.mmproj):
        shutil.copyfile(src, inside / src.name)
    schema = work / "tiny-schema.json"
    schema.write_text(json.dumps(TINY_SCHEMA))
    bundle = work / "tiny-bundle"
    emu.cli("models", "import", str(inside / pair.language.name), str(inside / pair.mmproj.name), str(bundle),
            "--schema", str(schema), "--prompt-template", pair.template,
            "--image-max-tokens", str(pair.image_max_tokens), timeout=1800)
    return bundle, TINY_SCHEMA


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_cache = Path(os.environ.get("EDGE_RUNTIME_CACHE", Path.home() / ".cache/edge-runtime")) / "arm64"
    ap.add_argument("--cache", type=Path, default=default_cache, help=f"cache folder (default {default_cache})")
    ap.add_argument("--jobs", type=int, default=2, help="parallel compile jobs of the cross build (default 2)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs, bundles) and print its path")
    args = ap.parse_args()
    started = time.monotonic()
    cache = args.cache
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="edge-arm64-"))
    steps = Steps()
    state: dict[str, object] = {}

    tree = cache / f"tree-{digest((HERE / 'tree.sh').read_bytes())}"

    def tree_step() -> str:
        made = sh("bash", HERE / "tree.sh", "--out", tree).strip().splitlines()[-1]
        state["target"] = resolve.target_environment(tree)  # asks the tree's python, emulated
        return made
    steps("tree", tree_step)
    env, glibc = state["target"]  # type: ignore[misc]
    target = resolve.pip_target_args(env, resolve.platform_tags(glibc))

    def wheel_step() -> str:
        state["wheel"] = product_wheel(work / "dist")
        state["sdist"] = llama_sdist(cache)
        return f"{Path(str(state['wheel'])).name}; {Path(str(state['sdist'])).name}"
    steps("wheel + sdist", wheel_step)

    def resolve_step() -> str:
        reqs = resolve.requirements(Path(str(state["wheel"])), Path(str(state["sdist"])), env)
        wheels = resolve.download(reqs, work / "wheelhouse", target)
        state["wheels"] = wheels
        lags = resolve.compare_x86(reqs, env, glibc, resolve.resolved_versions(wheels))
        return (f"{len(reqs)} requirements -> {len(wheels)} aarch64 wheels for CPython {env['python_full_version']}, "
                f"glibc {glibc[0]}.{glibc[1]}; " + ("; ".join(lags) if lags else "same versions as x86_64"))
    steps("resolve (index)", resolve_step)

    for name, (python, libc) in resolve.JETSON_TARGETS.items():
        def jetson_step(python: str = python, libc: tuple[int, int] = libc, name: str = name) -> str:
            jenv = resolve.for_python(env, python)
            reqs = resolve.requirements(Path(str(state["wheel"])), Path(str(state["sdist"])), jenv)
            wheels = resolve.download(reqs, work / f"wheelhouse-{name.replace(' ', '-')}",
                                      resolve.pip_target_args(jenv, resolve.platform_tags(libc)))
            mine = resolve.resolved_versions(list(map(Path, state["wheels"])))  # type: ignore[call-overload]
            other = resolve.resolved_versions(wheels)
            state[f"versions {name}"] = other
            differ = [f"{n} {v} (tree: {mine.get(n, '-')})" for n, v in sorted(other.items()) if mine.get(n) != v]
            return (f"{len(wheels)} aarch64 wheels for CPython {jenv['python_version']}, glibc {libc[0]}.{libc[1]}"
                    + (f"; other versions: {', '.join(differ)}" if differ else ""))
        steps(f"resolve ({name})", jetson_step)

    llama_key = digest((HERE / "llama_wheel.sh").read_bytes(), (HERE / "aarch64-linux-gnu.cmake").read_bytes(),
                       env["python_version"], LLAMA_VERSION)
    llama_dir = cache / f"llama-{llama_key}"

    def llama_step() -> str:
        out = sh("bash", HERE / "llama_wheel.sh", "--tree", tree, "--wheelhouse", llama_dir, "--jobs", str(args.jobs),
                 "--sdist", str(state["sdist"]), "--build-dir", cache / "build-llama", timeout=3 * 3600)
        (wheel,) = llama_dir.glob("llama_cpp_python-*.whl")
        state["llama"] = wheel
        return out.strip().splitlines()[-1]
    steps("llama.cpp cross build", llama_step)

    def install_step() -> str:
        wheels = sorted([*map(Path, state["wheels"]), Path(str(state["llama"]))])  # type: ignore[call-overload]
        site = cache / f"site-{digest(*(w.name for w in wheels), llama_key)}"
        kept = site.is_dir()
        if not kept:
            install(site, wheels, target)
        state["site"] = site
        product = work / "product"
        sh(sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", product, state["wheel"])
        return f"{'kept' if kept else 'installed'} {len(wheels)} wheels in {site.name}; edge-runtime in {product}"
    steps("install", install_step)

    site, product = Path(str(state["site"])), work / "product"
    emu = emulated.Emulator(tree, [product, site], work)
    steps("emulated: imports", lambda: emulated.check_imports(emu, HERE / "resolve.py", [product, site]))

    demo = work / "demo-bundle"
    def demo_step() -> str:
        made = json.loads(emu.cli("models", "demo", str(demo), timeout=3600).stdout)
        return f"{made['kind']} bundle, {made['quantization']}, {made['image_tokens']} image tokens"
    steps("emulated: models demo", demo_step)
    from edge_runtime.core.bundle.manifest import load_bundle
    schema = load_bundle(demo).manifest.verdict_schema

    port = emulated.free_port()
    config = emulated.write_config(work / "edge.yaml", work / "data", port)
    steps("emulated: doctor", lambda: emulated.check_doctor(emu, config, demo))

    import cv2

    from edge_runtime.core.samples import part_image
    image = work / "part.jpg"
    cv2.imwrite(str(image), part_image(1, defect=True))
    steps("emulated: infer (demo)", lambda: emulated.check_infer(emu, image, demo, schema))
    steps("emulated: run --demo", lambda: emulated.check_run_demo(emu, config, port, schema, work / "daemon.log"))

    def jetson_versions_step() -> str:
        """The demo inference again with the versions a JetPack 6 Python gets (older onnxruntime, numpy, ...),
        installed for the tree's Python: what the index serves a Jetson, run as aarch64 code."""
        pins = dict(state["versions JetPack 6"])  # type: ignore[call-overload]
        reqs = resolve.requirements(Path(str(state["wheel"])), Path(str(state["sdist"])), env)
        wheels = sorted([*resolve.download(reqs, work / "wheelhouse-jp6-pins", target, pins=pins),
                         Path(str(state["llama"]))])
        jsite = cache / f"site-{digest(*(w.name for w in wheels), llama_key)}"
        if not jsite.is_dir():
            install(jsite, wheels, target)
        state["site-jp6"] = jsite
        versions = resolve.resolved_versions(wheels)
        jemu = emulated.Emulator(tree, [product, jsite], work)
        found = emulated.check_infer(jemu, image, demo, schema)
        return f"onnxruntime {versions['onnxruntime']}, numpy {versions['numpy']}: {found}"
    steps("emulated: infer (JetPack 6 versions)", jetson_versions_step)

    def tiny_import() -> str:
        bundle, tiny_schema = tiny_pair_bundle(emu, work)
        state["tiny"], state["tiny_schema"] = bundle, tiny_schema
        return f"{TINY_FAMILY} pair imported to {bundle.name}"
    steps("tiny pair: make + import", tiny_import)
    steps("emulated: infer (tiny pair)", lambda: emulated.check_infer(
        emu, image, Path(str(state["tiny"])), state["tiny_schema"]))  # type: ignore[arg-type]

    for kind, used in (("tree", [tree]), ("llama", [llama_dir]), ("site", [site, state["site-jp6"]])):
        keep_only(cache, kind, used)  # type: ignore[arg-type]
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    steps.table()
    print(f"{'whole run (with imports, cleanup)':<38} {time.monotonic() - started:8.1f}")
    if args.keep:
        print(f"work folder: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
