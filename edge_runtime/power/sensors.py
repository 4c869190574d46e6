"""Power and temperature sensors behind one small interface: `read() -> Snapshot`.

Backends: jetson-stats (see jetson.py, the only module importing jtop), NVML, Linux sysfs, and a
replay of a recorded trace. `detect_sensor` picks the first that works, in that order.
"""

from __future__ import annotations

import csv
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_runtime.power.snapshot import Sensor, Snapshot

log = logging.getLogger(__name__)


class NullSensor:
    """No sensors on this machine: the governor stays at normal and says so."""

    name = "none"

    def read(self) -> Snapshot:
        return Snapshot(time.time(), self.name)

    def close(self) -> None:
        pass


# ---- NVML (desktop/datacenter NVIDIA GPUs) ------------------------------------------------------

class NvmlSensor:
    """GPU temperature, power draw and slowdown threshold per GPU through nvidia-ml-py."""

    name = "nvml"

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml  # nvidia-ml-py

            nvml = pynvml
        self.nvml = nvml
        nvml.nvmlInit()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        if not self.handles:
            raise RuntimeError("NVML found no GPU")

    def read(self) -> Snapshot:
        n = self.nvml
        temps, power, trips, clocks = {}, {}, {}, {}
        try:
            for i, h in enumerate(self.handles):
                temps[f"gpu{i}"] = float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))
                power[f"gpu{i}"] = n.nvmlDeviceGetPowerUsage(h) / 1000.0
                try:
                    trips[f"gpu{i}"] = float(n.nvmlDeviceGetTemperatureThreshold(
                        h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN))
                except n.NVMLError:
                    pass
                clocks[f"gpu{i}"] = float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))
        except n.NVMLError as exc:
            return Snapshot(time.time(), self.name, error=f"NVML: {exc}")
        return Snapshot(time.time(), self.name, temps, power, sum(power.values()), trips, None, clocks)

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a broken NVML is not worth a crash
            pass


# ---- Linux sysfs (any board) ----------------------------------------------------------------

class SysfsSensor:
    """thermal_zone temperatures and trip points, hwmon power/voltage/current, RAPL energy counters."""

    name = "sysfs"

    def __init__(self, root: Path | str = "/", clock: Callable[[], float] = time.monotonic) -> None:
        self.root = Path(root)
        self.clock = clock
        self._rapl_last: dict[str, tuple[float, int]] = {}
        if not self._zones() and not self._hwmons() and not self._rapl():
            raise RuntimeError(f"no thermal zones, hwmon or RAPL under {self.root / 'sys/class'}")

    def _zones(self) -> list[Path]:
        return sorted((self.root / "sys/class/thermal").glob("thermal_zone*"))

    def _hwmons(self) -> list[Path]:
        return sorted((self.root / "sys/class/hwmon").glob("hwmon*"))

    def _rapl(self) -> list[Path]:
        return sorted(p for p in (self.root / "sys/class/powercap").glob("intel-rapl:*")
                      if (p / "energy_uj").exists() and p.name.count(":") == 1)

    def read(self) -> Snapshot:
        temps: dict[str, float] = {}
        trips: dict[str, float] = {}
        power: dict[str, float] = {}
        for zone in self._zones():
            name = _read(zone / "type") or zone.name
            raw = _read_int(zone / "temp")
            if raw is None or raw <= -40000:  # offline sensors read absurdly low values
                continue
            temps[name] = raw / 1000.0
            levels = [t / 1000.0 for t in self._trip_points(zone) if t > 0]
            if levels:
                trips[name] = min(levels)
        for hw in self._hwmons():
            chip = _read(hw / "name") or hw.name
            for f in sorted(hw.glob("power*_input")):
                uw = _read_int(f)
                if uw is not None:
                    power[f"{chip}/{_read(hw / f.name.replace('_input', '_label')) or f.name[:-6]}"] = uw / 1e6
            for f in sorted(hw.glob("in*_input")):  # INA3221-style rails: volts x amps
                curr = hw / f.name.replace("in", "curr", 1)
                mv, ma = _read_int(f), _read_int(curr)
                if mv is not None and ma is not None:
                    label = _read(hw / f.name.replace("_input", "_label")) or f.name[:-6]
                    power[f"{chip}/{label}"] = mv * ma / 1e6
        now = self.clock()
        for domain in self._rapl():
            uj = _read_int(domain / "energy_uj")
            if uj is None:
                continue
            name = f"rapl/{_read(domain / 'name') or domain.name}"
            last = self._rapl_last.get(name)
            self._rapl_last[name] = (now, uj)
            if last and now > last[0] and uj >= last[1]:
                power[name] = (uj - last[1]) / 1e6 / (now - last[0])
        total = sum(power.values()) if power else None
        return Snapshot(time.time(), self.name, temps, power, total, trips)

    @staticmethod
    def _trip_points(zone: Path) -> list[int]:
        out = []
        for f in zone.glob("trip_point_*_temp"):
            kind = _read(zone / f.name.replace("_temp", "_type"))
            value = _read_int(f)
            if value is not None and kind in ("passive", "critical", "hot"):
                out.append(value)
        return out

    def close(self) -> None:
        pass


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


