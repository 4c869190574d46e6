"""`edge-runtime doctor` on this machine (no GPU, no Jetson) and on a Jetson's system files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from broker import Broker
from mjpeg import free_port

from edge_runtime.config import Config
from edge_runtime.doctor import Doctor


def run_doctor(tmp_path: Path, config: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(config)
    return subprocess.run([sys.executable, "-m", "edge_runtime", "--config", str(cfg), "doctor", "--json"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "EDGE_RUNTIME_DATA": str(tmp_path / "data")})


def by_name(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    return {c["name"]: c for c in json.loads(proc.stdout)}


def test_doctor_on_this_machine_passes_with_a_broker(tmp_path: Path, demo_dir: Path) -> None:
    broker = Broker(tmp_path / "b").start()
    try:
        proc = run_doctor(tmp_path, f"mqtt:\n  port: {broker.port}\n  host: 127.0.0.1\nmodel:\n  path: {demo_dir}\n")
    finally:
        broker.stop()
    checks = by_name(proc)
    assert proc.returncode == 0, proc.stdout
    assert checks["platform"]["status"] == "ok" and "not a Jetson" in checks["platform"]["detail"]
    assert checks["nvidia driver"]["status"] == "skip" and checks["jtop"]["status"] == "skip"
    assert checks["mqtt broker"]["status"] == "ok" and checks["model bundle"]["status"] == "ok"
    assert "GPU offload not built" in checks["llama.cpp"]["detail"]


def test_doctor_fails_with_a_fix_for_each_problem(tmp_path: Path) -> None:
    config = (f"mqtt:\n  port: {free_port()}\n  host: 127.0.0.1\nmodel:\n  path: {tmp_path / 'nope'}\n"
              "  gpu_layers: -1\ncameras:\n  - name: line\n    source: /dev/video42\n")
    proc = run_doctor(tmp_path, config)
    checks = by_name(proc)
    assert proc.returncode == 1
    for name in ("mqtt broker", "model bundle", "cameras", "llama.cpp", "nvidia driver"):
        assert checks[name]["status"] == "fail", name
        assert checks[name]["fix"], name
    assert "/dev/video42 does not exist" in checks["cameras"]["detail"]


def test_doctor_reads_the_jetson_release_files(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/nv_tegra_release").write_text(
        "# R36 (release), REVISION: 3.0, GCID: 36191598, BOARD: generic, EABI: aarch64, DATE: Mon May  6 2024\n")
    (tmp_path / "proc/device-tree").mkdir(parents=True)
    (tmp_path / "proc/device-tree/model").write_text("NVIDIA Jetson Orin Nano Developer Kit\x00")
    doctor = Doctor(Config(data_dir=tmp_path / "data"), root=tmp_path)
    platform = doctor.platform()
    assert platform.detail == "NVIDIA Jetson Orin Nano Developer Kit, L4T 36.3.0 (JetPack 6.0)"
    jtop = doctor.jtop()
    assert jtop.status == "fail" and "systemctl enable --now jtop" in jtop.fix
    assert doctor.nvidia_driver().status == "ok"
