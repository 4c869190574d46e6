"""Sensors (jtop | NVML | sysfs | replay) and the governor that holds the thermal/power budget:
`snapshot.py`, `sensors.py`, `jetson.py` and `governor.py`."""
