"""The governor: a pure policy from sensor snapshots to a level, and the service that applies it.

Levels: normal (full rate), reduced, minimal, paused. Over budget it steps down quickly; it steps
back up only after the device has been comfortably inside the budget for a while, and each step up
that is followed by a quick fall back doubles that wait, so it settles instead of oscillating.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from edge_runtime.config import GovernorConfig
from edge_runtime.core.errors import EdgeRuntimeError
from edge_runtime.core.governor_gate import GateDecision
from edge_runtime.power.sensors import detect_sensor
from edge_runtime.power.snapshot import Sensor, Snapshot

log = logging.getLogger(__name__)


class Level(IntEnum):
    NORMAL = 0
    REDUCED = 1
    MINIMAL = 2
    PAUSED = 3


@dataclass
class Decision:
    level: Level
    rate_factor: float
    reasons: list[str] = field(default_factory=list)
    temperature_limit_c: float | None = None
    power_avg_w: float | None = None
    changed: bool = False


class Governor:
    """Pure: `update(snapshot, now)` -> Decision. No threads, no clocks of its own."""

    def __init__(self, cfg: GovernorConfig) -> None:
        self.cfg = cfg
        self.rates = {Level.NORMAL: 1.0, Level.REDUCED: cfg.reduced_rate, Level.MINIMAL: cfg.minimal_rate,
                      Level.PAUSED: 0.0}
        self.level = Level.NORMAL
        self.changes = 0
        self._last_change = float("-inf")
        self._calm_since: float | None = None
        self._up_wait = cfg.recover_after_s
        self._last_up: float | None = None
        self._power: deque[tuple[float, float]] = deque()

    def temperature_limit(self, snap: Snapshot) -> float | None:
        """Configured limit, else the lowest trip point read at run time minus the margin."""
        if self.cfg.max_temp_c is not None:
            return self.cfg.max_temp_c
        if snap.trip_points:
            return min(snap.trip_points.values()) - self.cfg.trip_margin_c
        return None

    def _avg_power(self, snap: Snapshot, now: float) -> float | None:
        if snap.total_power_w is not None:
            self._power.append((now, snap.total_power_w))
        while self._power and now - self._power[0][0] > self.cfg.power_window_s:
            self._power.popleft()
        if not self._power:
            return None
        return sum(p for _, p in self._power) / len(self._power)

    def update(self, snap: Snapshot, now: float) -> Decision:
        reasons: list[str] = []
        limit = self.temperature_limit(snap)
        avg = self._avg_power(snap, now)
        over = calm = False
        target = self.level
        if snap.error:
            # A blind governor is a careful one: never above REDUCED until the sensor is back.
            reasons.append(f"sensor failed: {snap.error}")
            target = max(self.level, Level.REDUCED)
            self._calm_since = None
        else:
            hottest = snap.hottest
            temp_over = temp_calm = False
            if limit is not None and hottest is not None:
                name, value = hottest
                if value >= limit + self.cfg.emergency_margin_c:
                    reasons.append(f"{name} {value:.1f} °C is far over the limit {limit:.1f} °C")
                    target = Level.PAUSED
                    temp_over = True
                elif value >= limit:
                    reasons.append(f"{name} {value:.1f} °C >= limit {limit:.1f} °C")
                    temp_over = True
                temp_calm = value <= limit - self.cfg.temp_hysteresis_c
            else:
                temp_calm = True
            power_over = power_calm = False
            if self.cfg.max_power_w is not None and avg is not None:
                if avg > self.cfg.max_power_w:
                    reasons.append(f"power {avg:.1f} W (avg {self.cfg.power_window_s:.0f} s) > budget "
                                   f"{self.cfg.max_power_w:.1f} W")
                    power_over = True
                power_calm = avg <= self.cfg.max_power_w * (1 - self.cfg.power_hysteresis)
            else:
                power_calm = True
            over = temp_over or power_over
            calm = temp_calm and power_calm
            if over and target < Level.PAUSED and now - self._last_change >= self.cfg.step_down_after_s:
                target = Level(self.level + 1)
            if not over and calm:
                self._calm_since = self._calm_since if self._calm_since is not None else now
            else:
                self._calm_since = None
            if (calm and self.level > Level.NORMAL and self._calm_since is not None
                    and now - self._calm_since >= self._up_wait and now - self._last_change >= self._up_wait):
                target = Level(self.level - 1)
        if not reasons:
            reasons.append("within budget" if self.level == Level.NORMAL or not calm else "recovering")
        changed = target != self.level
        if changed:
            if target < self.level:
                self._last_up = now
            elif self._last_up is not None and now - self._last_up < 2 * self._up_wait:
                # Stepping up did not hold: wait twice as long before trying again.
                self._up_wait = min(self._up_wait * 2, self.cfg.recover_max_s)
            self.level = target
            self._last_change = now
            self._calm_since = None
            self._power.clear()  # judge the new level on its own power, not the old level's
            self.changes += 1
        elif self.level == Level.NORMAL and calm and now - self._last_change > 4 * self.cfg.recover_max_s:
            self._up_wait = self.cfg.recover_after_s  # long calm: forget earlier oscillation
        return Decision(self.level, self.rates[self.level], reasons, limit, avg, changed)


class GovernorService:
    """Polls the sensor, runs the policy, serves the scheduler gate, integrates energy."""

    def __init__(self, cfg: GovernorConfig, sensor: Sensor) -> None:
        self.cfg = cfg
        self.sensor = sensor
        self.policy = Governor(cfg)
        self.snapshot: Snapshot | None = None
        self.decision = Decision(Level.NORMAL, 1.0, ["starting"])
        self.history: deque[dict[str, Any]] = deque(maxlen=600)
        self._samples: deque[tuple[float, float]] = deque(maxlen=3600)  # (monotonic, total W)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="governor", daemon=True)

    @classmethod
    def from_config(cls, cfg: GovernorConfig) -> GovernorService:
        """On the sensor `cfg.sensor` names (or the one found); a sensor that cannot be read: one line."""
        try:
            sensor = detect_sensor(cfg.sensor, cfg.replay_file)
        except (RuntimeError, ValueError) as exc:
            raise EdgeRuntimeError(f"governor: {exc}") from None
        return cls(cfg, sensor)

    def start(self) -> None:
        self.poll()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(3)
        self.sensor.close()

    def _run(self) -> None:
        while not self._stop.wait(self.cfg.interval_s):
            self.poll()

    def poll(self) -> None:
        now = time.monotonic()
        try:
            snap = self.sensor.read()
        except Exception as exc:  # noqa: BLE001 - a sensor must never take the daemon down
            snap = Snapshot(time.time(), self.sensor.name, error=str(exc))
        decision = self.policy.update(snap, now)
        with self._lock:
            self.snapshot, self.decision = snap, decision
            if snap.total_power_w is not None:
                self._samples.append((now, snap.total_power_w))
            self.history.append({"t": snap.ts, "temp": snap.hottest[1] if snap.hottest else None,
                                 "power_w": snap.total_power_w, "level": decision.level.name.lower()})
        if decision.changed:
            log.warning("governor: %s (%s)", decision.level.name.lower(), "; ".join(decision.reasons))
            self._act(decision.level)

    def _act(self, level: Level) -> None:
        """Optional Jetson actions, only when the config permits them."""
        actions = self.cfg.jetson_actions
        try:
            if actions.jetson_clocks_off and level >= Level.REDUCED and hasattr(self.sensor, "set_jetson_clocks"):
                self.sensor.set_jetson_clocks(False)
            if actions.low_power_mode is not None and hasattr(self.sensor, "set_power_mode"):
                if level >= Level.MINIMAL:
                    self.sensor.set_power_mode(actions.low_power_mode)
                elif level == Level.NORMAL and actions.normal_power_mode is not None:
                    self.sensor.set_power_mode(actions.normal_power_mode)
        except Exception as exc:  # noqa: BLE001 - an action that fails is reported, not fatal
            log.error("governor: Jetson action failed: %s", exc)

    # ---- the scheduler gate -----------------------------------------------------------------

    def decision_for_gate(self) -> GateDecision:
        with self._lock:
            d = self.decision
        return GateDecision(rate_factor=d.rate_factor, paused=d.level == Level.PAUSED, state=self.state())

    def state(self) -> dict[str, Any]:
        with self._lock:
            snap, d = self.snapshot, self.decision
        return {
            "level": d.level.name.lower(), "level_index": int(d.level), "rate_factor": d.rate_factor,
            "reasons": d.reasons, "sensor": self.sensor.name, "sensor_error": snap.error if snap else None,
            "temperatures": dict(snap.temperatures) if snap else {},
            "temperature_limit_c": d.temperature_limit_c,
            "power": dict(snap.power_w) if snap else {},
            "power_w": snap.total_power_w if snap else None, "power_avg_w": d.power_avg_w,
            "power_budget_w": self.cfg.max_power_w, "power_mode": snap.power_mode if snap else None,
            "changes": self.policy.changes,
        }

    def energy_j(self, start: float, end: float) -> float | None:
        """Joules between two time.monotonic() instants: mean sampled power x duration."""
        with self._lock:
            samples = list(self._samples)
        if not samples or end <= start:
            return None
        inside = [p for t, p in samples if start <= t <= end]
        if not inside:  # shorter than the sampling interval: use the nearest reading before the end
            before = [p for t, p in samples if t <= end]
            inside = [before[-1] if before else samples[0][1]]
        return round(sum(inside) / len(inside) * (end - start), 4)


class GovernorGate:
    """Adapts the service to the scheduler's Gate protocol."""

    def __init__(self, service: GovernorService) -> None:
        self.service = service

    def decision(self) -> GateDecision:
        return self.service.decision_for_gate()
