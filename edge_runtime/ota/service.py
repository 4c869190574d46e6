"""Runs the update agent: manifests from MQTT (`<prefix>/cmd/ota`, group topics) or a polled URL,
progress on `<prefix>/ota/status`. One update at a time, in arrival order."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from ..config import Config
from ..mqtt import configure_client
from .agent import OtaAgent

log = logging.getLogger(__name__)


def make_agent(config: Config, client: Any, publish: Any) -> OtaAgent:
    ota = config.ota
    state = (ota.state_dir or config.data_dir / "ota") / "state.json"
    return OtaAgent(client, ota.container, Path(state), list(ota.public_keys), publish,
                    ota.health_timeout_s, ota.allow_downgrade)


def run_agent(config: Config, stop: threading.Event | None = None) -> None:
    """The `edge-runtime ota agent` loop (blocks until `stop` is set or the process is signalled)."""
    import docker

    stop = stop or threading.Event()
    prefix = config.topic_prefix()
    inbox: queue.Queue[bytes] = queue.Queue()
    m = config.mqtt
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"edge-ota-{config.device_id}")
    configure_client(client, m)
    topics = [f"{prefix}/cmd/ota", *(f"edge/group/{g}/cmd/ota" for g in config.ota.groups)]
    def on_connect(c: mqtt.Client, *_: Any) -> None:
        for topic in topics:
            c.subscribe(topic, qos=1)

    client.on_connect = on_connect
    client.on_message = lambda _c, _u, msg: inbox.put(bytes(msg.payload))
    client.connect_async(m.host, m.port, m.keepalive)
    client.loop_start()

    def publish(status: dict[str, Any]) -> None:
        client.publish(f"{prefix}/ota/status", json.dumps(status), qos=1, retain=True)

    agent = make_agent(config, docker.from_env(), publish)
    agent.recover()
    next_poll = time.monotonic()
    seen_url_manifest: str | None = None
    try:
        while not stop.is_set():
            try:
                payload = inbox.get(timeout=1.0)
            except queue.Empty:
                payload = None
            if payload is None and config.ota.manifest_url and time.monotonic() >= next_poll:
                next_poll = time.monotonic() + config.ota.poll_interval_s
                try:
                    with urllib.request.urlopen(config.ota.manifest_url, timeout=30) as resp:
                        body = resp.read(1 << 20)
                    if body.decode(errors="replace") != seen_url_manifest:
                        seen_url_manifest = body.decode(errors="replace")
                        payload = body
                except OSError as exc:
                    log.warning("ota: polling %s failed: %s", config.ota.manifest_url, exc)
            if payload is not None:
                agent.handle(payload)
    finally:
        client.loop_stop()
        client.disconnect()
