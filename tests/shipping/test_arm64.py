"""ARM64: the Makefile's llama.cpp flags by architecture, and the pieces of `make test-arm64` that run in
seconds (the cross build's command line, the wheel resolution's rules). The slow end-to-end proof under
qemu-aarch64 is `make test-arm64` itself (docs/deploy.md)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from io import BytesIO
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARM64 = ROOT / "build" / "arm64"
sys.path.insert(0, str(ARM64))
import emulated  # noqa: E402
import resolve  # noqa: E402

AMX = "-U__AMX_INT8__"


def make_dry_run(tmp_path: Path, *args: str) -> str:
    """`make -n` of the venv recipe (forced, into a venv path that does not exist): what would run."""
    proc = subprocess.run(["make", "-n", "-B", f"VENV={tmp_path / 'venv'}", "venv", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if "pip install" in ln and "CMAKE_ARGS" in ln]
    return line


@pytest.mark.parametrize("arch", ["x86_64", "amd64"])
def test_the_llama_build_undefines_amx_on_x86(tmp_path: Path, arch: str) -> None:
    line = make_dry_run(tmp_path, f"HOST_ARCH={arch}")
    assert f"-DCMAKE_C_FLAGS={AMX}" in line and f"-DCMAKE_CXX_FLAGS={AMX}" in line


@pytest.mark.parametrize("arch", ["aarch64", "arm64"])
def test_the_llama_build_passes_no_x86_flag_on_arm(tmp_path: Path, arch: str) -> None:
    line = make_dry_run(tmp_path, f"HOST_ARCH={arch}")
    assert "AMX" not in line and "CMAKE_C_FLAGS" not in line
    assert 'CMAKE_ARGS=" $CMAKE_ARGS"' in line  # a caller's own CMAKE_ARGS still reach the build


def test_the_llama_build_flags_follow_this_machine(tmp_path: Path) -> None:
    machine = subprocess.run(["uname", "-m"], capture_output=True, text=True, check=True).stdout.strip()
    assert (AMX in make_dry_run(tmp_path)) == (machine in ("x86_64", "amd64"))


def test_the_arm64_proof_is_its_own_target_not_part_of_make_test(tmp_path: Path) -> None:
    run = subprocess.run(["make", "-n", "-B", f"VENV={tmp_path / 'venv'}", "test"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0 and "build/arm64" not in run.stdout
    arm = subprocess.run(["make", "-n", f"VENV={tmp_path / 'venv'}", "test-arm64"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert arm.returncode == 0 and "build/arm64/test_arm64.py" in arm.stdout


def test_the_cross_build_targets_the_orin_cpu_and_tags_the_wheel_aarch64(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(ARM64 / "llama_wheel.sh"), "--tree", str(tmp_path / "tree"),
                           "--wheelhouse", str(tmp_path / "wh"), "--dry-run"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"-DCMAKE_TOOLCHAIN_FILE={ARM64 / 'aarch64-linux-gnu.cmake'}" in out
    assert "-DGGML_NATIVE=OFF" in out and "-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16" in out
    assert "_PYTHON_HOST_PLATFORM=linux-aarch64" in out and "cmake.python-hints=false" in out
    assert f"-DPython3_INCLUDE_DIR={tmp_path / 'tree'}/usr/include/python3" in out  # the tree's, not the host's
    assert "llama-cpp-python==0.3.36" in out and "nice -n 10" in out
    assert "AMX" not in out


def test_the_cross_build_refuses_a_bad_arch(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(ARM64 / "llama_wheel.sh"), "--tree", str(tmp_path), "--arch", "native",
                           "--dry-run"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--arch must look like" in proc.stderr


def test_the_manylinux_tags_cover_every_glibc_the_tree_runs() -> None:
    tags = resolve.platform_tags((2, 36))
    assert tags[0] == "manylinux_2_36_aarch64" and tags[-2:] == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"]
    assert "manylinux_2_28_aarch64" in tags and len(tags) == 36 - 17 + 2
    with pytest.raises(ValueError, match="older than manylinux2014"):
        resolve.platform_tags((2, 12))


AARCH64_ENV = {"implementation_name": "cpython", "implementation_version": "3.11.2", "os_name": "posix",
               "platform_machine": "aarch64", "platform_release": "5.15.148-tegra", "platform_system": "Linux",
               "platform_version": "#1 SMP", "python_full_version": "3.11.2",
               "platform_python_implementation": "CPython", "python_version": "3.11", "sys_platform": "linux"}


def fake_wheel(path: Path, requires: list[str]) -> Path:
    meta = "Metadata-Version: 2.1\nName: edge-runtime\nVersion: 0.1.0\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("edge_runtime-0.1.0.dist-info/METADATA", meta)
    return path


def fake_sdist(path: Path, requires: list[str]) -> Path:
    info = ("Metadata-Version: 2.2\nName: llama_cpp_python\nVersion: 0.3.36\n"
            + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode()
    with tarfile.open(path, "w:gz") as tar:
        member = tarfile.TarInfo("llama_cpp_python-0.3.36/PKG-INFO")
        member.size = len(info)
        tar.addfile(member, BytesIO(info))
    return path


def test_requirements_are_read_for_the_target_machine_and_leave_out_llama(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path / "edge_runtime-0.1.0-py3-none-any.whl", [
        "llama-cpp-python==0.3.36", "numpy>=1.24", "gpiod<3,>=2.2; sys_platform == \"linux\"",
        "x86only>=1; platform_machine == \"x86_64\"", "armonly; platform_machine == \"aarch64\"",
        "asyncua>=2.1; extra == \"lineio\"", "openai>=1.40; extra == \"test\""])
    sdist = fake_sdist(tmp_path / "llama_cpp_python-0.3.36.tar.gz", ["numpy>=1.20.0", "diskcache>=5.6.1"])
    reqs = resolve.requirements(wheel, sdist, AARCH64_ENV)
    assert reqs == sorted(["armonly", "asyncua>=2.1", "diskcache>=5.6.1", "gpiod<3,>=2.2", "numpy>=1.20.0",
                           "numpy>=1.24"])


def test_pip_error_names_the_package_without_a_wheel() -> None:
    stderr = ("ERROR: Could not find a version that satisfies the requirement jetson-stats>=4.2 (from versions: none)\n"
              "ERROR: No matching distribution found for jetson-stats>=4.2\n")
    assert resolve.named_in_pip_error(stderr) == ["jetson-stats"]


def test_a_package_with_only_an_sdist_fails_the_resolution_by_name(tmp_path: Path) -> None:
    """The real index: llama-cpp-python 0.3.36 has no wheel at all, so no aarch64 one."""
    target = resolve.pip_target_args(AARCH64_ENV, resolve.platform_tags((2, 36)))
    with pytest.raises(resolve.NoWheel) as caught:
        resolve.download(["llama-cpp-python==0.3.36"], tmp_path, target)
    assert caught.value.names == ["llama-cpp-python"]
    assert "no aarch64 wheel on the index for: llama-cpp-python" in str(caught.value)


def test_installed_requirements_are_checked_with_their_markers(tmp_path: Path) -> None:
    def dist(name: str, version: str, requires: list[str]) -> None:
        info = tmp_path / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                       + "".join(f"Requires-Dist: {r}\n" for r in requires))
    dist("edge-runtime", "0.1.0", ["numpy>=1.24", "asyncua>=2.1; extra == 'lineio'", "pytest; extra == 'test'",
                                   "nowhere; sys_platform == 'win32'"])
    dist("numpy", "1.26.4", [])
    assert resolve.check_installed([str(tmp_path)]) == ["edge-runtime needs asyncua>=2.1: not installed"]
    dist("asyncua", "2.0.0", [])
    assert resolve.check_installed([str(tmp_path)]) == ["edge-runtime needs asyncua>=2.1: 2.0.0 installed"]


def _sweep(shadow: Path) -> subprocess.CompletedProcess[str]:
    """The emulated step's module sweep, run by this Python with `shadow` ahead of everything on the path."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{shadow}:{ROOT}", "HOME": str(shadow)}
    return subprocess.run([sys.executable, "-c", emulated._SWEEP], capture_output=True, text=True, env=env,
                          timeout=300)


def test_the_module_sweep_names_a_module_whose_dependency_does_not_import(tmp_path: Path) -> None:
    (tmp_path / "semver.py").write_text("raise ImportError('no aarch64 build of this')\n")
    proc = _sweep(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "edge_runtime.ota.manifest: ImportError" in proc.stdout


def test_the_module_sweep_lets_only_the_eval_extra_be_missing(tmp_path: Path) -> None:
    (tmp_path / "scipy").mkdir()
    (tmp_path / "scipy" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'scipy'\", name='scipy')\n")
    proc = _sweep(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "need the eval extra" in proc.stdout and "(0 need" not in proc.stdout
