"""Independent protocol peers from the npm registry, installed once into ~/.cache/edge-runtime/npm/.

`npm install --prefix` into a folder keyed by the package spec: outside the checkout (nothing to
git-ignore), shared by every run, installed again only when the pinned version changes.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("EDGE_RUNTIME_CACHE", Path.home() / ".cache" / "edge-runtime")) / "npm"


def npm_package(spec: str) -> Path:
    """The `node_modules` folder holding `spec` (e.g. "modbus-serial@8.0.25"); skips without node."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        if os.environ.get("CI"):  # `make system-deps` installs them: in CI a missing peer is a failure
            pytest.fail("node and npm are missing although make system-deps installs them")
        pytest.skip("node and npm are needed for the independent client (apt-get install nodejs npm)")
    key = hashlib.sha256(spec.encode()).hexdigest()[:12]
    prefix = CACHE / f"{spec.replace('/', '_').replace('@', '-')}-{key}"
    modules = prefix / "node_modules"
    done = prefix / ".installed"
    prefix.mkdir(parents=True, exist_ok=True)
    with (prefix / ".lock").open("w") as lock:  # two test processes must not install at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                            "--ignore-scripts", spec], check=True, capture_output=True, timeout=300)
            done.write_text(spec + "\n")
    return modules
