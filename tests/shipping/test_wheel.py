"""What we ship runs: the wheel every image installs, installed (not editable) into a fresh venv, imports
every module of the package and runs the daemon's commands — `--help`, `models demo`, `infer` on a
sample and `run --demo` until `/readyz` answers — from the wheel alone.

The fresh venv reaches the already-built dependencies (llama-cpp-python takes minutes to build) through a
`.pth` line naming the test venv's site-packages. Python does not run `.pth` files found in a folder that
a `.pth` line added, so the checkout's editable install stays out of sight: `edge_runtime` can only come
from the wheel, which the first test proves.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import cv2
import pytest

from edge_runtime.core.samples import part_image
from tests.support.mjpeg import free_port
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of the source files the Dockerfiles copy (no build/ scratch here)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("edge_runtime", "models"):
        shutil.copytree(ROOT / name, src / name, ignore=skip)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                           str(tmp), str(src)], capture_output=True, text=True, timeout=300, cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    assert [line for line in (proc.stdout + proc.stderr).splitlines() if "warn" in line.lower()] == []
    (built,) = tmp.glob("edge_runtime-*.whl")
    return built


@pytest.fixture(scope="module")
def fresh_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with the wheel installed by pip (not editable); the dependencies come from ours."""
    venv = tmp_path_factory.mktemp("venv") / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "edge-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True, timeout=300)
    return venv


def run_fresh(venv: Path, *args: str, cwd: Path, env: dict[str, str] | None = None,
              timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """A command of the fresh venv, run outside the checkout so its folders cannot be imported."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**clean, **(env or {})})


def test_the_wheel_holds_every_package_folder_of_the_checkout(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for init in sorted((ROOT / "edge_runtime").rglob("__init__.py")):
        rel = init.relative_to(ROOT).as_posix()
        assert rel in names, f"{rel} is not in the wheel"
    for module in sorted((ROOT / "edge_runtime").rglob("*.py")):
        assert module.relative_to(ROOT).as_posix() in names, module
    for page in ("index.html", "app.js", "style.css"):
        assert f"edge_runtime/api/static/{page}" in names
    assert "edge_runtime_models/demo.py" in names


def test_every_module_imports_from_the_installed_wheel(fresh_venv: Path, tmp_path: Path) -> None:
    script = (
        "import importlib, json, pkgutil, edge_runtime, edge_runtime_models\n"
        "names = [m.name for pkg in (edge_runtime, edge_runtime_models)\n"
        "         for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.')]\n"
        "names = [n for n in names if not n.endswith('.__main__')]  # running it is the CLI test below\n"
        "for name in names: importlib.import_module(name)\n"
        "print(json.dumps({'file': edge_runtime.__file__, 'count': len(names)}))\n"
    )
    proc = run_fresh(fresh_venv, str(fresh_venv / "bin" / "python"), "-c", script, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["file"].startswith(str(fresh_venv)), f"edge_runtime came from {out['file']}, not the wheel"
    assert out["count"] >= len(list((ROOT / "edge_runtime").rglob("*.py"))) - 1


def test_the_installed_command_builds_the_demo_bundle_infers_and_serves_until_ready(
        fresh_venv: Path, tmp_path: Path) -> None:
    exe = str(fresh_venv / "bin" / "edge-runtime")
    env = {"EDGE_RUNTIME_DATA": str(tmp_path / "data")}
    helped = run_fresh(fresh_venv, exe, "--help", cwd=tmp_path, env=env, timeout=60)
    assert helped.returncode == 0 and "infer" in helped.stdout, helped.stderr

    bundle = tmp_path / "bundle"
    built = run_fresh(fresh_venv, exe, "models", "demo", str(bundle), cwd=tmp_path, env=env)
    assert built.returncode == 0, built.stderr[-3000:]
    assert (bundle / "bundle.yaml").is_file()

    image = tmp_path / "part.png"
    assert cv2.imwrite(str(image), part_image())
    inferred = run_fresh(fresh_venv, exe, "infer", str(image), "--model", str(bundle), "--no-warmup",
                         cwd=tmp_path, env=env)
    assert inferred.returncode == 0, inferred.stderr[-3000:]
    result = json.loads(inferred.stdout)
    assert isinstance(result["verdict"], dict) and result["model"]

    port = free_port()
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(f"device_id: wheel\ndata_dir: {tmp_path / 'data'}\napi: {{host: 127.0.0.1, port: {port}}}\n"
                   "mqtt: {enabled: false}\n")
    log = tmp_path / "daemon.log"
    with log.open("wb") as out:
        clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        proc = subprocess.Popen([exe, "--config", str(cfg), "run", "--demo"], stdout=out,
                                stderr=subprocess.STDOUT, cwd=tmp_path, env={**clean, **env})
    try:
        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                    return resp.status == 200
            except OSError:
                return proc.poll() is not None  # died: stop waiting, the assert below says why
        wait_for(ready, 180, "/readyz of the daemon installed from the wheel")
        assert proc.poll() is None, log.read_text()[-3000:]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as resp:
            assert b"<html" in resp.read().lower()  # the status page's files came with the wheel
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
