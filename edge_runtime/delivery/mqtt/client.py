"""MQTT: availability, the result outbox, telemetry and commands, over one paho-mqtt 2.x client.

Results are published from the journal, oldest first, and a row is marked sent only when the broker
acknowledged it (PUBACK for QoS 1). A broker outage, a reconnect or a `kill -9` therefore loses
nothing: what was not acknowledged is published again (consumers de-duplicate by `id`).
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edge_runtime.config import MqttConfig
from edge_runtime.core import strict_json
from edge_runtime.core.errors import InputError, StorageFull
from edge_runtime.core.sink import SinkHealth
from edge_runtime.core.supervise import RateLimitedLog, SupervisedThread
from edge_runtime.delivery.mqtt.commands import CommandError
from edge_runtime.delivery.mqtt.outbox import MessageOutbox
from edge_runtime.verdicts.journal import Journal

log = logging.getLogger(__name__)

CommandHandler = Callable[[dict[str, Any]], dict[str, Any]]
# Commands on our topic that another process answers: `ota` goes to the update agent.
EXTERNAL_COMMANDS = frozenset({"ota"})
MAX_COMMAND_DEPTH = 32  # a command payload is a flat object; deeper is an attack
# The largest valid command is a trigger whose 2,000-character prompt is all \uXXXX escapes (~12 KB).
# Bigger payloads are refused before they are copied or parsed: four 20 MB ones cost 62 s and 2.7 GB.
MAX_COMMAND_BYTES = 64 * 1024
MAX_COMMAND_VALUES = 1_000  # commas, [ and { a payload may hold (counted in C before parsing)
# Commands running or waiting for the two command threads (a trigger waits up to 300 s for its verdict):
# past this a command is answered "busy" at once instead of queueing without bound.
MAX_PENDING_COMMANDS = 16
BROKER_DOWN_DEGRADED_S = 60.0  # a broker restart or a short network loss is not yet a fault


def configure_client(client: mqtt.Client, cfg: MqttConfig) -> None:
    """Credentials and TLS from the config; shared by the daemon, the OTA agent and the fleet CLI."""
    if cfg.username:
        client.username_pw_set(cfg.username, cfg.password.get_secret_value() if cfg.password else None)
    if cfg.tls.enabled:
        client.tls_set(ca_certs=str(cfg.tls.ca_file) if cfg.tls.ca_file else None,
                       certfile=str(cfg.tls.cert_file) if cfg.tls.cert_file else None,
                       keyfile=str(cfg.tls.key_file) if cfg.tls.key_file else None,
                       cert_reqs=ssl.CERT_REQUIRED)
        client.tls_insecure_set(cfg.tls.insecure)


class MqttService:
    """Connects, keeps `<prefix>/status` truthful, drains the journal, answers commands."""

    def __init__(self, cfg: MqttConfig, device_id: str, prefix: str, journal: Journal,
                 telemetry: Callable[[], dict[str, Any]], commands: dict[str, CommandHandler], *,
                 messages: MessageOutbox | None = None, wake: threading.Event | None = None,
                 discovery: Callable[[], list[tuple[str, str]]] | None = None) -> None:
        """`wake`: set by whoever commits rows to send (the message outbox); None: only `notify`."""
        self.cfg = cfg
        self.device_id = device_id
        self.prefix = prefix
        self.journal = journal
        self.telemetry = telemetry
        self.commands = commands
        self.connected = False
        self._down_since: float | None = None  # monotonic time health() first saw the broker away
        self.last_error: str | None = None
        self.published = 0
        self.discovery = discovery  # Home Assistant's retained configs; None: off
        # Published results not yet acknowledged, with their journal seq. paho flags each
        # MQTTMessageInfo when the PUBACK arrives (also for resends after a reconnect).
        self._inflight: list[tuple[mqtt.MQTTMessageInfo, int]] = []
        self._cursor = 0  # highest journal seq handed to paho
        self._acked: list[int] = []  # acknowledged but not yet marked (the disk may be full)
        self._discovered: set[str] = set()  # retained discovery topics we published (to clear them)
        self.parked = 0  # rows set aside by this process because paho refused them
        self._error_log = RateLimitedLog(log)
        self.messages = messages  # drained the same way as the results
        self._msg_inflight: list[tuple[mqtt.MQTTMessageInfo, int]] = []
        self._msg_cursor = 0
        self._lock = threading.Lock()
        self._wake = wake or threading.Event()
        self._stop = threading.Event()
        self._executor = ThreadPoolExecutor(2, thread_name_prefix="mqtt-cmd")
        self._pending = threading.BoundedSemaphore(MAX_PENDING_COMMANDS)
        self.commands_refused = 0  # refused at the door: oversized, or the backlog full
        self._refusal_log = RateLimitedLog(log)
        self._thread = SupervisedThread("mqtt-outbox", self._outbox_loop, self._stop, log)
        self.client = self._make_client()

    @property
    def status_topic(self) -> str:
        return f"{self.prefix}/status"

    def result_topic(self, camera: str) -> str:
        return f"{self.prefix}/{camera}/result"

    # ---- lifecycle ---------------------------------------------------------------------------

    def _make_client(self) -> mqtt.Client:
        cfg = self.cfg
        self.client_id = cfg.client_id or f"edge-runtime-{self.device_id}"
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id,
                             clean_session=cfg.clean_session, protocol=mqtt.MQTTv311)
        client.will_set(self.status_topic, "offline", qos=1, retain=True)
        configure_client(client, cfg)
        client.reconnect_delay_set(1, 30)
        client.max_inflight_messages_set(cfg.max_inflight)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        return client

    def start(self) -> None:
        log.info("mqtt: connecting to %s:%d as %s (tls %s)", self.cfg.host, self.cfg.port,
                 self.client_id, "on" if self.cfg.tls.enabled else "off")
        self.client.connect_async(self.cfg.host, self.cfg.port, self.cfg.keepalive)
        self.client.loop_start()  # retries the first connection too
        self._thread.start()

    def stop(self) -> None:
        """Announce `offline` (a clean shutdown sends no Last Will), then disconnect."""
        self._stop.set()
        self._wake.set()
        self._thread.join(5)
        if self.connected:
            info = self.client.publish(self.status_topic, "offline", qos=1, retain=True)
            try:
                info.wait_for_publish(timeout=3)
            except (RuntimeError, ValueError):
                pass
        try:
            self._flush_acks()
        except StorageFull:
            pass  # unmarked rows are published again after the restart (consumers de-duplicate by id)
        self.client.disconnect()
        self.client.loop_stop()
        self._executor.shutdown(wait=False, cancel_futures=True)

    # ---- a Sink (core/sink.py) ---------------------------------------------------------------------

    name = "mqtt"

    def notify(self, result: object = None) -> None:
        """Wake the outbox: a new result is in the journal (the outbox reads it from there)."""
        self._wake.set()

    def health(self) -> SinkHealth:
        """Degraded once the broker has been away for BROKER_DOWN_DEGRADED_S: results wait in the
        journal meanwhile (nothing is lost), but nobody on the line hears of them. Connecting heals it."""
        if self.connected:
            self._down_since = None
            return SinkHealth(True, "connected")
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
        down_s = now - self._down_since
        if down_s < BROKER_DOWN_DEGRADED_S:
            return SinkHealth(True, "connecting")
        return SinkHealth(False, f"broker {self.cfg.host}:{self.cfg.port} unreachable for {down_s:.0f} s "
                                 "(results wait in the journal)")

    def threads(self) -> list[SupervisedThread]:
        return [self._thread]

    def state(self) -> dict[str, Any]:
        with self._lock:
            inflight = len(self._inflight)
        counts = self.journal.counts()
        return {"enabled": True, "connected": self.connected, "broker": f"{self.cfg.host}:{self.cfg.port}",
                "last_error": self.last_error, "published": self.published, "inflight": inflight,
                "backlog": counts["unsent"], "parked": counts["parked"],
                "commands_refused": self.commands_refused}

    # ---- paho callbacks (network thread) ---------------------------------------------------------

    def _on_connect(self, client: mqtt.Client, _userdata: Any, _flags: Any, reason: ReasonCode,
                    _props: Properties | None) -> None:
        if reason.is_failure:
            error = f"connection refused: {reason}"
            if error != self.last_error:  # paho retries every few seconds: say it once
                log.warning("mqtt: %s", error)
            self.last_error = error
            return
        self.connected = True
        self.last_error = None
        log.info("mqtt: connected to %s:%d", self.cfg.host, self.cfg.port)
        client.publish(self.status_topic, "online", qos=1, retain=True)
        client.subscribe(f"{self.prefix}/cmd/+", qos=1)
        self.publish_discovery()
        self._wake.set()

    def _on_connect_fail(self, _client: mqtt.Client, _userdata: Any) -> None:
        # A refused or unreachable broker never reaches on_connect: without this, status said null.
        error = f"cannot connect to {self.cfg.host}:{self.cfg.port} (refused or unreachable; retrying)"
        if error != self.last_error:
            log.warning("mqtt: %s", error)
        self.last_error = error

    def publish_discovery(self) -> None:
        """(Re)publish Home Assistant discovery configs; called on connect and when cameras change.
        Configs of cameras that are gone get an empty retained payload, which removes them in HA."""
        if self.discovery is None or not self.connected:
            return
        configs = dict(self.discovery())
        for topic in sorted(self._discovered - configs.keys()):
            self.client.publish(topic, b"", qos=1, retain=True)
        for topic, payload in configs.items():
            self.client.publish(topic, payload, qos=1, retain=True)
        self._discovered = set(configs)

    def _on_disconnect(self, _client: mqtt.Client, _userdata: Any, _flags: Any, reason: ReasonCode,
                       _props: Properties | None) -> None:
        if self._stop.is_set():
            log.info("mqtt: disconnected")  # our own clean shutdown (Ctrl-C, SIGTERM): not a warning
        elif self.connected:
            log.warning("mqtt: disconnected (%s); results stay in the journal until delivered", reason)
            self.last_error = f"disconnected: {reason}"
        self.connected = False

    def _on_publish(self, _client: mqtt.Client, _userdata: Any, mid: int, _reason: ReasonCode,
                    _props: Properties | None) -> None:
        self._wake.set()

    def _on_message(self, _client: mqtt.Client, _userdata: Any, msg: mqtt.MQTTMessage) -> None:
        name = msg.topic.rsplit("/", 1)[-1]
        if msg.topic.endswith("/reply") or name in EXTERNAL_COMMANDS:
            return
        if len(msg.payload) > MAX_COMMAND_BYTES:
            self._refuse(name, None, f"larger than {MAX_COMMAND_BYTES // 1024} KiB; a command is a small "
                                     "JSON object", field="payload")
            return
        payload = bytes(msg.payload)
        if msg.retain:
            # From the broker's store, handed to every new subscription: run, it would run again at each
            # start and reconnect (a retained trigger journaled one more inspection every time). A command
            # published live arrives with retain 0 (MQTT 3.1.1, 3.3.1.3) and runs once.
            self._refuse(name, _correlation_id(payload), "a retained command is not run (it would run again "
                         "on every reconnect): publish commands without retain, and clear this one")
            return
        if not self._pending.acquire(blocking=False):
            self._refuse(name, _correlation_id(payload), f"busy: {MAX_PENDING_COMMANDS} commands are "
                                                          "running or waiting; send it again later")
            return
        try:
            self._executor.submit(self._run_pending, name, payload)
        except RuntimeError:  # the executor is shut down (stopping)
            self._pending.release()

    def _refuse(self, name: str, request_id: Any, error: str, field: str | None = None) -> None:
        """Answer a command without running it (paho's thread: no parsing of an unbounded payload)."""
        self.commands_refused += 1
        self._refusal_log.log(logging.WARNING, "mqtt: command %r refused: %s", name[:64], error)
        reply: dict[str, Any] = {"command": name, "id": request_id, "ok": False, "error": error}
        if field is not None:
            reply["field"] = field
        self.client.publish(f"{self.prefix}/cmd/{name}/reply", json.dumps(reply), qos=1)

    def _run_pending(self, name: str, payload: bytes) -> None:
        try:
            self._run_command(name, payload)
        finally:
            self._pending.release()

    # ---- outbox --------------------------------------------------------------------------------

    def _outbox_loop(self) -> None:
        next_telemetry = time.monotonic()
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            try:
                self._flush_acks()
                if not self.connected:
                    continue
                self._publish_backlog()
                if time.monotonic() >= next_telemetry:
                    next_telemetry = time.monotonic() + self.cfg.telemetry_interval_s
                    self.client.publish(f"{self.prefix}/telemetry", json.dumps(self.telemetry()), qos=0)
            except StorageFull as exc:
                self._error_log.log(logging.ERROR, "mqtt: %s; delivered rows stay unmarked for now", exc)
                self._stop.wait(1.0)
            except Exception:  # noqa: BLE001 - logged once a minute; the loop goes on
                self._error_log.log(logging.ERROR, "mqtt: outbox error", exc_info=True)
                self._stop.wait(1.0)

    def _publish_backlog(self) -> None:
        room = self.cfg.max_inflight - len(self._inflight)
        if room <= 0:
            return
        for seq, camera, body in self.journal.unsent(after_seq=self._cursor, limit=room):
            try:
                info = self.client.publish(self.result_topic(camera), body, qos=self.cfg.qos)
            except (ValueError, TypeError, OverflowError) as exc:
                # One row paho refuses (a wildcard in the topic, an oversized payload) must not block
                # every later row: set it aside with its reason and move on.
                self._park(seq, camera, f"{type(exc).__name__}: {exc}")
                self._cursor = seq
                continue
            self._cursor = seq
            with self._lock:
                self._inflight.append((info, seq))
        if self.messages is not None:
            for seq, topic, payload in self.messages.unsent(after_seq=self._msg_cursor, limit=room):
                self._msg_cursor = seq
                try:
                    info = self.client.publish(f"{self.prefix}/{topic}", payload, qos=1)
                except (ValueError, TypeError, OverflowError) as exc:
                    # As for results: one message paho refuses must not block the ones behind it.
                    log.error("mqtt: message %d on %r cannot be published and is dropped: %s", seq, topic, exc)
                    self.messages.mark_sent([seq])
                    self.parked += 1
                    continue
                with self._lock:
                    self._msg_inflight.append((info, seq))

    def _park(self, seq: int, camera: str, reason: str) -> None:
        log.error("mqtt: result %d of camera %r cannot be published and is set aside: %s", seq, camera, reason)
        self.journal.park(seq, reason)
        self.parked += 1

    def _flush_acks(self) -> None:
        """Mark acknowledged results sent in the journal, in one transaction."""
        with self._lock:
            acked = [seq for info, seq in self._inflight if info.is_published()]
            self._inflight = [(info, seq) for info, seq in self._inflight if not info.is_published()]
            self._acked += acked
            acked, self._acked = self._acked, []
        if acked:
            try:
                self.journal.mark_sent(acked)
            except Exception:
                with self._lock:  # kept for the next try, so they are not published again needlessly
                    self._acked = acked + self._acked
                raise
            self.published += len(acked)
        if self.messages is not None:
            with self._lock:
                done = [seq for info, seq in self._msg_inflight if info.is_published()]
                self._msg_inflight = [(i, s) for i, s in self._msg_inflight if not i.is_published()]
            self.messages.mark_sent(done)

    # ---- commands ------------------------------------------------------------------------------

    def _run_command(self, name: str, payload: bytes) -> None:
        reply: dict[str, Any] = {"command": name}
        try:
            try:  # strict: duplicate keys, NaN and lone surrogates refused, naming the field
                request = strict_json.loads(payload or b"{}", MAX_COMMAND_DEPTH, MAX_COMMAND_VALUES)
            except strict_json.StrictJsonError as exc:
                raise CommandError(f"{exc.field or 'payload'}: {exc}") from None
            if not isinstance(request, dict):
                raise CommandError("payload must be a JSON object")
            reply["id"] = request.pop("id", None)
            handler = self.commands.get(name)
            if handler is None:
                raise CommandError(f"unknown command {name!r}; known: {', '.join(sorted(self.commands))}")
            reply.update(ok=True, result=handler(request))
        except CommandError as exc:
            reply.update(ok=False, error=str(exc))
        except InputError as exc:  # refused input: the reply names the field, like the HTTP 4xx
            reply.update(ok=False, error=str(exc), field=exc.field)
        except Exception as exc:  # noqa: BLE001 - any failure becomes an error reply, never a crash
            reply.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        log.info("mqtt: command %s -> %s", name, "ok" if reply["ok"] else reply["error"])
        self.client.publish(f"{self.prefix}/cmd/{name}/reply", json.dumps(reply), qos=1)


def _correlation_id(payload: bytes) -> Any:
    """The `id` of a (size-bounded) command payload, for a reply to a command that is not run."""
    try:
        request = strict_json.loads(payload or b"{}", MAX_COMMAND_DEPTH, MAX_COMMAND_VALUES)
    except strict_json.StrictJsonError:
        return None
    return request.get("id") if isinstance(request, dict) else None
