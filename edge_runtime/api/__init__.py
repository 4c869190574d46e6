"""The HTTP side: a Flask app factory (one blueprint per area) and the waitress server around it.

waitress is the production WSGI server: pure Python (nothing to compile on aarch64/Jetson), a few MB,
threaded, and it streams responses, which server-sent events need. See docs/decisions.md.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from flask import Flask, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..config import ApiConfig
from ..errors import EdgeRuntimeError
from .errors import register_error_handlers
from .events import EventHub
from .metrics import Metrics

log = logging.getLogger(__name__)


def create_app(daemon: Any, cfg: ApiConfig, metrics: Metrics | None = None,
               events: EventHub | None = None) -> Flask:
    """Build the app around a running daemon (passed in, never a global)."""
    from . import inspection, openai, page, rest

    app = Flask(__name__, static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = int(cfg.max_request_mb * 1024 * 1024)
    app.config["EDGE_API_TOKEN"] = cfg.token.get_secret_value() if cfg.token else None
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions["edge_runtime"] = daemon
    app.extensions["edge_runtime_events"] = events or EventHub()
    metrics = metrics or Metrics(daemon.status)
    app.extensions["edge_runtime_metrics"] = metrics
    for bp in (rest.bp, openai.bp, page.bp):
        app.register_blueprint(bp)
    inspection.register(app, daemon, metrics.registry)  # evidence, queries, exports, review

    @app.get("/metrics")
    def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), mimetype=CONTENT_TYPE_LATEST)

    register_error_handlers(app)
    return app


class ApiServer:
    """Serves the app with waitress in a background thread; a daemon service (start/stop)."""

    def __init__(self, daemon: Any, cfg: ApiConfig) -> None:
        self.cfg = cfg
        self.events = EventHub()
        self.metrics = Metrics(daemon.status)
        self.app = create_app(daemon, cfg, self.metrics, self.events)
        daemon.worker.listeners.append(self._on_result)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def _on_result(self, result: Any) -> None:
        self.metrics.observe(result)
        self.events.publish(result.to_dict())

    @property
    def port(self) -> int:
        return int(self._server.effective_port) if self._server else self.cfg.port

    def start(self) -> None:
        from waitress import create_server

        try:
            self._server = create_server(self.app, host=self.cfg.host, port=self.cfg.port, threads=self.cfg.threads,
                                         ident="edge-runtime", channel_timeout=120,
                                         clear_untrusted_proxy_headers=True)
        except OSError as exc:
            raise EdgeRuntimeError(f"the API cannot listen on {self.cfg.host}:{self.cfg.port} ({exc.strerror}); "
                                   "change api.port or stop the program using it") from None
        self._thread = threading.Thread(target=self._serve, name="http", daemon=True)
        self._thread.start()
        log.info("api: serving on http://%s:%d/ (status page, REST, OpenAI, /metrics)", self.cfg.host, self.port)

    def _serve(self) -> None:
        # waitress's own run() loops forever; closing its sockets from another thread races its select().
        # Turning the loop here lets stop() end it first and close the sockets afterwards.
        server = self._server
        socket_map = getattr(server, "_map", None) or getattr(server, "map", None)
        while not self._stopping.is_set():
            server.asyncore.loop(timeout=0.2, map=socket_map, use_poll=server.adj.asyncore_use_poll, count=1)

    def stop(self) -> None:
        self.events.close()
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(3)
        if self._server is not None:
            self._server.close()
