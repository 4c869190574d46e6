"""`governor:`: the thermal and power budget and its optional Jetson actions."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from edge_runtime.config.base import ConfigPath, Section


class JetsonActions(Section):
    jetson_clocks_off: bool = Field(False, description="Turn jetson_clocks off when throttling (needs the "
                                    "jtop service and permission).")
    low_power_mode: int | str | None = Field(None, description="nvpmodel mode to switch to at minimal/paused.")
    normal_power_mode: int | str | None = Field(None, description="nvpmodel mode to restore at normal.")


class GovernorConfig(Section):
    enabled: bool = Field(True, description="Hold the thermal and power budget.")
    sensor: Literal["auto", "jtop", "nvml", "sysfs", "replay", "none"] = Field(
        "auto", description="Sensor backend; auto tries jtop, NVML, then sysfs.")
    replay_file: ConfigPath | None = Field(None, description="Recorded trace (JSONL or CSV) for sensor: replay.")
    interval_s: float = Field(1.0, ge=0.1, le=60, description="Seconds between sensor readings.")
    max_temp_c: float | None = Field(None, description="Hottest sensor limit; empty: the lowest trip "
                                     "point read at run time minus trip_margin_c.")
    trip_margin_c: float = Field(10, ge=0, description="Stay this far below the lowest trip point.")
    emergency_margin_c: float = Field(5, gt=0, description="This far over the limit pauses at once.")
    temp_hysteresis_c: float = Field(5, gt=0, description="Recover only this far below the limit.")
    max_power_w: float | None = Field(None, gt=0, description="Average power budget in watts (empty: none).")
    power_window_s: float = Field(10, gt=0, description="Window of the power average.")
    power_hysteresis: float = Field(0.1, ge=0, lt=1, description="Recover only below budget x (1 - this).")
    step_down_after_s: float = Field(3, ge=0, description="Least time between two steps down.")
    recover_after_s: float = Field(30, gt=0, description="Calm time before a step up; doubles after a "
                                   "step up that did not hold.")
    recover_max_s: float = Field(600, gt=0, description="Longest wait before a step up.")
    reduced_rate: float = Field(0.5, gt=0, le=1, description="Inspection rate factor at the reduced level.")
    minimal_rate: float = Field(0.2, gt=0, le=1, description="Inspection rate factor at the minimal level.")
    jetson_actions: JetsonActions = Field(default_factory=JetsonActions, description="Optional Jetson actions.")
