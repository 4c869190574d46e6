"""`doctor`'s cpu check and the cpuinfo reader behind it, on x86 and ARM machines alike.

/proc/cpuinfo differs by architecture: x86 lists `model name` and `flags`; aarch64 lists `Features` and
part numbers, and no `model name` on a Jetson Orin. The fixtures (tests/fixtures/cpuinfo): Xavier AGX and
TX2 as their kernels print them (public dumps of the arm-socs-table project), the Orin in its kernel's
format with the Cortex-A78 family's Armv8.2 features (what `make test-arm64` shows the emulated daemon),
an AVX2-only x86 desktop. llama.cpp's side is its own `llama_print_system_info()` line.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from edge_runtime.cli.doctor import Check, Doctor, compiled_cpu_features
from edge_runtime.config import Config
from edge_runtime.core.cpuinfo import parse_cpuinfo, read_cpuinfo

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cpuinfo"
# llama.cpp's line for the Orin wheel of build/arm64/llama_wheel.sh (armv8.2-a+dotprod+fp16), and for
# an x86 build with -march=native on an AVX-512 server.
ORIN_BUILD = ("CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | DOTPROD = 1 | LLAMAFILE = 1 | OPENMP = 1 | "
              "REPACK = 1 | ")
AVX512_BUILD = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | "
                "AVX512_VNNI = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ")


def machine(tmp_path: Path, fixture: str) -> Path:
    (tmp_path / "proc").mkdir(parents=True)
    shutil.copy(FIXTURES / fixture, tmp_path / "proc/cpuinfo")
    return tmp_path


def cpu_check(root: Path, system_info: str) -> Check:
    cfg = Config.model_validate({"data_dir": str(root / "data"), "mqtt": {"enabled": False}})
    return Doctor(cfg, root=root, llama_system_info=lambda: system_info).cpu()


def test_an_orin_has_no_model_name_so_its_cores_are_named_from_their_part_number() -> None:
    info = parse_cpuinfo((FIXTURES / "orin.txt").read_text())
    assert info is not None and info.describe() == "12x Cortex-A78AE" and info.cores == 12
    assert {"asimd", "asimddp", "asimdhp"} <= info.features


def test_a_xavier_generic_model_name_gives_way_to_its_carmel_cores() -> None:
    info = parse_cpuinfo((FIXTURES / "xavier_agx.txt").read_text())
    assert info is not None and info.describe() == "8x NVIDIA Carmel"
    assert "asimddp" not in info.features and "asimdhp" in info.features


def test_mixed_cores_are_each_counted_and_only_shared_features_kept() -> None:
    info = parse_cpuinfo((FIXTURES / "tx2.txt").read_text())
    assert info is not None and info.describe() == "4x Cortex-A57 + 2x NVIDIA Denver 2"


def test_x86_reads_model_name_and_flags() -> None:
    info = parse_cpuinfo((FIXTURES / "x86_avx2.txt").read_text())
    assert info is not None and info.describe() == "4x Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz"
    assert "avx2" in info.features and "avx512f" not in info.features


def test_unreadable_or_foreign_cpuinfo_reads_as_none(tmp_path: Path) -> None:
    assert read_cpuinfo(tmp_path) is None
    assert parse_cpuinfo("Processor\t: AArch64 Processor rev 2 (aarch64)\nHardware\t: foo\n") is None


def test_llama_cpp_build_features_are_read_from_its_cpu_section_only() -> None:
    info = ORIN_BUILD + "CUDA : ARCHS = 870 | USE_GRAPHS = 1 | PEER_MAX_BATCH_SIZE = 128 | "
    assert compiled_cpu_features(info) == ["NEON", "ARM_FMA", "FP16_VA", "DOTPROD", "LLAMAFILE", "OPENMP", "REPACK"]
    assert compiled_cpu_features("CPU : NEON = 1 | DOTPROD = 0 | ") == ["NEON"]


def test_the_orin_build_on_an_orin_passes(tmp_path: Path) -> None:
    check = cpu_check(machine(tmp_path, "orin.txt"), ORIN_BUILD)
    assert check.status == "ok"
    assert check.detail == "12x Cortex-A78AE; llama.cpp's CPU backend built for NEON, FP16_VA, DOTPROD"


def test_the_orin_build_on_a_xavier_fails_naming_the_dot_product(tmp_path: Path) -> None:
    check = cpu_check(machine(tmp_path, "xavier_agx.txt"), ORIN_BUILD)
    assert check.status == "fail"
    assert "this CPU lacks DOTPROD (asimddp)" in check.detail and "illegal instruction" in check.detail
    assert "built for this CPU" in check.fix


def test_an_avx512_build_on_an_avx2_desktop_fails_naming_what_is_missing(tmp_path: Path) -> None:
    check = cpu_check(machine(tmp_path, "x86_avx2.txt"), AVX512_BUILD)
    assert check.status == "fail" and "lacks AVX512 (avx512f), AVX512_VNNI (avx512_vnni)" in check.detail


def test_no_cpuinfo_skips(tmp_path: Path) -> None:
    assert cpu_check(tmp_path, ORIN_BUILD).status == "skip"


def test_this_machine_runs_its_own_llama_cpp_build() -> None:
    """The real /proc/cpuinfo and the installed llama.cpp (built here, for this CPU)."""
    cfg = Config.model_validate({"mqtt": {"enabled": False}})
    check = Doctor(cfg).cpu()
    assert check.status in ("ok", "skip"), check.detail
