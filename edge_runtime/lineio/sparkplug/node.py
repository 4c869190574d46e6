"""A Sparkplug B edge node on paho-mqtt 2: one node (the device), one Sparkplug device per station.

It holds its own MQTT connection to the `mqtt:` broker, because one connection carries one Will and
the daemon's connection already carries the availability Will; here the Will is the NDEATH. Per the
specification (3.0): every CONNECT carries the next `bdSeq` (0-255, persisted on disk before the
connect, so it also goes on across restarts) in its NDEATH Will (QoS 1, not retained); NBIRTH (seq 0)
and the DBIRTHs follow the subscriptions to NCMD/DCMD (QoS 1); births and data are QoS 0, not
retained; `seq` counts 0-255 and wraps. `Node Control/Rebirth` in an NCMD sends the births again.
A clean stop publishes the NDEATH itself (a clean disconnect sends no Will).

Publishing runs on one thread (births and DDATA, so `seq` is in wire order); the station's watch
callbacks only queue snapshots (bounded; the oldest are dropped and counted), and DCMDs are turned
into station calls on paho's thread (they return at once); `Trigger` and `ResultAck` act on their edges
(the level the host last wrote is kept per station), so a redelivered command does nothing again.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edge_runtime.config.line_protocols import SparkplugConfig
from edge_runtime.config.mqtt import MqttConfig
from edge_runtime.core.sink import SinkHealth
from edge_runtime.core.supervise import RateLimitedLog, SupervisedThread
from edge_runtime.lineio.signals import LineRefused, Signals
from edge_runtime.lineio.sparkplug import payload as spb
from edge_runtime.lineio.station import Station

log = logging.getLogger(__name__)
# Births asked for by NCMD rebirths within this long of the last births are folded into one more, sent
# when it is up: each request sent every birth again (a burst of 2,000 made 1,752 NBIRTHs and 2,000
# log lines). Births on (re)connect are never held back.
MIN_REBIRTH_INTERVAL_S = 1.0


class BdSeq:
    """The birth/death sequence number kept in a file: `next()` is the value of the next CONNECT."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def current(self) -> int | None:
        try:
            return int(self.path.read_text().strip()) % 256
        except (OSError, ValueError):
            return None

    def next(self) -> int:
        last = self.current()
        value = 0 if last is None else (last + 1) % 256
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w") as f:  # durable before the CONNECT that carries it
            f.write(f"{value}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        return value


class _Device:
    def __init__(self, station: Station, max_pending: int) -> None:
        self.station = station
        self.pending: deque[Signals] = deque(maxlen=max_pending)
        self.published: dict[str, tuple[int, Any]] = {}
        self.last_refusal = ""
        # The host's last written Trigger and ResultAck: only a change to true is an edge (as a Modbus
        # ControlWord bit or an OPC UA input variable); false at start, as the first DBIRTH shows them.
        self.trigger = False
        self.result_ack = False
        self.refusal_changed = False  # LastRefusal or a command level changed: publish even without a snapshot
        self.unwatch: Callable[[], None] | None = None


class SparkplugNode:
    """The stations as Sparkplug B devices of one edge node (service: start/stop/health)."""

    name = "sparkplug"

    def __init__(self, stations: list[Station], cfg: SparkplugConfig, mqtt_cfg: MqttConfig, node_id: str,
                 bdseq_path: Path, configure: Callable[[mqtt.Client], None] | None = None) -> None:
        """`configure` applies credentials and TLS of `mqtt_cfg` to a client (the daemon passes
        delivery.mqtt.client.configure_client, so both connections authenticate alike)."""
        self.cfg = cfg
        self.mqtt_cfg = mqtt_cfg
        self.node_id = cfg.edge_node_id or node_id
        self.bdseq = BdSeq(bdseq_path)
        self.configure = configure
        self.devices = {s.name: _Device(s, cfg.max_pending) for s in stations}
        base = f"{spb.NAMESPACE}/{cfg.group_id}"
        self.topics = {kind: f"{base}/{kind}/{self.node_id}" for kind in ("NBIRTH", "NDEATH", "NDATA", "NCMD")}
        self.dcmd_filter = f"{base}/DCMD/{self.node_id}/+"
        self.device_topic = f"{base}/{{kind}}/{self.node_id}/{{device}}"
        self.connected = False
        self.last_error: str | None = None
        self.current_bdseq: int | None = None
        self.counters = {"connects": 0, "births": 0, "ddata": 0, "dropped": 0, "superseded": 0, "commands": 0,
                         "refused_commands": 0, "triggers": 0, "acks": 0,
                         "repeated_commands": 0, "unmatched_acks": 0}
        self._seq = 0
        self._client: mqtt.Client | None = None
        self._birth_due = threading.Event()
        self._rebirth_asked = False  # an NCMD rebirth waiting for MIN_REBIRTH_INTERVAL_S to pass
        self._last_births = float("-inf")  # monotonic time of the last births
        self._rebirth_log = RateLimitedLog(log)
        self._gone = threading.Event()  # the current connection ended
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._pub_lock = threading.Lock()
        # Connection trouble and refused commands are limited apart: one must not hide the other's first line.
        self._log = RateLimitedLog(log)
        self._command_log = RateLimitedLog(log)
        self._threads = [SupervisedThread("lineio-sparkplug", self._connection_loop, self._stop, log),
                         SupervisedThread("lineio-sparkplug-publish", self._publish_loop, self._stop, log)]

    # ---- service -------------------------------------------------------------------------------

    def start(self) -> None:
        for dev in self.devices.values():
            dev.unwatch = dev.station.watch(lambda s, d=dev: self._queued(d, s))  # type: ignore[misc]
        log.info("sparkplug: edge node %s/%s on %s:%d", self.cfg.group_id, self.node_id, self.mqtt_cfg.host,
                 self.mqtt_cfg.port)
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """A clean stop sends no Will, so the NDEATH is published here before the disconnect."""
        self._stop.set()
        self._wake.set()
        for dev in self.devices.values():
            if dev.unwatch is not None:
                dev.unwatch()
        client = self._client
        if client is not None and self.connected and self.current_bdseq is not None:
            info = client.publish(self.topics["NDEATH"], spb.node_death(self.current_bdseq), qos=1)
            try:
                info.wait_for_publish(timeout=3)
            except (RuntimeError, ValueError):
                pass
        if client is not None:
            client.disconnect()
        for t in self._threads:
            t.join(5)

    def threads(self) -> list[SupervisedThread]:
        return list(self._threads)

    def health(self) -> SinkHealth:
        return SinkHealth(ok=self.connected, detail="" if self.connected else (self.last_error or "connecting"),
                          counters={**self.counters, "bdseq": self.current_bdseq,
                                    "restarts": sum(t.restarts for t in self._threads)})

    # ---- connection (one CONNECT per pass, each with the next bdSeq in its Will) -----------------

    def _connection_loop(self) -> None:
        delay = 1.0
        while not self._stop.is_set():
            bdseq = self.bdseq.next()
            client = self._make_client(bdseq)
            self.current_bdseq = bdseq
            try:
                client.connect(self.mqtt_cfg.host, self.mqtt_cfg.port, self.mqtt_cfg.keepalive)
            except (OSError, ValueError) as exc:
                error = f"cannot connect to {self.mqtt_cfg.host}:{self.mqtt_cfg.port}: {exc}"
                if error != self.last_error:
                    log.warning("sparkplug: %s (retrying)", error)
                self.last_error = error
                self._stop.wait(delay)
                delay = min(delay * 2, 30.0)
                continue
            self._client = client
            # paho's own thread: publish() from other threads is safe only with loop_start (with
            # loop_forever a publish writes to the socket from the caller's thread and races the loop).
            self._gone.clear()
            client.loop_start()
            while not self._gone.wait(0.5):
                if self._stop.is_set():
                    break
            client.loop_stop()  # the connection ended (no automatic reconnect: the next CONNECT is ours)
            self.connected = False
            if self._stop.is_set():
                return
            delay = 1.0 if self.last_error is None else min(delay * 2, 30.0)
            self._stop.wait(delay)

    def _make_client(self, bdseq: int) -> mqtt.Client:
        client_id = f"{self.mqtt_cfg.client_id or 'edge-runtime-' + self.node_id}-spb"
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=True,
                             protocol=mqtt.MQTTv311, reconnect_on_failure=False)
        client.will_set(self.topics["NDEATH"], spb.node_death(bdseq), qos=1, retain=False)
        if self.configure is not None:
            self.configure(client)
        client.max_queued_messages_set(4 * self.cfg.max_pending)  # paho's queue is bounded too
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        return client

    def _on_connect(self, client: mqtt.Client, _u: Any, _f: Any, reason: ReasonCode,
                    _p: Properties | None) -> None:
        if reason.is_failure:
            self.last_error = f"connection refused: {reason}"
            self._log.log(logging.WARNING, "sparkplug: %s", self.last_error)
            client.disconnect()
            return
        sock = client.socket()
        if isinstance(sock, socket.socket):  # DDATA come in bursts of small packets: no Nagle delay
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.subscribe([(self.topics["NCMD"], 1), (self.dcmd_filter, 1)])
        self.connected = True
        self.last_error = None
        self.counters["connects"] += 1
        log.info("sparkplug: connected (bdSeq %s)", self.current_bdseq)
        self._birth_due.set()
        self._wake.set()

    def _on_disconnect(self, _c: mqtt.Client, _u: Any, _f: Any, reason: ReasonCode,
                       _p: Properties | None) -> None:
        if self.connected and not self._stop.is_set():
            log.warning("sparkplug: disconnected (%s)", reason)
            self.last_error = f"disconnected: {reason}"
        self.connected = False
        self._gone.set()

    # ---- publishing (one thread, so seq is in wire order) -----------------------------------------

    def _next_seq(self) -> int:
        seq = self._seq
        self._seq = (self._seq + 1) % 256
        return seq

    def _queued(self, dev: _Device, signals: Signals) -> None:
        """A station's watch callback: never blocks; the oldest snapshot goes when the queue is full."""
        if len(dev.pending) == dev.pending.maxlen:
            self.counters["dropped"] += 1
        dev.pending.append(signals)
        self._wake.set()

    def _publish_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            client = self._client
            if client is None or not self.connected:
                for dev in self.devices.values():
                    self._supersede(dev)  # the next DBIRTH carries the state then current
                continue
            with self._pub_lock:
                if self._rebirth_asked and time.monotonic() - self._last_births >= MIN_REBIRTH_INTERVAL_S:
                    self._rebirth_asked = False
                    self._birth_due.set()
                if self._birth_due.is_set():
                    self._birth_due.clear()
                    self._births(client)
                self._data(client)

    def _supersede(self, dev: _Device) -> None:
        """Drop the queued changes a birth replaces with the whole current state (counted)."""
        n = len(dev.pending)
        dev.pending.clear()
        self.counters["superseded"] += n

    def _births(self, client: mqtt.Client) -> None:
        self._last_births = time.monotonic()
        self._rebirth_asked = False  # these births answer any rebirth request made before them
        self._seq = 0
        bdseq = self.current_bdseq if self.current_bdseq is not None else 0
        client.publish(self.topics["NBIRTH"], spb.node_birth(self._next_seq(), bdseq), qos=0)
        for name, dev in self.devices.items():
            self._supersede(dev)
            dev.refusal_changed = False
            values = spb.station_values(dev.station.signals(), dev.last_refusal, dev.trigger, dev.result_ack)
            client.publish(self._topic("DBIRTH", name), spb.device_birth(self._next_seq(), values), qos=0)
            dev.published = values
        self.counters["births"] += 1

    def _data(self, client: mqtt.Client) -> None:
        for name, dev in self.devices.items():
            changed = dev.refusal_changed
            dev.refusal_changed = False  # before the values are read: a change made meanwhile wakes us again
            snapshots: list[Signals] = []
            while dev.pending:
                snapshots.append(dev.pending.popleft())
            if changed and not snapshots:
                snapshots.append(dev.station.signals())
            for snap in snapshots:
                values = spb.station_values(snap, dev.last_refusal, dev.trigger, dev.result_ack)
                body = spb.device_data(self._next_seq(), dev.published, values)
                if body is None:  # what it held was already published (a dropped change in between)
                    self._seq = (self._seq - 1) % 256  # nothing sent: the number is not used
                    self.counters["superseded"] += 1
                    continue
                client.publish(self._topic("DDATA", name), body, qos=0)
                dev.published = values
                self.counters["ddata"] += 1

    def _topic(self, kind: str, device: str) -> str:
        return self.device_topic.format(kind=kind, device=device)

    # ---- commands (paho's thread) -------------------------------------------------------------------

    def _on_message(self, _c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
        self.counters["commands"] += 1
        try:
            if msg.retain:  # from the broker's store on (re)subscribe: it would run again at every connect
                raise spb.CommandError("a retained command is not run (commands must not be retained)")
            metrics = spb.decode_command(bytes(msg.payload), self.cfg.max_command_bytes)
            if msg.topic == self.topics["NCMD"]:
                self._node_command(metrics)
            else:
                dev = self.devices.get(msg.topic.rsplit("/", 1)[-1])
                if dev is None:
                    raise spb.CommandError(f"no station {msg.topic.rsplit('/', 1)[-1]!r} on this node")
                self._device_command(dev, metrics)
        except spb.CommandError as exc:
            self.counters["refused_commands"] += 1
            self._command_log.log(logging.WARNING, "sparkplug: command on %s refused: %s", msg.topic[:200], exc)
        except Exception:  # noqa: BLE001 - a bad command never ends paho's thread
            self.counters["refused_commands"] += 1
            self._command_log.log(logging.ERROR, "sparkplug: command on %s failed", msg.topic[:200], exc_info=True)

    def _node_command(self, metrics: dict[str, Any]) -> None:
        if spb.REBIRTH not in metrics:
            raise spb.CommandError(f"unknown node command(s): {', '.join(sorted(metrics))[:200] or 'none'}")
        rebirth = metrics[spb.REBIRTH]
        if not isinstance(rebirth, bool):  # an Int 1 or a String "true" was ignored without a word
            raise spb.CommandError(f"{spb.REBIRTH} must be a Boolean, not {_kind(rebirth)}")
        if rebirth:
            self._rebirth_log.log(logging.INFO, "sparkplug: rebirth requested")
            self._rebirth_asked = True  # the publish loop sends the births, at most once a MIN_REBIRTH_INTERVAL_S
            self._wake.set()

    def _device_command(self, dev: _Device, metrics: dict[str, Any]) -> None:
        if not self.cfg.device_commands:
            raise spb.CommandError("device commands are off (sparkplug.device_commands: false)")
        if not metrics:
            raise spb.CommandError("a DCMD without metrics")
        known = {"TriggerEnable": bool, "PartId": str, "Recipe": str, "Trigger": bool, "ResultAck": bool,
                 "InspectionSeq": int}
        for name, value in metrics.items():
            if name not in known:
                raise spb.CommandError(f"{name[:64]!r} is not a writable metric (writable: {', '.join(known)})")
            if not isinstance(value, known[name]) or (known[name] is int and isinstance(value, bool)):
                raise spb.CommandError(f"{name}: expected a {known[name].__name__} metric")
        if "InspectionSeq" in metrics and "ResultAck" not in metrics:
            raise spb.CommandError("InspectionSeq names the job a ResultAck acknowledges: it goes with ResultAck")
        st = dev.station
        if "TriggerEnable" in metrics:
            st.set_trigger_enable(metrics["TriggerEnable"])
        # Trigger and ResultAck act on their edges, as on Modbus and OPC UA: a true while the level is
        # already true (the same DCMD redelivered at QoS 1, a host that republishes) is no new job and no
        # second ack; the host writes false before the next true. The levels are DBIRTH/DDATA metrics.
        repeated = False
        trigger = metrics.get("Trigger")
        if trigger is True and dev.trigger:
            repeated = True
        elif trigger is True:
            self._set_level(dev, trigger=True)
            self.counters["triggers"] += 1
            try:
                st.request_trigger(metrics.get("PartId", ""), metrics.get("Recipe") or None)  # no disk wait here
                refusal = ""
            except LineRefused as exc:
                refusal = exc.reason
            if refusal != dev.last_refusal:
                dev.last_refusal = refusal
                dev.refusal_changed = True
                self._wake.set()
        elif trigger is False and dev.trigger:
            self._set_level(dev, trigger=False)
            st.release_trigger()
        ack = metrics.get("ResultAck")
        job = metrics.get("InspectionSeq")
        if ack is True and job is not None:  # the job id is the edge (OPC UA's ResultAck(JobId)): no level needed
            self._set_level(dev, result_ack=True)
            if st.request_ack(job) is not None:
                self.counters["acks"] += 1
            elif st.acknowledged(job):
                repeated = True
            else:
                self.counters["unmatched_acks"] += 1
                self._command_log.log(logging.WARNING, "sparkplug: ResultAck of job %d on %s: not the result "
                                      "shown (InspectionSeq %d); nothing acknowledged", job, dev.station.name,
                                      dev.station.signals().inspection_seq)
        elif ack is True and dev.result_ack:
            repeated = True
        elif ack is True:
            self._set_level(dev, result_ack=True)
            self.counters["acks"] += 1
            st.request_ack()
        elif ack is False and dev.result_ack:
            self._set_level(dev, result_ack=False)
        if repeated:
            self.counters["repeated_commands"] += 1
            # A host written for level commands (true every time) is otherwise ignored without a word.
            self._command_log.log(logging.WARNING, "sparkplug: %s wrote true while it was already true: ignored "
                                  "(Trigger and ResultAck act on a change; write false, then true)",
                                  dev.station.name)

    def _set_level(self, dev: _Device, trigger: bool | None = None, result_ack: bool | None = None) -> None:
        """The host's Trigger / ResultAck level changed: recorded, and published with the next DDATA."""
        if trigger is not None:
            dev.trigger = trigger
        if result_ack is not None:
            dev.result_ack = result_ack
        dev.refusal_changed = True
        self._wake.set()

def _kind(value: Any) -> str:
    """A decoded metric value's type in Sparkplug's words, for a refusal."""
    return {bool: "a Boolean", int: "an integer", float: "a float", str: "a String", bytes: "Bytes"}.get(
        type(value), "no value" if value is None else type(value).__name__)
