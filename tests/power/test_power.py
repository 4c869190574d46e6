"""Sensors against fixture data in their real formats, and the governor policy on board models."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edge_runtime.config import GovernorConfig
from edge_runtime.power.governor import Governor, Level
from edge_runtime.power.jetson import JtopSensor, snapshot_from_jtop
from edge_runtime.power.sensors import ReplaySensor, SysfsSensor, detect_sensor
from edge_runtime.power.snapshot import Snapshot
from tests.support.jtop import RecordedJtop

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


# ---- sensors -----------------------------------------------------------------------------------

def test_jtop_dicts_become_a_snapshot() -> None:
    data = json.loads((FIXTURES / "jtop_orin_nano.json").read_text())
    snap = snapshot_from_jtop(data["temperature"], data["power"], data["nvpmodel"])
    assert "cv0" not in snap.temperatures  # offline sensors read -256 and are skipped
    assert snap.temperatures["tj"] == 51.8 and snap.trip_points["tj"] == 99.0
    assert snap.power_w["VDD_CPU_GPU_CV"] == pytest.approx(2.411)
    assert snap.total_power_w == pytest.approx(7.991) and snap.power_mode == "15W"


def test_jtop_sensor_reports_service_loss_and_recovers() -> None:
    client = RecordedJtop(json.loads((FIXTURES / "jtop_orin_nano.json").read_text()))
    sensor = JtopSensor(client)
    assert sensor.read().error is None
    client.alive = False
    assert "stopped answering" in (sensor.read().error or "")
    client.alive = True
    assert sensor.read().total_power_w == pytest.approx(7.991)


def test_jtop_is_not_available_off_jetson() -> None:
    # In a subprocess: importing jtop probes the system and leaks file handles of its own.
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", "from edge_runtime.power.jetson import JtopSensor; JtopSensor()"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "jtop" in proc.stderr.lower()


def write_sysfs(root: Path, temp_mc: int = 48500, energy_uj: int = 1_000_000) -> None:
    zone = root / "sys/class/thermal/thermal_zone0"
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "type").write_text("cpu-thermal\n")
    (zone / "temp").write_text(f"{temp_mc}\n")
    (zone / "trip_point_0_temp").write_text("95000\n")
    (zone / "trip_point_0_type").write_text("passive\n")
    (zone / "trip_point_1_temp").write_text("105000\n")
    (zone / "trip_point_1_type").write_text("critical\n")
    hw = root / "sys/class/hwmon/hwmon1"
    hw.mkdir(parents=True, exist_ok=True)
    (hw / "name").write_text("ina3221\n")
    (hw / "in1_label").write_text("VDD_IN\n")
    (hw / "in1_input").write_text("5000\n")  # mV
    (hw / "curr1_input").write_text("1500\n")  # mA
    rapl = root / "sys/class/powercap/intel-rapl:0"
    rapl.mkdir(parents=True, exist_ok=True)
    (rapl / "name").write_text("package-0\n")
    (rapl / "energy_uj").write_text(f"{energy_uj}\n")


def test_sysfs_tree_gives_temperatures_trips_and_power(tmp_path: Path) -> None:
    write_sysfs(tmp_path)
    clock = iter([0.0, 2.0])
    sensor = SysfsSensor(tmp_path, clock=lambda: next(clock))
    first = sensor.read()
    assert first.temperatures == {"cpu-thermal": 48.5} and first.trip_points == {"cpu-thermal": 95.0}
    assert first.power_w == {"ina3221/VDD_IN": 7.5}
    write_sysfs(tmp_path, energy_uj=21_000_000)  # 20 J in 2 s
    second = sensor.read()
    assert second.power_w["rapl/package-0"] == pytest.approx(10.0)
    assert second.total_power_w == pytest.approx(17.5)


def test_sysfs_without_sensors_is_refused_and_auto_falls_back(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RuntimeError, match="no thermal zones"):
        SysfsSensor(tmp_path)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML either (an NVIDIA machine has it): import fails
    assert detect_sensor("auto", sysfs_root=tmp_path).name == "none"


def test_replay_reads_csv_and_jsonl(tmp_path: Path) -> None:
    csv_file = tmp_path / "trace.csv"
    csv_file.write_text("t,temp_tj,power_VDD_IN\n0,50.5,7.2\n1,51.0,7.9\n")
    sensor = ReplaySensor(csv_file)
    assert sensor.read().temperatures == {"tj": 50.5}
    assert sensor.read().total_power_w == pytest.approx(7.9)
    assert sensor.read().temperatures == {"tj": 50.5}  # loops
    jsonl = tmp_path / "trace.jsonl"
    jsonl.write_text(json.dumps({"t": 0, "temperatures": {"gpu0": 70}, "power_w": {"gpu0": 300},
                                 "trip_points": {"gpu0": 87}}) + "\n")
    snap = ReplaySensor(jsonl).read()
    assert snap.trip_points == {"gpu0": 87.0} and snap.total_power_w == 300.0


# ---- the policy on simulated boards --------------------------------------------------------------

@dataclass(frozen=True)
class Board:
    """A lumped thermal/power model: power follows the inspection duty cycle, temperature follows power."""

    name: str
    idle_w: float
    busy_w: float  # at full inspection rate
    ambient_c: float
    c_per_w: float  # steady-state rise per watt
    tau_s: float  # thermal time constant
    trip_c: float


BOARDS = [
    Board("orin-nano-7w", 3.0, 7.0, 35, 5.5, 120, 99),
    Board("orin-nano-15w", 3.5, 15.0, 35, 3.2, 120, 99),
    Board("orin-nano-25w", 4.0, 25.0, 30, 2.2, 120, 99),
    Board("agx-orin-30w", 8.0, 30.0, 35, 1.6, 180, 99),
    Board("agx-orin-50w", 9.0, 50.0, 35, 1.1, 180, 99),
    Board("desktop-gpu", 60.0, 350.0, 30, 0.16, 60, 87),
]


def simulate(board: Board, cfg: GovernorConfig, seconds: int = 3600, noise: float = 0.03) -> dict[str, Any]:
    gov = Governor(cfg)
    temp, rate = board.ambient_c + board.idle_w * board.c_per_w, 1.0
    powers, temps = [], []
    for t in range(seconds):
        power = board.idle_w + (board.busy_w - board.idle_w) * rate
        power *= 1 + noise * math.sin(t * 0.7)  # sensor noise, deterministic
        steady = board.ambient_c + power * board.c_per_w
        temp += (steady - temp) * (1 - math.exp(-1 / board.tau_s))
        snap = Snapshot(float(t), "sim", {"tj": temp}, {"VDD_IN": power}, power, {"tj": board.trip_c})
        rate = gov.update(snap, float(t)).rate_factor
        powers.append(power)
        temps.append(temp)
    return {"avg_power": sum(powers) / len(powers), "max_temp": max(temps), "changes": gov.changes,
            "final": gov.level}


@pytest.mark.parametrize("board", BOARDS, ids=lambda b: b.name)
def test_power_budget_holds_over_a_simulated_hour(board: Board) -> None:
    budget = board.idle_w + 0.6 * (board.busy_w - board.idle_w)  # below what it draws unthrottled
    cfg = GovernorConfig(max_power_w=budget, max_temp_c=board.trip_c - 10)
    out = simulate(board, cfg)
    assert out["avg_power"] <= budget, out
    assert out["max_temp"] < board.trip_c - 5, out
    assert out["changes"] <= 40, out  # settles instead of oscillating


@pytest.mark.parametrize("board", BOARDS, ids=lambda b: b.name)
def test_temperature_limit_from_trip_points_holds(board: Board) -> None:
    # A hot cabinet: ambient 25 °C higher than the board's usual; no power budget, limit from trip points.
    hot = Board(board.name, board.idle_w, board.busy_w, board.ambient_c + 25, board.c_per_w, board.tau_s,
                board.trip_c)
    cfg = GovernorConfig()
    out = simulate(hot, cfg)
    limit = board.trip_c - cfg.trip_margin_c
    assert out["max_temp"] < limit + cfg.emergency_margin_c, out
    assert out["changes"] <= 40, out


def test_no_throttling_inside_the_budget() -> None:
    board = BOARDS[1]
    out = simulate(board, GovernorConfig(max_power_w=board.busy_w * 1.5))
    assert out["changes"] == 0 and out["final"] == Level.NORMAL


def test_steps_down_fast_and_recovers_slowly() -> None:
    cfg = GovernorConfig(max_temp_c=80, step_down_after_s=2, recover_after_s=30)
    gov = Governor(cfg)
    hot, cool = ({"tj": 82.0}, {"tj": 60.0})
    levels = [gov.update(Snapshot(t, "s", hot if t < 10 else cool), t).level for t in range(0, 80)]
    assert levels[0] == Level.REDUCED and levels[3] >= Level.MINIMAL  # down within seconds
    first_up = next(t for t in range(10, 80) if levels[t] < levels[t - 1])
    assert first_up >= 10 + 30  # up only after 30 s of calm


def test_sensor_loss_is_conservative_and_recovers() -> None:
    cfg = GovernorConfig(max_temp_c=80, recover_after_s=5)
    gov = Governor(cfg)
    ok, lost = Snapshot(0, "s", {"tj": 50.0}), Snapshot(0, "s", error="jtop: service stopped")
    assert gov.update(ok, 0).level == Level.NORMAL
    decision = gov.update(lost, 1)
    assert decision.level == Level.REDUCED and "sensor failed" in decision.reasons[0]
    levels = [gov.update(ok, t).level for t in range(2, 20)]
    assert levels[-1] == Level.NORMAL


def test_far_over_the_limit_pauses_at_once() -> None:
    gov = Governor(GovernorConfig(max_temp_c=80))
    assert gov.update(Snapshot(0, "s", {"tj": 90.0}), 0).level == Level.PAUSED


# ---- the governor inside the daemon ---------------------------------------------------------------

def _daemon_with_trace(tmp_path: Path, demo_dir: Path, temp: float) -> Any:
    from edge_runtime.app.daemon import Daemon
    from edge_runtime.config import CameraConfig, Config, TriggerConfig
    from edge_runtime.core.samples import write_sample_video

    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"t": t, "temperatures": {"tj": temp}, "power_w": {"VDD_IN": 9.5},
                                          "trip_points": {"tj": 99.0}}) + "\n" for t in range(5)))
    cfg = Config(device_id="gov", data_dir=tmp_path / "data")
    cfg.model.path, cfg.model.threads = demo_dir, 2
    cfg.mqtt.enabled = False
    cfg.api.port = 0
    cfg.governor = GovernorConfig(sensor="replay", replay_file=trace, interval_s=0.1)
    cfg.cameras = [CameraConfig(name="cam", source=str(write_sample_video(tmp_path / "v.avi", frames=20)), fps=20,
                                trigger=TriggerConfig(mode="interval", interval_s=0.1))]
    daemon = Daemon(cfg)
    daemon.start()
    return daemon


def test_a_hot_device_pauses_inspection(tmp_path: Path, demo_dir: Path) -> None:
    import time
    daemon = _daemon_with_trace(tmp_path, demo_dir, temp=97.0)  # limit 89 °C, far over: pause
    try:
        time.sleep(1.5)
        status = daemon.status()
        assert status["governor"]["level"] == "paused" and status["cameras"][0]["frames"]["inspected"] == 0
        assert status["cameras"][0]["frames"]["skipped_paused"] > 0
        assert "far over the limit" in status["governor"]["reasons"][0]
        text = daemon.api.app.test_client().get("/metrics").get_data(as_text=True)
        assert "edge_governor_level 3.0" in text and 'edge_temperature_celsius{sensor="tj"} 97.0' in text
    finally:
        daemon.stop()


def test_results_carry_governor_state_and_energy(tmp_path: Path, demo_dir: Path) -> None:
    import time
    daemon = _daemon_with_trace(tmp_path, demo_dir, temp=55.0)
    try:
        deadline = time.monotonic() + 15
        while daemon.journal.counts()["total"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        result = daemon.journal.query(limit=1)[0]
        assert result["governor"]["level"] == "normal" and result["governor"]["power_w"] == 9.5
        assert result["energy_j"] > 0 and daemon.telemetry()["governor"]["sensor"] == "replay"
    finally:
        daemon.stop()
