"""Home Assistant's MQTT discovery: the retained configs that make each camera a device's entities.

`MqttService.publish_discovery` publishes them (on connect and when cameras change) and clears the
configs of cameras that are gone."""

from __future__ import annotations

import json


def homeassistant_discovery(ha_prefix: str, prefix: str, device_id: str, cameras: list[str],
                            version: str) -> list[tuple[str, str]]:
    """Retained discovery configs: per camera a `defect` binary sensor and confidence/latency sensors."""
    device = {"identifiers": [f"edge-runtime-{device_id}"], "name": f"Edge inspection {device_id}",
              "manufacturer": "edge-runtime", "sw_version": version}
    availability = {"availability_topic": f"{prefix}/status", "payload_available": "online",
                    "payload_not_available": "offline"}
    out = []
    for cam in cameras:
        state = f"{prefix}/{cam}/result"
        uid = f"{device_id}_{cam}"
        entities = [
            ("binary_sensor", "defect", {"name": f"{cam} defect", "device_class": "problem",
                                         "value_template": "{{ 'ON' if value_json.verdict.defect else 'OFF' }}"}),
            ("sensor", "confidence", {"name": f"{cam} confidence", "unit_of_measurement": "%",
                                      "value_template": "{{ (value_json.verdict.confidence * 100) | round(1) }}"}),
            ("sensor", "latency", {"name": f"{cam} inspection time", "unit_of_measurement": "ms",
                                   "device_class": "duration",
                                   "value_template": "{{ value_json.timings_ms.total | round(0) }}"}),
        ]
        for component, key, extra in entities:
            config = {"unique_id": f"{uid}_{key}", "object_id": f"{uid}_{key}", "state_topic": state,
                      "device": device, **availability, **extra}
            out.append((f"{ha_prefix}/{component}/{uid}/{key}/config", json.dumps(config)))
    return out
