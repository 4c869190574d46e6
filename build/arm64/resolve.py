#!/usr/bin/env python3
"""The daemon's dependency set as aarch64 wheels from the package index, for the Python of an arm64 tree.

`pip download --only-binary=:all: --platform manylinux...aarch64` for the tree's Python and every manylinux
tag its glibc allows; a package with no aarch64 wheel fails the run by name. llama-cpp-python is left out
(the index has only its sdist: build/arm64/llama_wheel.sh cross-compiles it) but its own requirements are
in. pip evaluates environment markers for the machine it runs on, so the top-level markers are evaluated
here for the tree's interpreter, and `check_installed` re-checks every requirement under emulation.

    build/arm64/resolve.py --tree TREE --wheel dist/edge_runtime-0.1.0-py3-none-any.whl \\
        --llama-sdist llama_cpp_python-0.3.36.tar.gz --out wheelhouse   # then: --compare-x86
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement

BUILT_HERE = "llama-cpp-python"  # sdist-only on the index: cross-compiled, not downloaded
EXTRAS = ("lineio",)  # what the images install: edge-runtime[lineio]

# The marker environment of the tree's interpreter (packaging.markers.default_environment, by hand: the
# tree has no packaging), printed as JSON, plus glibc's version for the manylinux tags.
_TARGET_ENV = """
import json, os, platform, sys
impl = sys.implementation
print(json.dumps({"env": {
    "implementation_name": impl.name,
    "implementation_version": "{0.major}.{0.minor}.{0.micro}".format(impl.version),
    "os_name": os.name, "platform_machine": platform.machine(), "platform_release": platform.release(),
    "platform_system": platform.system(), "platform_version": platform.version(),
    "python_full_version": platform.python_version(),
    "platform_python_implementation": platform.python_implementation(),
    "python_version": ".".join(platform.python_version_tuple()[:2]), "sys_platform": sys.platform},
    "glibc": platform.libc_ver()[1]}))
"""


# The Pythons the Jetson images run (docs/deploy.md): JetPack 6 is Ubuntu 22.04 (CPython 3.10, glibc 2.35);
# Dockerfile.jp5 puts CPython 3.10 on JetPack 5's Ubuntu 20.04 (glibc 2.31). Resolved (not installed) too.
JETSON_TARGETS = {"JetPack 6": ("3.10.12", (2, 35)), "JetPack 5 image": ("3.10.12", (2, 31))}


class NoWheel(RuntimeError):
    """Packages without a wheel for the target, by name."""

    def __init__(self, names: list[str], detail: str) -> None:
        self.names = names
        super().__init__(f"no aarch64 wheel on the index for: {', '.join(names)}\n{detail}")


def emulated(tree: Path) -> list[str]:
    """The command prefix that runs the tree's python3 under qemu-user."""
    return ["qemu-aarch64", "-L", str(tree), str(tree / "usr/bin/python3")]


def target_environment(tree: Path) -> tuple[dict[str, str], tuple[int, int]]:
    """(marker environment, glibc (major, minor)) of the tree's interpreter, asked under emulation."""
    out = subprocess.run([*emulated(tree), "-c", _TARGET_ENV], capture_output=True, text=True, check=True,
                         timeout=300).stdout
    info = json.loads(out)
    major, minor = (int(x) for x in info["glibc"].split(".")[:2])
    return info["env"], (major, minor)


def for_python(env: dict[str, str], full_version: str) -> dict[str, str]:
    """`env` with another CPython version (for resolving what a Jetson's own Python gets)."""
    return {**env, "python_full_version": full_version, "implementation_version": full_version,
            "python_version": ".".join(full_version.split(".")[:2])}


def platform_tags(glibc: tuple[int, int], arch: str = "aarch64") -> list[str]:
    """Every manylinux tag a glibc of this version runs, newest first (2_17 = manylinux2014: the oldest)."""
    major, minor = glibc
    if major != 2 or minor < 17:
        raise ValueError(f"glibc {major}.{minor} is older than manylinux2014 (2.17)")
    return [f"manylinux_2_{m}_{arch}" for m in range(minor, 16, -1)] + [f"manylinux2014_{arch}"]


def pip_target_args(env: dict[str, str], tags: list[str]) -> list[str]:
    """pip's options that pick wheels for the target interpreter instead of the running one."""
    version = env["python_version"]
    plats = [arg for tag in tags for arg in ("--platform", tag)]
    return ["--only-binary=:all:", *plats, "--python-version", version, "--implementation", "cp",
            "--abi", "cp" + version.replace(".", "")]


