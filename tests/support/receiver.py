"""A real HTTP webhook receiver on loopback that tests can stop and start again on the same port."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.mjpeg import free_port


class Receiver:
    def __init__(self, status: int = 200) -> None:
        self.port = free_port()
        self.status = status
        self.path_status: dict[str, int] = {}  # a path answered otherwise than `status` (e.g. "/wrong": 404)
        self.received: list[tuple[str, dict[str, Any]]] = []  # (Idempotency-Key, body)
        self.headers: dict[str, dict[str, str]] = {}  # Idempotency-Key -> request headers
        self._server: ThreadingHTTPServer | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def keys(self) -> set[str]:
        with self._lock:
            return {k for k, _ in self.received}

    def start(self) -> Receiver:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer._lock:
                    outer.received.append((self.headers["Idempotency-Key"], body))
                    outer.headers[self.headers["Idempotency-Key"]] = dict(self.headers)
                self.send_response(outer.path_status.get(self.path, outer.status))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class Subscriber:
    """A plain paho client on one topic filter, as a line's MES would run it."""

    def __init__(self, port: int, topic: str) -> None:
        import uuid

        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.messages: list[tuple[str, dict[str, Any], int]] = []  # (topic, JSON payload, qos)
        self._lock = threading.Lock()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=uuid.uuid4().hex)
        self.subscribed = threading.Event()  # set at each SUBACK (a reconnect subscribes again)
        self.client.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
        self.client.on_subscribe = lambda *_: self.subscribed.set()
        self.client.reconnect_delay_set(1, 1)  # back within a second of a broker restart
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _on_message(self, _c: Any, _u: Any, msg: Any) -> None:
        try:
            payload = json.loads(msg.payload)
        except ValueError:
            return  # `online`/`offline` on the status topic
        with self._lock:
            self.messages.append((msg.topic, payload, msg.qos))

    def on(self, suffix: str) -> list[dict[str, Any]]:
        with self._lock:
            return [p for t, p, _ in self.messages if t.endswith(suffix)]

    def raw(self) -> list[tuple[str, dict[str, Any], int]]:
        with self._lock:
            return list(self.messages)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()
