"""The power backends that need hardware this CI machine lacks, against stand-ins built from data:
NVML through a fake `pynvml` module, and the governor's Jetson actions through a jtop client that
records what was set. The stand-ins have the same attributes and units as the real libraries."""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from edge_runtime.config import GovernorConfig, JetsonActions
from edge_runtime.power.governor import GovernorService, Level
from edge_runtime.power.jetson import JtopSensor
from edge_runtime.power.sensors import NvmlSensor, detect_sensor
from tests.support.jtop import RecordedJtop

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


# ---- NVML ------------------------------------------------------------------------------------------

class NVMLError(Exception):
    pass


def fake_pynvml(devices: list[dict[str, Any]], fail_reads: list[bool] | None = None) -> types.ModuleType:
    """A module with nvidia-ml-py's names and units, answering from recorded values."""
    nvml = types.ModuleType("pynvml")
    fail = fail_reads if fail_reads is not None else [False]
    calls: list[str] = []

    def read(handle: int, key: str) -> Any:
        if fail[0]:
            raise NVMLError("GPU is lost")
        return devices[handle][key]

    def threshold(handle: int, kind: int) -> int:
        if "threshold_slowdown" not in devices[handle]:
            raise NVMLError("Not Supported")
        return int(devices[handle]["threshold_slowdown"])

    nvml.NVMLError = NVMLError  # type: ignore[attr-defined]
    nvml.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1  # type: ignore[attr-defined]
    nvml.NVML_CLOCK_SM = 1  # type: ignore[attr-defined]
    nvml.nvmlInit = lambda: calls.append("init")  # type: ignore[attr-defined]
    nvml.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: len(devices)  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetTemperature = lambda h, kind: read(h, "temperature_gpu")  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetPowerUsage = lambda h: read(h, "power_usage_mw")  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetTemperatureThreshold = threshold  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetClockInfo = lambda h, kind: read(h, "clock_sm_mhz")  # type: ignore[attr-defined]
    nvml.calls = calls  # type: ignore[attr-defined]
    return nvml


def recorded_gpus() -> list[dict[str, Any]]:
    return list(json.loads((FIXTURES / "nvml_gpu.json").read_text())["devices"])


def test_nvml_reading_is_in_celsius_watts_and_megahertz(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake_pynvml(recorded_gpus())
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    sensor = detect_sensor("nvml")
    snap = sensor.read()
    assert sensor.name == "nvml" and snap.error is None
    assert snap.temperatures == {"gpu0": 41.0} and snap.trip_points == {"gpu0": 87.0}
    assert snap.power_w == {"gpu0": pytest.approx(118.437)} and snap.total_power_w == pytest.approx(118.437)
    assert snap.clocks_mhz == {"gpu0": 1980.0}
    sensor.close()
    assert nvml.calls == ["init", "shutdown"]


def test_nvml_sums_every_gpu_and_skips_a_threshold_it_does_not_support() -> None:
    gpus = [*recorded_gpus(), {"temperature_gpu": 55, "power_usage_mw": 300000, "clock_sm_mhz": 1500}]
    snap = NvmlSensor(fake_pynvml(gpus)).read()
    assert snap.temperatures == {"gpu0": 41.0, "gpu1": 55.0} and snap.hottest == ("gpu1", 55.0)
    assert snap.trip_points == {"gpu0": 87.0}  # gpu1 answers "Not Supported": no trip point, still read
    assert snap.total_power_w == pytest.approx(418.437)


def test_a_lost_gpu_is_a_sensor_error_and_the_next_read_recovers() -> None:
    fail = [False]
    sensor = NvmlSensor(fake_pynvml(recorded_gpus(), fail))
    fail[0] = True
    lost = sensor.read()
    assert lost.error == "NVML: GPU is lost" and lost.temperatures == {}
    fail[0] = False
    assert sensor.read().temperatures == {"gpu0": 41.0}


def test_nvml_without_a_gpu_is_refused_and_auto_falls_back_to_none(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([]))
    with pytest.raises(RuntimeError, match="NVML found no GPU"):
        detect_sensor("nvml")
    assert detect_sensor("auto", sysfs_root=tmp_path).name == "none"  # no jtop, no GPU, no sysfs sensors


# ---- Jetson actions through jtop -----------------------------------------------------------------

def recorded_jtop() -> RecordedJtop:
    return RecordedJtop()


def poll_until(service: GovernorService, level: Level, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while service.decision.level != level:
        assert time.monotonic() < deadline, f"governor stayed at {service.decision.level.name}"
        service.poll()
        time.sleep(0.01)


def test_overheating_turns_jetson_clocks_off_and_switches_the_power_mode_and_back() -> None:
    client = recorded_jtop()
    actions = JetsonActions(jetson_clocks_off=True, low_power_mode="7W", normal_power_mode="15W")
    cfg = GovernorConfig(max_temp_c=60, recover_after_s=0.05, recover_max_s=0.1, step_down_after_s=0,
                         jetson_actions=actions)
    service = GovernorService(cfg, JtopSensor(client))
    service.poll()  # the recorded 51.8 °C is inside the limit: nothing to do
    assert service.decision.level == Level.NORMAL and client.actions == []
    client.set_temperature(70.0)  # more than emergency_margin_c over the limit: pause at once
    service.poll()
    assert service.decision.level == Level.PAUSED
    assert client.actions == [("jetson_clocks", False), ("nvpmodel", "7W")]
    service.poll()  # the next reading shows the new mode; no action is repeated while paused
    assert service.snapshot is not None and service.snapshot.power_mode == "7W"
    assert len(client.actions) == 2
    client.set_temperature(45.0)
    poll_until(service, Level.NORMAL)
    assert client.actions[-1] == ("nvpmodel", "15W")


def test_jetson_actions_are_not_taken_unless_the_config_permits_them() -> None:
    client = recorded_jtop()
    service = GovernorService(GovernorConfig(max_temp_c=60), JtopSensor(client))
    client.set_temperature(70.0)
    service.poll()
    assert service.decision.level == Level.PAUSED and client.actions == []
