"""`edge-runtime doctor` against machines described by the test: a CPU box, a GPU server, a Jetson.

The machine comes in as a fake filesystem tree (`root`: /etc/nv_tegra_release, /proc/driver/nvidia,
/sys/class/thermal, /dev, /run/jtop.sock) and probes (shared libraries, llama.cpp's GPU support, a jtop
client replaying a recorded Orin Nano), so every assertion holds on any host, a Jetson included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_runtime.cli.doctor import Check, Doctor
from edge_runtime.config import Config
from tests.support.broker import Broker
from tests.support.jtop import RecordedJtop
from tests.support.mjpeg import free_port

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CUDA_LIBS = {"cuda": "libcuda.so.1", "cudart": "libcudart.so.12", "cublas": "libcublas.so.12"}


def cpu_box(root: Path) -> Path:
    """An x86 server without GPU: two thermal zones, nothing NVIDIA."""
    for i, (kind, milli) in enumerate((("x86_pkg_temp", 48000), ("acpitz", 41000))):
        zone = root / f"sys/class/thermal/thermal_zone{i}"
        zone.mkdir(parents=True)
        (zone / "type").write_text(kind + "\n")
        (zone / "temp").write_text(f"{milli}\n")
    (root / "dev").mkdir()
    return root


def gpu_server(root: Path) -> Path:
    cpu_box(root)
    (root / "proc/driver/nvidia").mkdir(parents=True)
    (root / "proc/driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 2025\nGCC version: gcc 12\n")
    return root


def orin_nano(root: Path, jtop_service: bool = True) -> Path:
    cpu_box(root)
    (root / "etc").mkdir()
    (root / "etc/nv_tegra_release").write_text(
        "# R36 (release), REVISION: 3.0, GCID: 36191598, BOARD: generic, EABI: aarch64, DATE: Mon May  6 2024\n")
    (root / "proc/device-tree").mkdir(parents=True)
    (root / "proc/device-tree/model").write_text("NVIDIA Jetson Orin Nano Developer Kit\x00")
    if jtop_service:
        (root / "run").mkdir()
        (root / "run/jtop.sock").touch()
    return root


def no_jtop() -> Any:
    raise AssertionError("jtop must not be asked on this machine")


def doctor(root: Path, config: Config, *, libs: dict[str, str] | None = None, gpu_build: bool = False,
           jtop: Callable[[], Any] = no_jtop, model_dir: Path | None = None) -> dict[str, Check]:
    found = libs or {}
    checks = Doctor(config, str(model_dir) if model_dir else None, root=root, find_library=found.get,
                    llama_probe=lambda: ("0.3.36", gpu_build), jtop=jtop).run()
    return {c.name: c for c in checks}


def config(tmp_path: Path, **overrides: Any) -> Config:
    base: dict[str, Any] = {"data_dir": str(tmp_path / "data"), "mqtt": {"enabled": False},
                            "governor": {"sensor": "sysfs"},
                            "model": {"gpu_layers": 0, "providers": ["CPUExecutionProvider"]}}
    for key, value in overrides.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return Config.model_validate(base)


def test_cpu_box_with_a_broker_and_the_demo_bundle_passes(tmp_path: Path, demo_dir: Path) -> None:
    broker = Broker(tmp_path / "b").start()
    try:
        checks = doctor(cpu_box(tmp_path / "root"), config(tmp_path, mqtt={"enabled": True, "host": "127.0.0.1",
                                                                           "port": broker.port}), model_dir=demo_dir)
    finally:
        broker.stop()
    assert [c.name for c in checks.values() if c.status in ("fail", "warn")] == []
    assert "not a Jetson" in checks["platform"].detail
    assert checks["nvidia driver"].status == "skip" and checks["cuda libraries"].status == "skip"
    assert checks["jtop"].status == "skip"
    assert checks["sensors"].status == "ok" and checks["sensors"].detail.startswith("sysfs: 2 temperatures")
    assert checks["llama.cpp"].detail == "llama-cpp-python 0.3.36, GPU offload not built"
    assert checks["mqtt broker"].status == "ok" and checks["model bundle"].status == "ok"


def test_cpu_box_asked_for_the_gpu_fails_with_a_fix_for_each_problem(tmp_path: Path) -> None:
    cfg = config(tmp_path, mqtt={"enabled": True, "host": "127.0.0.1", "port": free_port()},
                 model={"gpu_layers": -1, "path": str(tmp_path / "nope")},
                 cameras=[{"name": "line", "source": "/dev/video42"}])
    checks = doctor(cpu_box(tmp_path / "root"), cfg)
    for name in ("mqtt broker", "model bundle", "cameras", "llama.cpp", "nvidia driver"):
        assert checks[name].status == "fail", name
        assert checks[name].fix, name
    assert "/dev/video42 does not exist" in checks["cameras"].detail
    assert "set model.gpu_layers: 0" in checks["nvidia driver"].fix


def test_camera_device_present_in_the_tree_passes(tmp_path: Path) -> None:
    root = cpu_box(tmp_path / "root")
    (root / "dev/video0").touch()
    checks = doctor(root, config(tmp_path, cameras=[{"name": "usb", "source": 0}]))
    assert checks["cameras"].status == "ok" and checks["cameras"].detail == "usb (v4l2)"


def test_gpu_server_with_cuda_and_a_cuda_build_passes(tmp_path: Path) -> None:
    checks = doctor(gpu_server(tmp_path / "root"), config(tmp_path, model={"gpu_layers": -1}), libs=CUDA_LIBS,
                    gpu_build=True)
    assert checks["nvidia driver"].status == "ok" and "580.95.05" in checks["nvidia driver"].detail
    assert checks["cuda libraries"].status == "ok" and "cublas: libcublas.so.12" in checks["cuda libraries"].detail
    assert checks["llama.cpp"].status == "ok" and "GPU offload built in" in checks["llama.cpp"].detail


def test_gpu_server_missing_cublas_warns_with_the_fix(tmp_path: Path) -> None:
    libs = {k: v for k, v in CUDA_LIBS.items() if k != "cublas"}
    checks = doctor(gpu_server(tmp_path / "root"), config(tmp_path), libs=libs)
    assert checks["cuda libraries"].status == "warn"
    assert checks["cuda libraries"].detail == "found cuda, cudart; missing cublas"
    assert "CUDA runtime" in checks["cuda libraries"].fix


def test_jetson_orin_nano_with_the_jtop_service_passes(tmp_path: Path) -> None:
    checks = doctor(orin_nano(tmp_path / "root"), config(tmp_path, governor={"sensor": "sysfs"}),
                    libs=CUDA_LIBS, gpu_build=True, jtop=RecordedJtop)
    assert checks["platform"].detail == "NVIDIA Jetson Orin Nano Developer Kit, L4T 36.3.0 (JetPack 6.0)"
    assert checks["nvidia driver"].status == "ok" and "integrated GPU" in checks["nvidia driver"].detail
    assert checks["jtop"].status == "ok" and "Orin Nano" in checks["jtop"].detail


def test_jetson_without_the_jtop_service_fails_with_the_fix(tmp_path: Path) -> None:
    checks = doctor(orin_nano(tmp_path / "root", jtop_service=False), config(tmp_path), jtop=RecordedJtop)
    assert checks["jtop"].status == "fail" and "systemctl enable --now jtop" in checks["jtop"].fix


def test_jetson_with_a_mismatched_jtop_client_fails_with_the_fix(tmp_path: Path) -> None:
    def mismatched() -> Any:
        raise RuntimeError("Mismatch version jtop service: [4.2.12] and client: [4.3.0]")

    checks = doctor(orin_nano(tmp_path / "root"), config(tmp_path), jtop=mismatched)
    assert checks["jtop"].status == "fail" and "Mismatch version" in checks["jtop"].detail
    assert "same jetson-stats version" in checks["jtop"].fix


def test_doctor_cli_exit_code_follows_the_checks(tmp_path: Path, demo_dir: Path) -> None:
    """On whatever machine runs the test: exit 1 exactly when a check failed; JSON names every check."""
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(f"mqtt:\n  enabled: false\nmodel:\n  path: {demo_dir}\ngovernor:\n  enabled: false\n")
    proc = subprocess.run([sys.executable, "-m", "edge_runtime", "doctor", "--config", str(cfg), "--json"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "EDGE_RUNTIME_DATA": str(tmp_path / "data")})
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    assert set(checks) >= {"platform", "nvidia driver", "onnxruntime", "llama.cpp", "mqtt broker", "model bundle"}
    assert all(c["status"] in ("ok", "warn", "fail", "skip") for c in checks.values())
    assert proc.returncode == (1 if any(c["status"] == "fail" for c in checks.values()) else 0)
    assert checks["model bundle"]["status"] == "ok" and checks["mqtt broker"]["status"] == "skip"
    table = subprocess.run([sys.executable, "-m", "edge_runtime", "--config", str(cfg), "doctor"],
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "EDGE_RUNTIME_DATA": str(tmp_path / "data")})
    assert table.returncode == proc.returncode and "failed," in table.stdout