def requirements(wheel: Path, llama_sdist: Path, env: dict[str, str], extras: tuple[str, ...] = EXTRAS) -> list[str]:
    """The product wheel's requirements (with `extras`) and llama-cpp-python's own, markers evaluated for
    the target; llama-cpp-python itself left out."""
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        product = Parser().parsestr(zf.read(meta).decode()).get_all("Requires-Dist") or []
    with tarfile.open(llama_sdist) as tar:
        info = next(m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"))
        handle = tar.extractfile(info)
        assert handle is not None
        llama = Parser().parsestr(handle.read().decode()).get_all("Requires-Dist") or []
    out = []
    for line in product + llama:
        req = Requirement(line)
        if req.name.lower().replace("_", "-") == BUILT_HERE:
            continue
        if req.marker and not any(req.marker.evaluate({**env, "extra": e}) for e in ("", *extras)):
            continue
        req.marker = None
        out.append(str(req))
    return sorted(set(out))


def named_in_pip_error(stderr: str) -> list[str]:
    """The packages pip names in 'No matching distribution found for X' (its name for a missing wheel)."""
    return sorted({Requirement(m).name for m in re.findall(r"No matching distribution found for (\S+)", stderr)})


def download(reqs: list[str], out: Path, target: list[str], python: str = sys.executable,
             pins: dict[str, str] | None = None) -> list[Path]:
    """pip download `reqs` and their dependencies as target wheels into `out` (at the `pins` versions where
    given); NoWheel names what has none: the package pip stopped at and, checked one by one without
    dependencies, every top-level one."""
    out.mkdir(parents=True, exist_ok=True)
    base = [python, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "-d", str(out), *target]
    if pins:
        constraints = out / "constraints.txt"
        constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
        base += ["-c", str(constraints)]
    proc = subprocess.run([*base, *reqs], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        missing = set(named_in_pip_error(proc.stderr))
        for req in reqs:
            alone = subprocess.run([*base, "--no-deps", req], capture_output=True, text=True, timeout=600)
            if alone.returncode != 0:
                missing.update(named_in_pip_error(alone.stderr) or [Requirement(req).name])
        lines = [ln for ln in proc.stderr.splitlines() if "ERROR" in ln or "No matching" in ln]
        raise NoWheel(sorted(missing) or ["(pip named none)"], "\n".join(lines[-6:]) or proc.stderr[-2000:])
    return sorted(out.glob("*.whl"))


def resolved_versions(wheels: list[Path]) -> dict[str, str]:
    """{normalized name: version} from wheel file names."""
    out = {}
    for w in wheels:
        name, version = w.name.split("-")[:2]
        out[name.lower().replace("_", "-")] = version
    return out


def compare_x86(reqs: list[str], env: dict[str, str], glibc: tuple[int, int], aarch64: dict[str, str],
                python: str = sys.executable) -> list[str]:
    """Lines for each package that resolves to another version for x86_64 (an aarch64 release lagging)."""
    target = pip_target_args(env, platform_tags(glibc, "x86_64"))
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--dry-run",
                        "--ignore-installed", "--target", str(Path(tmp) / "t"), "--report", str(report),
                        *target, *reqs], check=True, capture_output=True, text=True, timeout=1800)
        x86 = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
               for i in json.loads(report.read_text())["install"]}
    return [f"{name}: aarch64 {aarch64.get(name, '-')}, x86_64 {x86.get(name, '-')}"
            for name in sorted(set(x86) | set(aarch64)) if x86.get(name) != aarch64.get(name)]


# Run under emulation by the tree's python (`--check-installed`): every requirement of every installed
# distribution, markers evaluated by the real aarch64 interpreter (what pip check does).
def check_installed(paths: list[str], extras: tuple[str, ...] = EXTRAS) -> list[str]:
    import importlib.metadata as md

    from packaging.version import Version

    dists = {d.metadata["Name"].lower().replace("_", "-"): d for d in md.distributions(path=paths)}
    problems = []
    for name, dist in sorted(dists.items()):
        wanted = ("", *extras) if name == "edge-runtime" else ("",)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in wanted):
                continue
            have = dists.get(req.name.lower().replace("_", "-"))
            if have is None:
                problems.append(f"{name} needs {req.name}{req.specifier}: not installed")
            elif not req.specifier.contains(Version(have.version), prereleases=True):
                problems.append(f"{name} needs {req.name}{req.specifier}: {have.version} installed")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", type=Path, help="arm64 tree (build/arm64/tree.sh)")
    ap.add_argument("--wheel", type=Path, help="the edge-runtime wheel (pip wheel --no-deps .)")
    ap.add_argument("--llama-sdist", type=Path, help="llama-cpp-python's sdist (its requirements are read)")
    ap.add_argument("--out", type=Path, help="folder for the downloaded wheels")
    ap.add_argument("--compare-x86", action="store_true", help="also list versions that differ on x86_64")
    ap.add_argument("--check-installed", nargs="+", metavar="DIR", help="(under emulation) check requirements")
    args = ap.parse_args()
    if args.check_installed:
        problems = check_installed(args.check_installed)
        print("\n".join(problems) or "every requirement is met")
        return 1 if problems else 0
    if not (args.tree and args.wheel and args.llama_sdist and args.out):
        ap.error("--tree, --wheel, --llama-sdist and --out are required")
    env, glibc = target_environment(args.tree)
    reqs = requirements(args.wheel, args.llama_sdist, env)
    tags = platform_tags(glibc)
    print(f"target: CPython {env['python_full_version']} {env['platform_machine']}, glibc {glibc[0]}.{glibc[1]} "
          f"({tags[-1]} .. {tags[0]}); {len(reqs)} top-level requirements")
    try:
        wheels = download(reqs, args.out, pip_target_args(env, tags))
    except NoWheel as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    versions = resolved_versions(wheels)
    (args.out / "resolved.txt").write_text("".join(f"{n}=={v}\n" for n, v in sorted(versions.items())))
    print(f"resolved: {len(wheels)} aarch64 wheels in {args.out}")
    if args.compare_x86:
        lags = compare_x86(reqs, env, glibc, versions)
        print("versions that differ on x86_64:" if lags else "x86_64 resolves the same versions")
        for line in lags:
            print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
