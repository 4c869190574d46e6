"""Shipping: the flash-attn patch on the real sdist, build scripts (dry run, shellcheck), systemd units."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
sys.path.insert(0, str(BUILD))
import flash_attn_aarch64 as fa  # noqa: E402

FA_VERSION = "2.8.3.post2"


@pytest.fixture(scope="module")
def flash_attn_sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real sdist from the package index (8.5 MB), cached for the session's runs."""
    cache = Path(os.environ.get("EDGE_TEST_CACHE", Path.home() / ".cache" / "edge-runtime-tests"))
    cache.mkdir(parents=True, exist_ok=True)
    return fa.fetch_sdist(FA_VERSION, "https://pypi.org/pypi", cache)


def unpack(sdist: Path, dest: Path) -> str:
    import tarfile
    with tarfile.open(sdist) as tar:
        tar.extractall(dest, filter="data")
        return (dest / tar.getnames()[0].split("/")[0] / "setup.py").read_text()


def test_flash_attn_patch_builds_sm87_and_never_downloads(flash_attn_sdist: Path, tmp_path: Path) -> None:
    upstream = unpack(flash_attn_sdist, tmp_path)
    assert "sm_87" not in upstream and 'os.getenv("FLASH_ATTENTION_FORCE_BUILD"' in upstream
    patched, changed = fa.patch_setup_py(upstream)
    assert changed
    ast.parse(patched)  # still valid Python
    assert 'cc_flag.append("arch=compute_87,code=sm_87")' in patched
    assert re.search(r'^FORCE_BUILD = True\b', patched, re.M)  # CachedWheelsCommand.run builds locally at once
    assert 'os.getenv("FLASH_ATTN_CUDA_ARCHS", "87")' in patched
    # Only the three places changed: the rest of upstream's file is untouched.
    assert len(patched.splitlines()) == len(upstream.splitlines()) + 1 + 3


def test_flash_attn_patch_is_idempotent(flash_attn_sdist: Path, tmp_path: Path) -> None:
    once, _ = fa.patch_setup_py(unpack(flash_attn_sdist, tmp_path))
    twice, changed = fa.patch_setup_py(once)
    assert not changed and twice == once


def test_flash_attn_patch_detects_a_changed_upstream_file(flash_attn_sdist: Path, tmp_path: Path) -> None:
    upstream = unpack(flash_attn_sdist, tmp_path)
    moved = upstream.replace('"80;90;100;120"', '"80;90;100;103;120"')
    with pytest.raises(fa.PatchError, match=r"upstream setup\.py changed shape.*FLASH_ATTN_CUDA_ARCHS"):
        fa.patch_setup_py(moved)


