"""`/healthz` and `/readyz` answered by the server's loop thread from answers the app's routes made ahead
(guard.ProbeAnswers): no server thread is needed, so a probe is answered even while every one of them
is stuck in the app; the answers are the app's own, byte for byte but the Date; and `/readyz` shows a
change of state within PROBE_MAX_AGE_S, also when the thread that makes the answers is stuck."""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_runtime.api.guard import PROBE_MAX_AGE_S, GuardedServer
from edge_runtime.app.daemon import Daemon
from tests.api.test_api import make_daemon

PROBE_TIMEOUT_S = 5.0  # "answered at all", not a speed bound (benchmarks/health_under_load.py measures that)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    d = make_daemon(tmp_path_factory.mktemp("health-probes"), demo_dir, camera=False)
    yield d
    d.stop()


def server(daemon: Daemon) -> GuardedServer:
    assert daemon.api is not None and daemon.api._server is not None
    return daemon.api._server


def exchange(port: int, raw: bytes, timeout: float = PROBE_TIMEOUT_S) -> bytes:
    """Send `raw` on a new connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(raw)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def readyz(port: int) -> tuple[int, dict[str, str], Any]:
    answer = exchange(port, b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return int(status.split()[1]), headers, json.loads(body)


def wait_for_code(port: int, code: int) -> None:
    """Until /readyz answers `code` (an earlier test's state may still be in the answers for a moment)."""
    deadline = time.monotonic() + 10
    while readyz(port)[0] != code:
        assert time.monotonic() < deadline, f"/readyz never answered {code}"
        time.sleep(0.05)


def test_probes_are_answered_while_every_server_thread_is_stuck_in_the_app(
        daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, a probe was served by the app on the health lane's one thread: one stuck probe (here, the
    first) and every later one waited for it (seen failing: the first /healthz timed out)."""
    assert daemon.api is not None
    app, port = daemon.api.app, daemon.api.port
    pool = len(server(daemon).task_dispatcher.threads)
    release, entered = threading.Event(), []
    inner = app.wsgi_app

    def stuck(environ: Any, start_response: Any) -> Any:
        entered.append(environ["PATH_INFO"])
        release.wait(60)
        return inner(environ, start_response)

    monkeypatch.setattr(app, "wsgi_app", stuck)
    held = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(pool)]
    try:
        for s in held:
            s.sendall(b"GET /api/v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        deadline = time.monotonic() + 10
        while len(entered) < pool and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(entered) == pool  # every thread of the pool is in the app, going nowhere
        ready = json.loads(json.dumps(daemon.health()))
        for raw, body in ((b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", b'{"status":"ok"}\n'),
                          (b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", None),
                          (b"HEAD /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", b""),
                          (b"GET /healthz HTTP/1.0\r\n\r\n", b'{"status":"ok"}\n')):
            answer = exchange(port, raw)
            assert answer.startswith(b"HTTP/1.") and b" 200 OK\r\n" in answer, answer
            got = answer.partition(b"\r\n\r\n")[2]
            if body is None:
                assert {k: v for k, v in json.loads(got).items() if k != "model"} == ready
            else:
                assert got == body
        assert entered == ["/api/v1/status"] * pool  # the probes never reached the app
    finally:
        release.set()
        for s in held:
            s.close()


def normalized(answer: bytes) -> bytes:
    return re.sub(rb"\r\nDate: [^\r]*", b"", answer)


PROBES = (
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"HEAD /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /readyz?verbose=1 HTTP/1.0\r\n\r\n",
    # keep-alive, then a close: both answered on one connection
    b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\nHEAD /healthz HTTP/1.1\r\nConnection: close\r\n\r\n",
    # pipelined after a close: dropped, as waitress drops it after an app's answer
    b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\nGET /nowhere HTTP/1.1\r\n\r\n",
    b"GET /nowhere HTTP/1.1\r\n\r\nGET /readyz HTTP/1.1\r\nConnection: close\r\n\r\n",  # after an app answer
)


def test_the_loop_answers_what_the_app_answers(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    """Status line, headers (but the Date) and body, ready and unready, as the app on the lane answers."""
    assert daemon.api is not None
    port, srv = daemon.api.port, server(daemon)
    probes = srv.probes
    assert probes is not None

    def both() -> list[tuple[bytes, bytes]]:
        from_loop = [normalized(exchange(port, raw)) for raw in PROBES]
        monkeypatch.setattr(srv, "probes", None)  # every probe to the lane: the app answers
        try:
            from_app = [normalized(exchange(port, raw)) for raw in PROBES]
        finally:
            monkeypatch.setattr(srv, "probes", probes)
        return list(zip(from_loop, from_app, strict=True))

    wait_for_code(port, 200)
    for loop, app in both():
        assert loop == app
    monkeypatch.setattr(daemon.journal, "full_since", time.monotonic())  # the journal cannot write: 503
    wait_for_code(port, 503)
    answers = both()
    for loop, app in answers:
        assert loop == app
    assert answers[1][0].startswith(b"HTTP/1.1 503 SERVICE UNAVAILABLE\r\n") and b"Retry-After: 5\r\n" in answers[1][0]


@pytest.mark.parametrize("refresher", ["turning", "stuck"])
def test_readyz_shows_a_change_within_its_bound(daemon: Daemon, monkeypatch: pytest.MonkeyPatch,
                                                refresher: str) -> None:
    """An answer is at most PROBE_MAX_AGE_S old when served: every /readyz sent that long after the journal
    filled says 503. With the thread that makes the answers stuck, its last answer expires and the app
    answers on the lane."""
    assert daemon.api is not None
    port, probes = daemon.api.port, daemon.api.probes
    wait_for_code(port, 200)
    unstuck = threading.Event()
    if refresher == "stuck":
        make = probes.make

        def stuck(path: str) -> tuple[str, list[tuple[str, str]], bytes]:
            unstuck.wait(60)
            return make(path)

        monkeypatch.setattr(probes, "make", stuck)
        time.sleep(0.3)  # the thread is in `stuck` now: its answers age from here
    try:
        filled = time.monotonic()
        monkeypatch.setattr(daemon.journal, "full_since", filled)
        while True:
            sent = time.monotonic()
            code, headers, body = readyz(port)
            if code == 503:
                break
            assert sent - filled < PROBE_MAX_AGE_S, "a /readyz answer older than its bound was served"
            time.sleep(0.01)
        assert body["ready"] is False and "disk full" in body["reasons"] and headers["Retry-After"] == "5"
    finally:
        unstuck.set()


@pytest.mark.parametrize("reader", ["prompt", "silent"])
def test_a_probe_pipelined_after_a_bound_answer_leaves_its_bound_to_its_last_byte(reader: str) -> None:
    """A bound ends when the bound answer's last byte has left waitress's buffer. Before, the next request on
    the connection ended it (ChannelTask.service, and answer_probe for a probe answered by the loop) while up
    to 16 MB of the answer could still be buffered: a request pipelined behind it exempted the rest from the
    export's rate and clock and gave its slot back. Seen failing before: "prompt", the bound ended with
    ~8 KB of the 1 MiB answer sent; "silent", it ended at once and bound_cut["export"] stayed 0. Scaled as
    the keep-alive test in test_http_trickle_export.py: a 1 s window; both ends' socket buffers are small,
    so the bound answer waits in waitress's buffer. "prompt" reads both answers as they come: neither is
    cut, the bound ends once its answer is sent whole; "silent" reads nothing: the export's rate cuts it."""
    from edge_runtime.api.guard import Limits, ProbeAnswers, bind, create_guarded_server

    limits = Limits(export_min_bytes_s=256 * 1024, export_window_s=1.0, export_max_s=60.0)
    ended: list[int] = []  # the channel's bytes_sent when the bound ended
    size = 2**20
    channel: list[Any] = []

    class Bound:
        def __init__(self, environ: dict[str, Any]) -> None:
            self.bound = bind(environ, "export", limits, on_end=lambda: ended.append(channel[0].bytes_sent))

        def __iter__(self) -> Iterator[bytes]:
            yield b"b" * size

        def close(self) -> None:
            if self.bound is not None:
                self.bound.done = True

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(size))])
        return Bound(environ)

    body = b'{"status":"ok"}\n'
    probes = ProbeAnswers(lambda path: ("200 OK", [("Content-Type", "application/json"),
                                                   ("Content-Length", str(len(body)))], body))
    probes.refresh()
    loop_map: dict[int, Any] = {}
    # poll(), as ApiServer: select() fails (EBADF) on a channel the maintenance pass cut during its own setup
    server = create_guarded_server(app, limits, map=loop_map, probes=probes, host="127.0.0.1", port=0,
                                   threads=2, cleanup_interval=1, channel_timeout=30, asyncore_use_poll=True)
    loop = threading.Thread(target=server.run, daemon=True)
    loop.start()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        sock.connect(("127.0.0.1", server.socket.getsockname()[1]))
        deadline = time.monotonic() + 5
        while not channel:
            assert time.monotonic() < deadline, "the connection never showed"
            time.sleep(0.01)
            channel[:] = [c for c in list(server.active_channels.values())
                          if c.socket.getpeername() == sock.getsockname()]
        channel[0].socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sock.sendall(b"GET /bound HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        if reader == "silent":
            time.sleep(0.5)  # the probe is in and answered (queued behind the bound answer)
            assert not ended, f"the bound ended with {ended[0]} bytes sent, its answer still buffered"
            deadline = time.monotonic() + 10
            while server.bound_cut["export"] == 0:
                assert time.monotonic() < deadline, "the bound answer left unread was never cut"
                time.sleep(0.05)
            assert server.bound_cut["export"] == 1 and len(ended) == 1
            return
        sock.settimeout(10)
        data = b""
        while not data.endswith(body) and (chunk := sock.recv(65536)):
            data += chunk
        first, _, rest = data.partition(b"\r\n\r\n")
        assert first.startswith(b"HTTP/1.1 200 OK\r\n") and rest.startswith(b"b" * size + b"HTTP/1.1 200 OK\r\n")
        assert rest.endswith(b"\r\n\r\n" + body)
        assert len(ended) == 1 and ended[0] >= len(first) + 4 + size, ended  # not before its last byte was sent
        assert server.bound_cut["export"] == 0
    finally:
        sock.close()
        server.task_dispatcher.shutdown(cancel_pending=True, timeout=5)
        server.trigger.pull_trigger(lambda: [d.close() for d in list(loop_map.values())])
        loop.join(5)


def test_a_failing_readyz_is_logged_once_per_streak_not_per_refresh(
        daemon: Daemon, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The refresher asks the app for /readyz every 0.1 s, probed or not; when the route raised, the app's error
    handler logged a traceback each time. Seen failing before the fix: 19 records in 2 s (each the error
    handler's "api: GET /readyz failed"). Now: one when the streak begins, one when it ends; the loop still
    serves the app's 500; a client's own request that fails (answered by the app) still logs."""
    assert daemon.api is not None
    port, srv = daemon.api.port, server(daemon)
    probes = srv.probes
    wait_for_code(port, 200)

    def broken() -> dict[str, Any]:
        raise RuntimeError("health is broken")

    caplog.set_level(logging.INFO)
    caplog.clear()
    with monkeypatch.context() as m:
        m.setattr(daemon, "health", broken)  # status.health: device.status is the daemon
        time.sleep(2.0)
        failing = [r for r in caplog.records if r.levelno >= logging.WARNING]
        code, _, body = readyz(port)  # from the loop: the app's own answer
        assert code == 500 and body["error"]["type"] == "internal_error", body
        assert "RuntimeError: health is broken" in body["error"]["message"]
        assert len(failing) == 1, [r.getMessage() for r in failing]
        assert failing[0].exc_info is not None and "GET /readyz failed" in failing[0].getMessage()
        caplog.clear()
        m.setattr(srv, "probes", None)  # a client's probe to the lane: the app answers and logs it
        assert readyz(port)[0] == 500
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == ["api: GET /readyz failed"]
        m.setattr(srv, "probes", probes)
        caplog.clear()
    wait_for_code(port, 200)
    time.sleep(0.5)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        "api: the health probes' answers are made without error again"]
