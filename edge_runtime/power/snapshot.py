"""One sensor reading and the sensor interface, apart from the backends so that each backend
(`sensors.py`, `jetson.py`) imports only this and `detect_sensor` can import the backends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Snapshot:
    """One reading. Temperatures in °C, power in W; empty dicts where a device has no such sensor."""

    ts: float
    source: str
    temperatures: dict[str, float] = field(default_factory=dict)
    power_w: dict[str, float] = field(default_factory=dict)  # by rail
    total_power_w: float | None = None
    trip_points: dict[str, float] = field(default_factory=dict)  # lowest passive/critical trip per sensor
    power_mode: str | None = None
    clocks_mhz: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # the sensor failed: the governor turns conservative

    @property
    def hottest(self) -> tuple[str, float] | None:
        if not self.temperatures:
            return None
        name = max(self.temperatures, key=lambda k: self.temperatures[k])
        return name, self.temperatures[name]


class Sensor(Protocol):
    name: str

    def read(self) -> Snapshot: ...

    def close(self) -> None: ...
