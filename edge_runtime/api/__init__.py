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
from waitress import wasyncore

from edge_runtime.api.admission import EXPORT_THREADS, QUERY_THREADS, QUICK_THREADS, Admission, slots
from edge_runtime.api.auth import guard_reads, session_keys, start_session
from edge_runtime.api.errors import PROBE_REFRESH, register_error_handlers
from edge_runtime.api.guard import (
    HEALTH_PATHS,
    ConnectionMetrics,
    Limits,
    ProbeAnswers,
    ProbeFailed,
    create_guarded_server,
)
from edge_runtime.api.metrics import Metrics
from edge_runtime.config import ApiConfig
from edge_runtime.core.device import DeviceRoles
from edge_runtime.core.errors import EdgeRuntimeError
from edge_runtime.core.heap import fix_mmap_threshold
from edge_runtime.core.result import Result
from edge_runtime.core.sink import SinkHealth
from edge_runtime.delivery.events import EventHub

log = logging.getLogger(__name__)

STREAM_SECONDS = 300  # an event stream ends after this and the browser resumes it (Last-Event-ID)
# waitress: idle or slow connections are closed after CHANNEL_TIMEOUT_S without a byte; the
# maintenance pass that closes them runs every CLEANUP_S. poll() instead of select() so more than
# 1024 descriptors cannot break the loop.
# Slow senders (one byte every few seconds) are bounded by api.request_deadline_s and one address by
# api.connections_per_client: see guard.py. CLEANUP_S is also how late past its deadline a request is cut.
CHANNEL_TIMEOUT_S = 10
CLEANUP_S = 1
# Settings that take effect only when the server is built (see ApiServer.apply).
RESTART_SETTINGS = ("enabled", "host", "port", "threads")


