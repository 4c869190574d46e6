"""Sensors (jtop | NVML | sysfs | replay) and the governor that holds the thermal/power budget:
`snapshot.py`, `sensors.py` (jtop in `jetson.py`), `governor.py`. Import from the module that defines a name."""
