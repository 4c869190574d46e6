"""Sensors (jtop | NVML | sysfs | replay) and the governor that holds the thermal/power budget."""

from edge_runtime.power.governor import Decision, Governor, GovernorGate, GovernorService, Level
from edge_runtime.power.sensors import NullSensor, ReplaySensor, SysfsSensor, detect_sensor
from edge_runtime.power.snapshot import Sensor, Snapshot

__all__ = ["Decision", "Governor", "GovernorGate", "GovernorService", "Level", "NullSensor", "ReplaySensor",
           "Sensor", "Snapshot", "SysfsSensor", "detect_sensor"]
