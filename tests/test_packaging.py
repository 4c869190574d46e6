"""`pip install .` builds a clean wheel: no setuptools warnings, the status page and the model builders inside."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_builds_without_warnings_and_ships_the_status_page(tmp_path: Path) -> None:
    # A copy of what the wheel is built from, so setuptools' build/ scratch stays out of the checkout;
    # --no-build-isolation uses the venv's setuptools (no download).
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("edge_runtime", "models"):
        shutil.copytree(ROOT / name, src / name, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                           str(tmp_path), str(src)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    output = proc.stdout + proc.stderr
    assert [line for line in output.splitlines() if "warn" in line.lower()] == []
    (wheel,) = tmp_path.glob("edge_runtime-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in ("edge_runtime/api/static/index.html", "edge_runtime/api/static/app.js",
                     "edge_runtime/images.py", "edge_runtime_models/demo.py"):
        assert expected in names, expected
