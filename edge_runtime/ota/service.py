"""Runs the update agent: releases from one source — manifests from MQTT (`<prefix>/cmd/ota`, group
topics) and a polled URL, or a hawkBit DDI server (`ota.hawkbit`, `ota/ddi/`) — with progress on
`<prefix>/ota/status`. One update at a time, in arrival order."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from edge_runtime.config import Config
from edge_runtime.core import http
from edge_runtime.core.supervise import RateLimitedLog
from edge_runtime.delivery.mqtt.client import configure_client
from edge_runtime.ota.agent import AgentStopping, OtaAgent
from edge_runtime.ota.manifest import MAX_MANIFEST_BYTES
from edge_runtime.ota.recovery import EngineWait, Recovery, engine_gone
from edge_runtime.ota.update_lock import UpdateLock

log = logging.getLogger(__name__)


POLL_TIMEOUT_S = 30.0  # the whole request, redirects included: the agent's loop waits for it
# Manifests from MQTT waiting while the agent applies one (which may wait hours for the line): later ones
# are refused "another update is in progress" anyway, so a flood is dropped rather than kept.
MAX_WAITING_MANIFESTS = 8


class ManifestInbox:
    """Manifests from MQTT for the agent's loop, bounded in number and each in size."""

    def __init__(self) -> None:
        self.queue: queue.Queue[bytes] = queue.Queue(MAX_WAITING_MANIFESTS)
        self.dropped = 0
        self._log = RateLimitedLog(log)

    def offer(self, payload: bytes | bytearray, topic: str = "") -> None:
        """Paho's thread; never blocks. An oversized payload keeps one byte past the bound: enough for
        the agent to refuse it, with its reason on the status topic, without keeping the rest. An empty
        (or blank) payload is no manifest: it is how an operator clears a retained one."""
        kept = bytes(payload[:MAX_MANIFEST_BYTES + 1])
        if len(kept) <= MAX_MANIFEST_BYTES and not kept.strip():  # an oversized one is refused, blank or not
            log.info("ota: an empty message on %s (a cleared retained manifest): no manifest, nothing to do", topic)
            return
        try:
            self.queue.put_nowait(kept)
        except queue.Full:
            self.dropped += 1
            self._log.log(logging.WARNING, "ota: %d manifests already wait for the agent; dropped one more "
                          "(%d in all)", MAX_WAITING_MANIFESTS, self.dropped)


