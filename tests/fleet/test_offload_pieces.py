"""The offload pieces against a misbehaving HTTP server and bare sockets: hostile answers, retries,
the breaker, the config, and the Offloader's accounting and non-blocking take(). The real central
server runs in test_offload.py."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest
from jsonschema import Draft202012Validator

from edge_runtime.config import parse_config
from edge_runtime.config.offload import EndpointConfig, OffloadConfig
from edge_runtime.core.errors import ConfigError
from edge_runtime.core.governor_gate import GateDecision
from edge_runtime.core.inspection_queue import InspectionRequest
from edge_runtime.core.result import Result
from edge_runtime.fleet.offload.breaker import CircuitBreaker
from edge_runtime.fleet.offload.client import Endpoint
from edge_runtime.fleet.offload.escalation import matches
from edge_runtime.fleet.offload.router import Dropped, Offloader
from tests.support.mjpeg import free_port
from tests.support.offload import stand_in_inspector


class Misbehaving:
    """An HTTP server that answers each chat completion with the next canned (status, body)."""

    def __init__(self, answers: list[tuple[int, bytes]], drip_s: float = 0.0) -> None:
        self.answers = answers
        self.hits = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                status, body = owner.answers[min(owner.hits, len(owner.answers) - 1)]
                owner.hits += 1
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not drip_s:
                    self.wfile.write(body)
                    return
                for i in range(len(body)):  # a byte at a time, each well inside the socket timeout
                    try:
                        self.wfile.write(body[i:i + 1])
                        self.wfile.flush()
                    except OSError:
                        return
                    time.sleep(drip_s)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


SCHEMA = {"type": "object", "properties": {"defect": {"type": "boolean"}}, "required": ["defect"],
          "additionalProperties": False}


def completion(content: str) -> bytes:
    choice = {"message": {"role": "assistant", "content": content}}
    return json.dumps({"model": "big-vlm", "choices": [choice]}).encode()


def endpoint(url: str, **cfg: Any) -> Endpoint:
    offload = OffloadConfig(enabled=True, endpoints=[EndpointConfig(url=url, timeout_s=2)],
                            **{"retry": {"attempts": 3, "backoff_s": 0.01}, **cfg})
    return Endpoint(offload.endpoints[0], offload)


@pytest.mark.parametrize("body, why", [
    (completion('{"defect": "yes"}'), "does not match the verdict schema"),
    (completion("not json"), "not JSON"),
    (b"<html>proxy error</html>", "not an OpenAI chat completion"),
    (completion('{"defect": true, "notes": "' + "x" * 5000 + '"}'), "larger than 4 KiB"),
    (completion("[" * 1500 + "]" * 1500), "nested deeper than 64 levels"),
    (b'{"choices": ' + b"[" * 1800 + b"]" * 1800 + b"}", "nested deeper than"),
])
def test_unusable_answers_are_refused_without_retry_and_counted(body: bytes, why: str) -> None:
    server = Misbehaving([(200, body)])
    try:
        ep = endpoint(server.url, max_response_kb=4)
        assert ep.ask(b"{}", Draft202012Validator(SCHEMA), threading.Event()) is None
        assert server.hits == 1 and ep.failures == 1 and why in (ep.last_error or "")
    finally:
        server.close()


def test_a_server_that_drips_its_answer_is_cut_off_at_the_timeout() -> None:
    server = Misbehaving([(200, completion('{"defect": false}'))], drip_s=0.2)
    try:
        ep = endpoint(server.url, retry={"attempts": 1})
        t0 = time.monotonic()
        assert ep.ask(b"{}", Draft202012Validator(SCHEMA), threading.Event()) is None
        assert time.monotonic() - t0 < 4  # timeout_s is 2; the whole answer would take ~10 s
        assert "no complete answer within 2 s" in (ep.last_error or "")
    finally:
        server.close()


def test_server_errors_are_retried_with_backoff_and_a_good_answer_wins() -> None:
    server = Misbehaving([(503, b'{"error": "loading"}'), (200, completion('{"defect": false}'))])
    try:
        ep = endpoint(server.url)
        answer = ep.ask(b"{}", Draft202012Validator(SCHEMA), threading.Event())
        assert answer is not None and answer.verdict == {"defect": False} and answer.model == "big-vlm"
        assert server.hits == 2 and ep.requests == 2 and ep.failures == 1
        assert ep.breaker.state == "closed"
    finally:
        server.close()


def test_breaker_opens_after_n_failures_and_one_half_open_probe_closes_it() -> None:
    now = [0.0]
    breaker = CircuitBreaker(failures=3, open_s=10, clock=lambda: now[0])
    for _ in range(2):
        assert breaker.allow()
        breaker.failure()
    assert breaker.state == "closed"
    breaker.failure()
    assert breaker.state == "open" and not breaker.allow()
    now[0] = 10.0
    assert breaker.state == "half_open"
    assert breaker.allow() and not breaker.allow()  # exactly one probe
    breaker.failure()  # the probe failed: open again for another open_s
    assert breaker.state == "open" and not breaker.allow()
    now[0] = 20.0
    assert breaker.allow()
    breaker.success()
    assert breaker.state == "closed" and breaker.opened == 2 and breaker.closed == 1


def test_escalation_condition_compares_json_types() -> None:
    assert matches({"defect": True, "category": "scratch"}, {"defect": True})
    assert not matches({"defect": 1}, {"defect": True})
    assert not matches({"category": "scratch"}, {"defect": True})


@pytest.mark.parametrize("text, message", [
    ("offload:\n  enabled: true\n", "offload.enabled needs at least one entry"),
    ("offload:\n  endpoints: [{url: 'ftp://x/v1'}]\n", "offload.endpoints.0.url"),
    ("offload:\n  enabled: true\n  endpoints: [{url: 'http://c/v1', key: 1}]\n", "unknown key"),
    ("cameras:\n  - {name: a, source: x.avi, remote: true}\n", "remote: true need offload.enabled"),
])
def test_offload_config_errors_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(text, "edge.yaml")


def offloader(url: str, local: Any, gate: GateDecision | None = None, **cfg: Any) -> Offloader:
    config = OffloadConfig(enabled=True, endpoints=[EndpointConfig(url=url, timeout_s=1)], **cfg)
    decision = gate or GateDecision()
    model = stand_in_inspector(SCHEMA)  # what the Offloader reads of the loaded model: the schema and the prompt
    return Offloader(config, {"a"}, "dev", lambda: model, lambda req, res: res, local, lambda: decision)


def frame_request() -> InspectionRequest:
    return InspectionRequest(np.zeros((32, 32, 3), np.uint8), "a")


def refuse(request: InspectionRequest) -> Any:
    raise AssertionError("this fallback must not inspect locally")


def test_every_endpoint_down_with_fallback_drop_counts_the_drop(caplog: pytest.LogCaptureFixture) -> None:
    # Nothing listens on the port: connection refused. One worker: the second frame meets the open breaker.
    off = offloader(f"http://127.0.0.1:{free_port()}/v1", refuse, fallback="drop", retry={"attempts": 1},
                    breaker={"failures": 1, "open_s": 60}, workers=1)
    off.start()
    try:
        futures = [off.take(frame_request(), "remote") for _ in range(3)]
        for future in futures:
            with pytest.raises(Dropped):
                future.result(timeout=10)
        status = off.status()
        assert status["frames"] == {"taken": 3, "remote": 0, "fallback_local": 0, "dropped": 3, "failed": 0,
                                    "in_flight": 0}
        assert status["endpoints"][0]["requests"] == 1  # the open breaker spared the endpoint the rest
        opened = [r for r in caplog.records if "circuit is open" in r.getMessage()]
        assert len(opened) == 1 and opened[0].levelname == "WARNING"  # said once, not silent
    finally:
        off.stop()


def test_local_fallback_is_not_taken_while_the_governor_pauses_the_device() -> None:
    off = offloader(f"http://127.0.0.1:{free_port()}/v1", refuse, GateDecision(paused=True), retry={"attempts": 1})
    off.start()
    try:
        with pytest.raises(Dropped, match="governor paused"):
            off.take(frame_request(), "governor").result(timeout=10)
        assert off.status()["dropped_by_reason"] == {"governor paused": 1}
    finally:
        off.stop()


def test_take_never_waits_for_a_hung_server_a_full_queue_falls_back_at_once() -> None:
    hung = socket.socket()  # accepts connections (backlog) and never answers
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)
    local_calls: list[InspectionRequest] = []

    def local(request: InspectionRequest) -> Future[Result]:
        local_calls.append(request)
        future: Future[Result] = Future()
        future.set_exception(RuntimeError("not inspected in this test"))
        return future

    off = offloader(f"http://127.0.0.1:{hung.getsockname()[1]}/v1", local, queue_size=2, workers=1,
                    retry={"attempts": 1})
    off.start()
    try:
        slowest = 0.0
        for _ in range(20):
            t0 = time.perf_counter()
            off.take(frame_request(), "remote")
            slowest = max(slowest, time.perf_counter() - t0)
        assert slowest < 0.05  # capture's side never waits for the network
        status = off.status()
        assert status["frames"]["fallback_local"] >= 17 and len(local_calls) >= 17  # 1 in flight + 2 queued
        assert status["frames"]["taken"] == 20
    finally:
        off.stop()
        hung.close()
