"""jetson-stats (jtop) adapter: the only module that imports jtop.

jtop's client reads one dict from the root jtop service over /run/jtop.sock; we turn it into our
Snapshot and never let jtop's types leak further. Power-mode and jetson_clocks actions go through
the same client, only when the config permits them.
"""

from __future__ import annotations

import time
from typing import Any

from edge_runtime.power.snapshot import Snapshot


class JtopSensor:
    name = "jtop"

    def __init__(self, client: Any = None) -> None:
        if client is None:
            from jtop import jtop  # raises JtopException off-Jetson or when the service is down

            client = jtop()
            client.start()
        self.j = client

    def read(self) -> Snapshot:
        try:
            if hasattr(self.j, "ok") and not self.j.ok():
                return Snapshot(time.time(), self.name, error="jtop service stopped answering")
            return snapshot_from_jtop(self.j.temperature, self.j.power, self._mode())
        except Exception as exc:  # noqa: BLE001 - jtop raises JtopException, OSError, KeyError...
            return Snapshot(time.time(), self.name, error=f"jtop: {exc}")

    def _mode(self) -> str | None:
        mode = getattr(self.j, "nvpmodel", None)
        return str(mode) if mode is not None else None

    def set_power_mode(self, mode: str | int) -> None:
        self.j.nvpmodel = mode

    def set_jetson_clocks(self, on: bool) -> None:
        self.j.jetson_clocks = on

    def close(self) -> None:
        try:
            self.j.close()
        except Exception:  # noqa: BLE001 - closing a dead connection is fine
            pass


def snapshot_from_jtop(temperature: dict[str, Any], power: dict[str, Any], mode: str | None) -> Snapshot:
    """jtop 4.x+ dicts -> Snapshot. Offline sensors read -256 °C and are skipped."""
    temps: dict[str, float] = {}
    trips: dict[str, float] = {}
    for name, t in (temperature or {}).items():
        if not t.get("online", True) or t.get("temp", -256) <= -256:
            continue
        temps[name] = float(t["temp"])
        levels = [float(t[k]) for k in ("max", "crit") if t.get(k) not in (None, -256)]
        if levels:
            trips[name] = min(levels)
    rails: dict[str, float] = {}
    for name, rail in ((power or {}).get("rail") or {}).items():
        if rail.get("online", True) and "power" in rail:
            rails[name] = rail["power"] / 1000.0  # mW -> W
    tot = (power or {}).get("tot") or {}
    total = tot["power"] / 1000.0 if "power" in tot else (sum(rails.values()) if rails else None)
    return Snapshot(time.time(), "jtop", temps, rails, total, trips, mode)