class ManifestPoller:
    """GET the manifest URL within one overall deadline (a socket timeout restarts with every byte,
    so a server that drips held the agent's loop, and the MQTT manifests behind it, forever).
    Failures are logged the first time, then once every 10 minutes with the count, and the recovery."""

    def __init__(self, timeout_s: float = POLL_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.failures = 0  # consecutive
        self._logged = -1e9

    def poll(self, url: str) -> bytes | None:
        try:
            resp = http.request("GET", url, timeout_s=self.timeout_s, limit=MAX_MANIFEST_BYTES,
                                headers={"Accept": "application/json", "User-Agent": "edge-runtime-ota"},
                                follow_redirects=True)
            if len(resp.body) > MAX_MANIFEST_BYTES:
                raise http.HttpFailure(f"manifest larger than {MAX_MANIFEST_BYTES // 1024} KiB", retry=False)
        except http.HttpFailure as exc:
            self.failures += 1
            now = time.monotonic()
            if now - self._logged >= 600:
                self._logged = now
                log.warning("ota: polling %s failed: %s (%d times in a row)", url, exc, self.failures)
            return None
        if self.failures:
            log.info("ota: polling %s works again after %d failures", url, self.failures)
            self.failures, self._logged = 0, -1e9
        return resp.body


class DockerEngine:
    """The Docker client (`docker.from_env()`), made when first used and again after each failure to make
    it: making it asks the engine for its API version, so made at start it raised, and ended the agent,
    whenever the engine was not up yet (boot). A failure surfaces where the agent uses the engine, so the
    recovery's retries and a manifest's error handling cover it."""

    def __init__(self) -> None:
        self._client: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._client is None:
            import docker

            self._client = docker.from_env()
        return getattr(self._client, name)


def make_agent(config: Config, client: Any, publish: Any) -> OtaAgent:
    ota = config.ota
    state = (ota.state_dir or config.data_dir / "ota") / "state.json"
    lock = None
    if ota.lock_file is not None or ota.maintenance_window:
        lock = UpdateLock(ota.lock_file, ota.maintenance_window, ota.lock_max_wait_s, ota.on_lock_timeout)
    return OtaAgent(client, ota.container, Path(state), list(ota.public_keys), publish,
                    ota.health_timeout_s, ota.allow_downgrade, lock=lock)


def run_ddi_agent(config: Config, stop: threading.Event, publish: Any, engine: Any = None) -> None:
    """The agent with a DDI server as its one source (blocks until `stop`)."""
    from edge_runtime.ota.ddi.attributes import device_attributes
    from edge_runtime.ota.ddi.client import DdiClient
    from edge_runtime.ota.ddi.runner import DdiSource

    hb = config.ota.hawkbit
    assert hb is not None
    agent = make_agent(config, engine or DockerEngine(), publish)
    client = DdiClient(hb, hb.controller_id or config.device_id)
    source = DdiSource(client, agent, agent.state_path.parent / "ddi.json",
                       lambda: device_attributes(config, agent.current_version()), stop,
                       poll_override_s=hb.poll_interval_s, publish=publish)
    log.info("ota: taking releases from the DDI server %s as %s", hb.url, client.base.rsplit("/", 1)[-1])
    source.run()


def run_agent(config: Config, stop: threading.Event | None = None, engine: Any = None) -> None:
    """The `edge-runtime ota agent` loop (blocks until `stop` is set or the process is signalled).
    `engine`: the Docker client (default: `DockerEngine`, made on first use)."""
    stop = stop or threading.Event()
    prefix = config.topic_prefix()
    inbox = ManifestInbox()
    m = config.mqtt
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"edge-ota-{config.device_id}")
    configure_client(client, m)
    ddi = config.ota.hawkbit is not None  # one source at a time: then MQTT only carries the statuses
    topics = [] if ddi else [f"{prefix}/cmd/ota", *(f"edge/group/{g}/cmd/ota" for g in config.ota.groups)]
    def on_connect(c: mqtt.Client, *_: Any) -> None:
        for topic in topics:
            c.subscribe(topic, qos=1)

    client.on_connect = on_connect
    client.on_message = lambda _c, _u, msg: inbox.offer(msg.payload, msg.topic)
    use_mqtt = m.enabled or not ddi  # with a DDI source and mqtt.enabled false, statuses go to the server only
    if use_mqtt:
        client.connect_async(m.host, m.port, m.keepalive)
        client.loop_start()

    def publish(status: dict[str, Any]) -> None:
        if use_mqtt:
            client.publish(f"{prefix}/ota/status", json.dumps(status), qos=1, retain=True)

    if ddi:
        try:
            run_ddi_agent(config, stop, publish, engine)
        finally:
            client.loop_stop()
            client.disconnect()
        return
    agent = make_agent(config, engine or DockerEngine(), publish)
    agent.cancelled = lambda: "the agent is stopping" if stop.is_set() else None  # ends a wait for the line
    agent.stopping = stop  # ends a swap's health wait and engine calls (recorded: the next start goes on)
    recovery = Recovery(agent, publish, meanwhile="manifests wait until it succeeds")
    waiting = EngineWait(agent)  # a manifest taken while the engine did not answer, taken again when it does
    next_poll = time.monotonic()
    poller = ManifestPoller()
    seen_url_manifest: str | None = None  # "" while the URL serves no manifest

    def recover() -> None:
        """An interrupted swap is finished or undone before any manifest is taken: retried with backoff
        while it fails (the engine not up yet at boot), manifests from MQTT waiting in the inbox."""
        while not stop.is_set() and not recovery.attempt():
            stop.wait(recovery.wait_s())

    def take(handle: Callable[..., object], *args: Any) -> None:
        try:
            handle(*args)
        except AgentStopping:  # mid-swap: the state file has the step, the next start finishes it
            log.info("ota: stopping during an update; it is finished or undone at the next start")
            return
        except Exception as exc:  # one bad manifest or a docker hiccup must not end the agent
            if not engine_gone(agent, exc, "the recovery finishes or undoes it once the engine answers (retried "
                               "with backoff; manifests wait until then)", log):
                log.exception("ota: handling a manifest failed; the agent goes on")
        if agent.state().get("phase", "idle") != "idle":
            recover()  # a swap an error left mid-way (the engine gone while it rolled back)

    try:
        recover()  # a swap the agent was killed in
        while not stop.is_set():
            try:
                payload = inbox.queue.get(timeout=1.0)
            except queue.Empty:
                payload = None
            if payload is None and config.ota.manifest_url and time.monotonic() >= next_poll:
                next_poll = time.monotonic() + config.ota.poll_interval_s
                body = poller.poll(config.ota.manifest_url)
                if body is not None and not body.strip():  # no manifest (the release withdrawn): nothing to do
                    if seen_url_manifest != "":
                        log.info("ota: %s serves no manifest (an empty answer): nothing to do",
                                 config.ota.manifest_url)
                    seen_url_manifest = ""
                elif body is not None and body.decode(errors="replace") != seen_url_manifest:
                    seen_url_manifest = body.decode(errors="replace")
                    payload = body
            # The manifest that waits for the engine: when its backoff is over, and before a later one
            # (taken in arrival order, as they would have been with the engine answering).
            if waiting.due() or (payload is not None and waiting.payload is not None):
                take(waiting.attempt)
            if payload is not None:
                take(waiting.take, payload)
    finally:
        client.loop_stop()
        client.disconnect()