def test_flash_attn_script_dry_run_prints_the_build(flash_attn_sdist: Path, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(BUILD / "flash_attn_aarch64.py"), "--sdist", str(flash_attn_sdist),
                           "--out", str(tmp_path), "--dry-run", "--jobs", "2"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "FLASH_ATTN_CUDA_ARCHS=87 FLASH_ATTENTION_FORCE_BUILD=TRUE MAX_JOBS=2" in proc.stdout
    assert "pip wheel --no-deps --no-build-isolation" in proc.stdout


def run_script(name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(BUILD / name), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=60)


def test_llama_build_script_dry_run_for_orin(tmp_path: Path) -> None:
    proc = run_script("llama_cpp_cuda.sh", "--target", "orin", "--wheelhouse", str(tmp_path), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "-DCMAKE_CUDA_ARCHITECTURES=87" in proc.stdout and "-DGGML_CUDA_NO_VMM=ON" in proc.stdout
    assert "-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16" in proc.stdout  # the Orin's Cortex-A78AE
    assert "llama-cpp-python==0.3.36" in proc.stdout


def test_llama_build_script_leaves_the_dot_product_out_for_xavier(tmp_path: Path) -> None:
    proc = run_script("llama_cpp_cuda.sh", "--target", "xavier", "--wheelhouse", str(tmp_path), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "-DGGML_CPU_ARM_ARCH=armv8.2-a+fp16 " in proc.stdout  # Carmel: FP16, no dot product


def test_llama_build_script_rejects_bad_arguments() -> None:
    assert "needs --archs" in run_script("llama_cpp_cuda.sh", "--target", "x86", "--dry-run").stderr
    assert "unknown --target" in run_script("llama_cpp_cuda.sh", "--target", "tx2", "--dry-run").stderr
    bad = run_script("llama_cpp_cuda.sh", "--target", "x86", "--archs", "sm90", "--dry-run")
    assert bad.returncode == 2 and "--archs must look like" in bad.stderr
    x86 = run_script("llama_cpp_cuda.sh", "--target", "x86", "--archs", "86;90", "--dry-run")
    assert "-DCMAKE_CUDA_ARCHITECTURES=86;90" in x86.stdout and "NO_VMM" not in x86.stdout
    assert "GGML_CPU_ARM_ARCH" not in x86.stdout


def test_onnxruntime_script_picks_the_jetpack_index_and_never_leaves_both(tmp_path: Path) -> None:
    release = tmp_path / "nv_tegra_release"
    release.write_text("# R36 (release), REVISION: 4.0, GCID: 1, BOARD: generic, EABI: aarch64\n")
    proc = run_script("onnxruntime_gpu.sh", "--dry-run", env={"RELEASE_FILE": str(release)})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "L4T 36.4.0 -> JetPack 6" in out and "jp6" in out
    assert out.index("uninstall -y onnxruntime onnxruntime-gpu") < out.index("install --no-cache-dir")
    assert "CUDAExecutionProvider" in out
    missing = run_script("onnxruntime_gpu.sh", "--dry-run", env={"RELEASE_FILE": str(tmp_path / "none")})
    assert missing.returncode == 2 and "not a Jetson" in missing.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shell_scripts_are_shellcheck_clean() -> None:
    scripts = [*BUILD.rglob("*.sh"), ROOT / "systemd/install.sh", ROOT / "benchmarks/gpu_run.sh",
               ROOT / "l4t_docker/check_x86_image.sh"]
    proc = subprocess.run(["shellcheck", "-S", "warning", *map(str, scripts)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


ENVIRONMENT_ONLY = re.compile(r"is not executable|not found|Failed to create .*/start")


@pytest.mark.parametrize("unit", ["edge-runtime.service", "edge-runtime-container.service", "edge-runtime-ota.service"])
def test_systemd_units_verify(unit: str) -> None:
    proc = subprocess.run(["systemd-analyze", "verify", str(ROOT / "systemd" / unit)], capture_output=True, text=True)
    problems = [line for line in (proc.stdout + proc.stderr).splitlines() if line and not ENVIRONMENT_ONLY.search(line)]
    assert problems == []  # only complaints about binaries/units absent on this build machine remain


def test_native_unit_is_hardened() -> None:
    proc = subprocess.run(["systemd-analyze", "security", "--offline=true", str(ROOT / "systemd/edge-runtime.service")],
                          capture_output=True, text=True)
    level = re.search(r"Overall exposure level for edge-runtime.service: ([\d.]+)", proc.stdout)
    assert level and float(level.group(1)) <= 2.5, proc.stdout[-500:]
    unit = (ROOT / "systemd/edge-runtime.service").read_text()
    for line in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "NoNewPrivileges=yes",
                 "ProtectSystem=strict", "ReadWritePaths=/var/lib/edge-runtime", "PrivateTmp=yes",
                 "LoadCredential=MQTT_PASSWORD", "DevicePolicy=closed", "After=network-online.target jtop.service"):
        assert line in unit, line


def test_example_config_is_valid(tmp_path: Path) -> None:
    env = {**os.environ, "MQTT_PASSWORD": "x", "EDGE_API_TOKEN": "y", "EDGE_RUNTIME_DATA": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "edge_runtime", "config", "validate",
                           str(ROOT / "systemd/config.example.yaml")], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr


def test_dockerfiles_follow_the_shipping_rules() -> None:
    for name in ("Dockerfile.jp6", "Dockerfile.jp5", "Dockerfile.x86"):
        text = (ROOT / "l4t_docker" / name).read_text()
        assert text.count("\nFROM ") + text.startswith("FROM ") >= 2, f"{name}: multi-stage"
        assert "USER edge-runtime" in text and "HEALTHCHECK" in text and "/readyz" in text, name
        assert "org.opencontainers.image.version" in text and 'VOLUME ["/var/lib/edge-runtime"]' in text, name
    assert "python3.10" in (ROOT / "l4t_docker/Dockerfile.jp5").read_text()
    compose = (ROOT / "l4t_docker/compose.yaml").read_text()
    assert "/run/jtop.sock:/run/jtop.sock" in compose and "/dev/video0" in compose


def test_fetch_checks_the_index_digest(tmp_path: Path, flash_attn_sdist: Path) -> None:
    meta = json.load(urllib.request.urlopen("https://pypi.org/pypi/flash-attn/json", timeout=60))
    files = meta["urls"] if meta["info"]["version"] == FA_VERSION else meta["releases"][FA_VERSION]
    digest = next(u for u in files if u["packagetype"] == "sdist")["digests"]["sha256"]
    assert hashlib.sha256(flash_attn_sdist.read_bytes()).hexdigest() == digest