# ---- replay of a recorded trace -------------------------------------------------------------

class ReplaySensor:
    """Plays a recorded trace (JSONL of Snapshot-like objects, or CSV with temp_*/power_* columns).

    Row i is returned at the i-th read, or at recorded time when `realtime` is set; it loops.
    """

    name = "replay"

    def __init__(self, path: Path | str, realtime: bool = False) -> None:
        self.path = Path(path)
        self.rows = _load_trace(self.path)
        if not self.rows:
            raise RuntimeError(f"{self.path} holds no samples")
        self.realtime = realtime
        self._i = 0
        self._t0 = time.monotonic()

    def read(self) -> Snapshot:
        if self.realtime:
            start = self.rows[0].get("t", 0.0)
            span = (self.rows[-1].get("t", 0.0) - start) or 1.0
            elapsed = (time.monotonic() - self._t0) % span
            row = next((r for r in self.rows if r.get("t", 0.0) - start >= elapsed), self.rows[-1])
        else:
            row = self.rows[self._i % len(self.rows)]
            self._i += 1
        power = {k: float(v) for k, v in (row.get("power_w") or {}).items()}
        total = row.get("total_power_w")
        return Snapshot(time.time(), self.name, {k: float(v) for k, v in (row.get("temperatures") or {}).items()},
                        power, float(total) if total is not None else (sum(power.values()) if power else None),
                        {k: float(v) for k, v in (row.get("trip_points") or {}).items()},
                        row.get("power_mode"), error=row.get("error"))

    def close(self) -> None:
        pass


def _load_trace(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".csv":
        rows = []
        with path.open() as f:
            for rec in csv.DictReader(f):
                row: dict[str, Any] = {"t": float(rec.pop("t", 0) or 0), "temperatures": {}, "power_w": {}}
                for key, value in rec.items():
                    if value in ("", None):
                        continue
                    if key.startswith("temp_"):
                        row["temperatures"][key[5:]] = float(value)
                    elif key.startswith("power_"):
                        row["power_w"][key[6:]] = float(value)
                    elif key == "total_power_w":
                        row["total_power_w"] = float(value)
                rows.append(row)
        return rows
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def detect_sensor(kind: str = "auto", replay_file: Path | None = None, sysfs_root: Path | str = "/") -> Sensor:
    """The configured sensor, or for `auto` the first of jtop, NVML, sysfs that works."""
    if kind == "replay":
        if replay_file is None:
            raise ValueError("governor.sensor is replay but governor.replay_file is not set")
        return ReplaySensor(replay_file, realtime=True)
    if kind == "none":
        return NullSensor()
    attempts: list[tuple[str, Callable[[], Sensor]]] = []
    on_jetson = Path(sysfs_root, "etc/nv_tegra_release").exists() or Path(sysfs_root, "run/jtop.sock").exists()
    if kind == "jtop" or (kind == "auto" and on_jetson):  # jtop probes the system when imported: Jetson only
        from edge_runtime.power.jetson import JtopSensor
        attempts.append(("jtop", JtopSensor))
    if kind in ("auto", "nvml"):
        attempts.append(("nvml", NvmlSensor))
    if kind in ("auto", "sysfs"):
        attempts.append(("sysfs", lambda: SysfsSensor(sysfs_root)))
    errors = []
    for name, factory in attempts:
        try:
            sensor = factory()
            log.info("power: using %s sensors", name)
            return sensor
        except Exception as exc:  # noqa: BLE001 - each backend fails in its own way off its platform
            errors.append(f"{name}: {exc}")
    if kind != "auto":
        raise RuntimeError(f"the {kind} sensor is not available: {'; '.join(errors)}")
    log.info("power: no sensors found (%s); the governor will not throttle", "; ".join(errors))
    return NullSensor()
