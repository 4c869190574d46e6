"""Sensors (jtop | NVML | sysfs | replay) and the governor that holds the thermal/power budget."""

from .governor import Decision, Governor, GovernorGate, GovernorService, Level
from .sensors import NullSensor, ReplaySensor, Sensor, Snapshot, SysfsSensor, detect_sensor

__all__ = ["Decision", "Governor", "GovernorGate", "GovernorService", "Level", "NullSensor", "ReplaySensor",
           "Sensor", "Snapshot", "SysfsSensor", "detect_sensor"]