def create_app(device: DeviceRoles, cfg: ApiConfig, metrics: Metrics | None = None,
               events: EventHub | None = None, stream_seconds: float = STREAM_SECONDS) -> Flask:
    """Build the app around a running device's roles (passed in, never a global)."""
    from edge_runtime.api import openai, page, rest, review

    app = Flask(__name__, static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = int(cfg.max_request_mb * 1024 * 1024)
    app.config["EDGE_API_TOKEN"] = cfg.token.get_secret_value() if cfg.token else None
    app.config["EDGE_API_AUTH"] = cfg.auth
    app.config["EDGE_STREAM_SECONDS"] = stream_seconds
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions["edge_runtime"] = device
    app.extensions["edge_runtime_events"] = events or EventHub()
    max_streams, max_inference = slots(cfg.threads)
    # Pixels in flight: room for one image of the largest accepted size, or many small ones.
    max_pixels = device.status.config.images.max_pixels
    app.extensions["edge_runtime_admission"] = Admission(max_inference, max_pixels)
    app.extensions["edge_runtime_streams"] = Admission(max_streams, 0, "event streams")
    app.extensions["edge_runtime_exports"] = Admission(EXPORT_THREADS, 0, "result exports")
    app.extensions["edge_runtime_queries"] = Admission(QUERY_THREADS, 0, "result queries")
    metrics = metrics or Metrics(device.status.status)
    metrics.admission = {"inference": app.extensions["edge_runtime_admission"],
                         "events": app.extensions["edge_runtime_streams"],
                         "exports": app.extensions["edge_runtime_exports"],
                         "queries": app.extensions["edge_runtime_queries"]}
    app.extensions["edge_runtime_metrics"] = metrics
    for bp in (rest.bp, openai.bp, page.bp):
        app.register_blueprint(bp)
    review.register(app, device, metrics.registry)  # evidence, queries, exports, review

    @app.get("/metrics")
    def prometheus() -> Response:
        # content_type, not mimetype: the latter would append a second charset.
        return Response(generate_latest(metrics.registry), content_type=CONTENT_TYPE_LATEST)

    from edge_runtime.api.openapi import doc
    doc("Prometheus metrics", response="text/plain")(prometheus)
    # api.auth: all guards every route but the open ones, new routes included (auth.py).
    app.before_request(guard_reads)
    app.add_url_rule("/api/v1/session", "session", methods=["POST"], view_func=doc(
        "Trade the Bearer token for a read-only session cookie (status page; api.auth: all)",
        secured=True, errors=(400, 401, 403))(start_session))
    register_error_handlers(app)
    fix_mmap_threshold()  # large request bodies give their memory back when freed (core/heap.py)
    return app


class ApiServer:
    """Serves the app with waitress in a background thread; a daemon service (start/stop)."""

    def __init__(self, device: DeviceRoles, cfg: ApiConfig, stream_seconds: float = STREAM_SECONDS) -> None:
        self.cfg = cfg
        self.events = EventHub()
        # Looked up at scrape time, not bound now: what the daemon reports may be replaced or extended.
        self.metrics = Metrics(lambda: device.status.status(), lambda: device.status.health())
        self.app = create_app(device, cfg, self.metrics, self.events, stream_seconds)
        self._server: Any = None
        self.limits = Limits(cfg.request_deadline_s, cfg.connections_per_client, _bodies_bytes(cfg))
        _export_bound(self.limits, cfg)
        self.app.extensions["edge_runtime_limits"] = self.limits  # exports bind their bound to it (review.py)
        self.metrics.registry.register(ConnectionMetrics(lambda: self._server))
        self.probes = ProbeAnswers(self._probe_answer)  # /healthz and /readyz, answered by the loop (guard.py)
        self._map: dict[int, Any] = {}  # our own socket map, handed to waitress (public parameter)
        self._thread: threading.Thread | None = None

    # ---- a Sink (core/sink.py): the daemon tells the API of every journaled result ------------------

    name = "api"

    def notify(self, result: Result) -> None:
        self.metrics.observe(result)
        # A REST upload's verdict is published by the request itself once the output rails passed it
        # (rest.infer): what a rail refused must not reach the live stream.
        if result.camera != "api":
            self.events.publish(result.to_dict())  # the live event stream: drops for slow readers, never blocks

    def health(self) -> SinkHealth:
        return SinkHealth(True)

    @property
    def port(self) -> int:
        return int(self._server.effective_port) if self._server else self.cfg.port

    def apply(self, cfg: ApiConfig) -> list[str]:
        """Apply what can change live (token, body limit, timeouts: read per request); return the
        names of changed settings that need a restart."""
        old, self.cfg = self.cfg, cfg
        self.app.config["EDGE_API_TOKEN"] = cfg.token.get_secret_value() if cfg.token else None
        if cfg.token:  # a new key generation now, even if no request comes before the next rotation
            session_keys(self.app).key(cfg.token.get_secret_value())
        self.app.config["EDGE_API_AUTH"] = cfg.auth
        self.limits.request_deadline_s = cfg.request_deadline_s
        self.limits.connections_per_client = cfg.connections_per_client
        self.limits.bodies_bytes = _bodies_bytes(cfg)
        _export_bound(self.limits, cfg)  # from the next export on
        restart = [name for name in RESTART_SETTINGS if getattr(old, name) != getattr(cfg, name)]
        if self._server is not None and cfg.max_request_mb * 1024 * 1024 > self._server.adj.max_request_body_size:
            restart.append("max_request_mb")  # waitress refuses bodies over the bound it started with
        else:
            self.app.config["MAX_CONTENT_LENGTH"] = int(cfg.max_request_mb * 1024 * 1024)
        return restart

    def _probe_answer(self, path: str) -> tuple[str, list[tuple[str, str]], bytes]:
        """What the app answers a GET of a health path now (its hooks, route and error handlers; ~0.1 ms).
        Where the app's error handler made it (a hook or the route raised), it raises ProbeFailed with that
        answer: the error handler does not log for these requests, the refresher logs once per streak."""
        assert path in HEALTH_PATHS
        failures: list[Exception] = []
        with self.app.test_request_context(path, environ_base={PROBE_REFRESH: failures}):
            response = self.app.full_dispatch_request()
        answer = response.status, list(response.headers.items()), response.get_data()
        if failures:
            raise ProbeFailed(path, answer) from failures[0]
        return answer

    @staticmethod
    def _body_bound(cfg: ApiConfig) -> int:
        # waitress stops buffering a body past this (a plain-text 413); below it, Flask answers the
        # JSON 413 for bodies over api.max_request_mb. Twice the limit leaves room to raise it live.
        return int(cfg.max_request_mb * 1024 * 1024) * 2 + 1024 * 1024

    def start(self) -> None:
        try:
            self._server = create_guarded_server(
                self.app, self.limits, map=self._map, probes=self.probes, host=self.cfg.host, port=self.cfg.port,
                # api.threads for long requests (verdicts, streams), EXPORT_THREADS and QUERY_THREADS for
                # result exports and queries, QUICK_THREADS kept for the rest.
                threads=self.cfg.threads + EXPORT_THREADS + QUERY_THREADS + QUICK_THREADS, ident="edge-runtime",
                channel_timeout=CHANNEL_TIMEOUT_S, cleanup_interval=CLEANUP_S,
                asyncore_use_poll=True,
                max_request_body_size=self._body_bound(self.cfg),
                clear_untrusted_proxy_headers=True)
        except OSError as exc:
            raise EdgeRuntimeError(f"the API cannot listen on {self.cfg.host}:{self.cfg.port} ({exc.strerror}); "
                                   "change api.port or stop the program using it") from None
        self.probes.start()
        self._thread = threading.Thread(target=self._server.run, name="http", daemon=True)
        self._thread.start()
        log.info("api: serving on http://%s:%d/ (status page, REST, OpenAI, /metrics)", self.cfg.host, self.port)

    def stop(self) -> None:
        self.events.close()
        self.probes.stop()
        server = self._server
        if server is None:
            return
        try:
            if self._thread is not None and self._thread.is_alive():
                # Close every socket from inside the loop's own thread (waitress's trigger runs the thunk
                # there), so nothing races its poll(); an empty map then ends run(). A loop that is awake
                # already runs the thunk before pull_trigger's own write: the thunk leaves the wake-up pipe
                # open (closed below), or that write finds it closed (EBADF, or another file's descriptor).
                try:
                    server.trigger.pull_trigger(self._close_all)
                except OSError as exc:
                    log.warning("api: cannot wake the server's loop (%s); closing its sockets from here", exc)
                    self._close_all()
                self._thread.join(5)
            else:
                self._close_all()
        finally:
            # The workers end whatever happened above; then the pipe a worker finishing a response pulls.
            server.task_dispatcher.shutdown(cancel_pending=True, timeout=5)
            try:
                server.trigger.close()
            except OSError:  # pragma: no cover - its descriptors are ours until here
                log.debug("api: closing the wake-up pipe", exc_info=True)
            self._server = None

    def _close_all(self) -> None:
        server = self._server
        for dispatcher in list(self._map.values()):
            try:
                if server is not None and dispatcher is server.trigger:
                    dispatcher.del_channel()  # out of the loop's map (an empty map ends run()), still open
                elif dispatcher is server:
                    wasyncore.dispatcher.close(dispatcher)  # the listener; waitress's close() shuts the pipe too
                else:
                    dispatcher.close()
            except OSError:  # already closed by its peer
                pass


def _bodies_bytes(cfg: ApiConfig) -> int:
    """Request bodies received at once: four of the largest allowed, spooled to disk by waitress."""
    return int(4 * cfg.max_request_mb * 2**20)


def _export_bound(limits: Limits, cfg: ApiConfig) -> None:
    limits.export_min_bytes_s = cfg.export_min_kib_s * 1024
    limits.export_max_s = cfg.export_max_s
