"""Slow and greedy clients against the real waitress server: a request must arrive whole within
`api.request_deadline_s`, one address holds at most `api.connections_per_client` connections, and
`/healthz` from 127.0.0.1 connects and answers while other clients fill the connection table.

Any 127.x address is a distinct client on Linux: the sockets bind 127.0.0.2, 127.0.0.3, ... as source.
"""

from __future__ import annotations

import json
import resource
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from edge_runtime.api import CLEANUP_S
from edge_runtime.api.guard import CONNECTION_LIMIT
from edge_runtime.app.daemon import Daemon
from tests.api.test_api import make_daemon
from tests.support.waiting import wait_for

HEAD = b"GET /healthz HTTP/1.1\r\nHost: device\r\nX-Slow: "


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # ~1,100 sockets on both ends, one process
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 4096), hard), hard))
    d = make_daemon(tmp_path_factory.mktemp("slowloris"), demo_dir, camera=False)
    yield d
    d.stop()
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture
def port(daemon: Daemon) -> Iterator[int]:
    assert daemon.api is not None
    yield daemon.api.port
    daemon.api.apply(daemon.config.api)  # back to the configured limits
    guard = daemon.api._server
    wait_for(lambda: not guard.per_client, timeout=15, what="the server to forget closed connections")


def set_limits(daemon: Daemon, **update: object) -> None:
    assert daemon.api is not None
    assert daemon.api.apply(daemon.config.api.model_copy(update=update)) == []  # live, no restart


def connect(port: int, source: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))


def get_healthz(sock: socket.socket) -> bytes:
    """One whole response (head and Content-Length body) to a /healthz request on `sock`."""
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: device\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += sock.recv(4096)
    return head + b"\r\n\r\n" + body


def refused(sock: socket.socket) -> bool:
    """The server closed this connection without serving it (a 429 line, EOF or a reset)."""
    sock.settimeout(2)
    try:
        data = sock.recv(4096)
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return data == b"" or data.startswith(b"HTTP/1.1 429")


def healthz_latencies(port: int, probes: int = 20) -> list[float]:
    out = []
    for _ in range(probes):
        started = time.perf_counter()
        assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
        out.append(time.perf_counter() - started)
    return sorted(out)


def readable(socks: list[socket.socket], timeout: float) -> list[socket.socket]:
    """The sockets with data or a close waiting. poll(), not select(): late in a whole-suite run the
    descriptors of 512 sockets go past select()'s 1024 (a fresh-clone run failed so)."""
    poller = select.poll()
    by_fd = {sock.fileno(): sock for sock in socks}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    return [by_fd[fd] for fd, _ in poller.poll(timeout * 1000)]


class Dribblers:
    """Connections that send a request head one byte every `every` seconds and never finish it;
    records when each one was first fed and when the server answered or closed it."""

    def __init__(self, port: int, sources: list[str], per_source: int, every: float = 0.3) -> None:
        self.socks = [connect(port, src) for src in sources for _ in range(per_source)]
        self.started: dict[socket.socket, float] = {}
        self.ended: dict[socket.socket, tuple[float, bytes]] = {}
        self.every = every
        self._stop = threading.Event()
        for sock in self.socks:
            sock.setblocking(False)
            self._send(sock, HEAD)
            self.started[sock] = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _send(self, sock: socket.socket, data: bytes) -> None:
        try:
            sock.send(data)
        except OSError:
            self.ended.setdefault(sock, (time.monotonic(), b""))

    def _run(self) -> None:
        while not self._stop.is_set():
            live = [s for s in self.socks if s not in self.ended]
            if not live:
                return
            for sock in readable(live, self.every):
                try:
                    data = sock.recv(4096)
                except OSError:
                    data = b""
                self.ended[sock] = (time.monotonic(), data)
            for sock in live:
                # An answer that arrived since the select above: a byte sent now would meet the closed
                # socket, and its reset would discard the 408 still unread.
                if sock not in self.ended and not readable([sock], 0):
                    self._send(sock, b"x")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in self.socks:
            sock.close()


def metric(port: int, name: str) -> float:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


def test_dribbling_client_gets_408_and_is_closed_at_the_request_deadline(daemon: Daemon, port: int) -> None:
    set_limits(daemon, request_deadline_s=1.0)
    cut_before = metric(port, "edge_api_requests_cut_total")
    # From 127.0.0.1: exempt from the per-client cap, not from the deadline.
    slow = Dribblers(port, ["127.0.0.1"], 1)
    try:
        (sock,) = slow.socks
        wait_for(lambda: sock in slow.ended, timeout=8, what="the server to cut the dribbling request")
        at, answer = slow.ended[sock]
        took = at - slow.started[sock]
    finally:
        slow.close()
    assert answer.startswith(b"HTTP/1.1 408 ") and b'"request_timeout"' in answer, answer
    assert 1.0 <= took < 1.0 + CLEANUP_S + 1.5, took
    assert metric(port, "edge_api_requests_cut_total") == cut_before + 1


def test_deadline_runs_per_request_not_per_keepalive_connection(daemon: Daemon, port: int) -> None:
    set_limits(daemon, request_deadline_s=1.0)
    with connect(port, "127.0.0.2") as sock:
        for _ in range(4):  # 2.4 s on one connection, each request whole at once
            assert get_healthz(sock).startswith(b"HTTP/1.1 200 ")
            time.sleep(0.6)


def test_two_hundred_dribblers_are_all_cut_while_healthz_answers_in_milliseconds(daemon: Daemon, port: int) -> None:
    set_limits(daemon, request_deadline_s=2.0, connections_per_client=256)
    slow = Dribblers(port, ["127.0.0.2"], 200)
    try:
        latencies = healthz_latencies(port)
        print(f"\n200 dribblers: /healthz p50 {latencies[10] * 1000:.1f} ms, max {latencies[-1] * 1000:.1f} ms")
        assert latencies[-1] < 0.5, latencies
        wait_for(lambda: len(slow.ended) == 200, timeout=2.0 + CLEANUP_S + 5, what="every dribbler cut")
        # Each got the 408: its next bytes are drained, not met by a reset that discarded the answer
        # (before the drain 56 of 200 were 408s on a loaded CI, over 100 when idle, the rest resets).
        answers = [answer[:12] for _, answer in slow.ended.values()]
        assert set(answers) == {b"HTTP/1.1 408"}, answers
        cut_after = sorted(at - slow.started[s] for s, (at, _) in slow.ended.items())
        assert 2.0 <= cut_after[0] and cut_after[-1] < 2.0 + CLEANUP_S + 3, cut_after
    finally:
        slow.close()


def test_connection_beyond_the_per_client_cap_is_refused_while_another_address_gets_through(
        daemon: Daemon, port: int) -> None:
    cap = daemon.config.api.connections_per_client
    assert cap == 64  # the default
    held = [connect(port, "127.0.0.2") for _ in range(cap)]
    try:
        refused_before = metric(port, "edge_api_connections_refused_total")
        extra = connect(port, "127.0.0.2")
        assert refused(extra)
        extra.close()
        assert metric(port, "edge_api_connections_refused_total") == refused_before + 1
        assert get_healthz(held[0]).startswith(b"HTTP/1.1 200 ") and get_healthz(held[-1]).startswith(b"HTTP/1.1 200 ")
        with connect(port, "127.0.0.3") as other:
            assert get_healthz(other).startswith(b"HTTP/1.1 200 ")
        # A closed connection gives its slot back.
        held.pop().close()

        def one_more() -> bool:
            sock = connect(port, "127.0.0.2")
            if refused(sock):
                sock.close()
                return False
            held.append(sock)
            return True
        wait_for(one_more, timeout=5, what="a slot for 127.0.0.2 after one of its connections closed")
    finally:
        for sock in held:
            sock.close()


def test_healthz_from_loopback_connects_while_other_clients_fill_the_connection_table(
        daemon: Daemon, port: int) -> None:
    set_limits(daemon, request_deadline_s=60)
    sources = [f"127.0.0.{i}" for i in range(2, 2 + CONNECTION_LIMIT // 64 + 1)]  # 8 x 64 = 512
    slow = Dribblers(port, sources, 64)
    try:
        assert daemon.api is not None
        server = daemon.api._server
        # (- 2: waitress's own limit counts its listening socket and wake-up pipe as connections)
        wait_for(lambda: len(server.active_channels) >= CONNECTION_LIMIT - 2, timeout=5, what="a full table")
        latencies = healthz_latencies(port)
        print(f"\n{CONNECTION_LIMIT} connections held: /healthz p50 {latencies[10] * 1000:.1f} ms, "
              f"max {latencies[-1] * 1000:.1f} ms")
        assert latencies[-1] < 1.0, latencies
        wait_for(lambda: len(slow.ended) >= 512 - CONNECTION_LIMIT, timeout=5, what="the surplus refused")
        assert len(slow.ended) == 512 - CONNECTION_LIMIT  # the other 500 stayed open all along
    finally:
        slow.close()


def test_a_pipelined_request_is_not_cut_while_the_one_before_it_is_served() -> None:
    """waitress reads nothing more of a connection while it serves a request on it, so a pipelined
    request that arrived in part must not run out of time meanwhile (the 408 used to land inside the
    first response's chunked body)."""
    from edge_runtime.api.guard import Limits, create_guarded_server

    def slow(environ: dict[str, object], start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        for i in range(4):
            time.sleep(0.5)
            yield b"chunk%d\n" % i

    loop_map: dict[int, Any] = {}
    server = create_guarded_server(slow, Limits(request_deadline_s=0.5), map=loop_map, host="127.0.0.1", port=0,
                                   threads=2, cleanup_interval=0.2, channel_timeout=10)
    loop = threading.Thread(target=server.run, daemon=True)
    loop.start()
    try:
        with socket.create_connection(("127.0.0.1", server.socket.getsockname()[1]), timeout=10) as sock:
            sock.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n")  # /b not finished
            data = b""
            while b"chunk3" not in data:
                chunk = sock.recv(65536)
                assert chunk, f"closed early: {data!r}"
                data += chunk
        assert b"408" not in data and server.cut_requests == 0
    finally:
        # The workers first (none may pull the wake-up pipe once it is closed), then every socket from
        # inside the loop's thread, as ApiServer.stop does. server.close() from here closed the pipe while
        # the loop and a worker still used it ('Exception when servicing ... EBADF' from a worker) and
        # left the two workers running for the rest of the suite.
        server.task_dispatcher.shutdown(cancel_pending=True, timeout=5)
        server.trigger.pull_trigger(lambda: [d.close() for d in list(loop_map.values())])
        loop.join(5)
        assert not loop.is_alive(), "the server loop did not end once its map was empty"


def test_uploads_beyond_the_body_budget_are_refused_at_their_head_before_any_spooling() -> None:
    """waitress spools a request body to a temporary file before the app (and its token check) sees
    it: forty unauthenticated 30 MB uploads took 1.2 GB of /tmp. Bodies are reserved at their head."""
    from edge_runtime.api.guard import Limits, create_guarded_server

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        environ["wsgi.input"].read()
        start_response("401 Unauthorized", [("Content-Type", "text/plain")])
        return [b"no"]

    loop_map: dict[int, Any] = {}
    server = create_guarded_server(app, Limits(bodies_bytes=2_000_000), map=loop_map, host="127.0.0.1", port=0,
                                   threads=2, max_request_body_size=1_000_000, channel_timeout=10)
    loop = threading.Thread(target=server.run, daemon=True)
    loop.start()
    port = server.socket.getsockname()[1]
    head = b"POST /api/v1/status HTTP/1.1\r\nHost: x\r\nContent-Length: 900000\r\n\r\n"
    socks = []
    try:
        for _ in range(2):  # 1.8 MB reserved: both fit
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(head + b"x" * 1000)
            socks.append(s)
        wait_for(lambda: server.bodies_in_flight == 1_800_000, 5, "two bodies reserved")
        third = socket.create_connection(("127.0.0.1", port), timeout=5)
        third.sendall(head + b"x" * 1000)
        answer = third.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503") and b'"busy"' in answer, answer
        assert server.bodies_refused == 1
        third.close()
        socks[0].sendall(b"x" * 899_000)  # the first upload completes: its reservation is released
        assert socks[0].recv(4096).startswith(b"HTTP/1.1 401")
        wait_for(lambda: server.bodies_in_flight == 900_000, 5, "the first body released")
        fourth = socket.create_connection(("127.0.0.1", port), timeout=5)
        fourth.sendall(head + b"x" * 899_999 + b"x")
        assert fourth.recv(4096).startswith(b"HTTP/1.1 401")  # fits again
        fourth.close()
    finally:
        for s in socks:
            s.close()
        try:  # while the server's loop runs: it is what sees the connections close
            wait_for(lambda: server.bodies_in_flight == 0, 5, "every reservation released when connections close")
        finally:
            # Closed from inside the loop's thread, as ApiServer.stop does: server.close() from here raced
            # the loop's select() (EBADF in the server thread, a CI failure of this test).
            server.trigger.pull_trigger(lambda: [d.close() for d in list(loop_map.values())])
            loop.join(5)
            assert not loop.is_alive(), "the server loop did not end once its map was empty"
            server.task_dispatcher.shutdown(cancel_pending=True, timeout=5)


# ---- refusals a client still uploading can read ------------------------------------------------

class SlowBody:
    """A request body read in 8 KiB blocks with a pause between them: an uploader on a slower link,
    whose head arrives (and is refused) while most of its body is still to come."""

    def __init__(self, size: int, pause: float = 0.001) -> None:
        self.left, self.pause = size, pause

    def read(self, n: int = 8192) -> bytes:
        n = min(n, 8192, self.left)
        self.left -= n
        time.sleep(self.pause)
        return b"\xff" * n


def hold_upload_budget(port: int, daemon: Daemon) -> list[socket.socket]:
    """Uploads whose heads reserve the whole body budget (4 x api.max_request_mb) and whose bodies
    never come: the device is busy receiving them."""
    assert daemon.api is not None
    server = daemon.api._server
    size = int(daemon.config.api.max_request_mb * 1024 * 1024) - 1000
    held = []
    for _ in range(4):
        sock = connect(port, "127.0.0.1")
        sock.sendall(b"POST /api/v1/infer HTTP/1.1\r\nHost: device\r\nContent-Type: image/jpeg\r\n"
                     b"Content-Length: %d\r\n\r\n" % size)
        held.append(sock)
    wait_for(lambda: server.bodies_in_flight == 4 * size, 5, "the upload budget reserved")
    return held


def test_an_uploader_refused_for_the_busy_budget_reads_the_503_and_its_reason(daemon: Daemon, port: int) -> None:
    """The 503 is written at the head; the client is still sending its body. Closing the socket with that
    body unread made the kernel answer with a reset: urllib got ConnectionResetError / BrokenPipeError
    instead of the 503, and could not tell "busy, retry" from a network fault."""
    import urllib.error
    import urllib.request

    held = hold_upload_budget(port, daemon)
    try:
        size = 1_900_000
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/infer", data=SlowBody(size),
                                         headers={"Content-Type": "image/jpeg", "Content-Length": str(size)})
        with pytest.raises(urllib.error.HTTPError) as refused_503:
            urllib.request.urlopen(request, timeout=10)
        assert refused_503.value.code == 503
        assert json.loads(refused_503.value.read())["error"]["type"] == "busy"
    finally:
        for sock in held:
            sock.close()


def test_an_uploader_at_the_servers_body_bound_reads_the_413(daemon: Daemon, port: int) -> None:
    """A declared Content-Length at waitress's bound is refused at the head (JsonErrorTask, 413), its body
    unread: urllib got BrokenPipeError / ConnectionResetError instead of the 413. The drain takes at most
    that bound, so a client that sends more is reset: requests (urllib3) and curl still read the answer
    then (after a failed send, or as it arrives), urllib does not."""
    import urllib.error
    import urllib.request

    assert daemon.api is not None
    size = daemon.api._server.adj.max_request_body_size
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/infer", data=SlowBody(size),
                                     headers={"Content-Type": "image/jpeg", "Content-Length": str(size)})
    with pytest.raises(urllib.error.HTTPError) as refused_413:
        urllib.request.urlopen(request, timeout=10)
    assert refused_413.value.code == 413
    assert json.loads(refused_413.value.read())["error"]["type"] == "request_entity_too_large"


def endless_upload(port: int, head: bytes, every: float, block: int) -> tuple[bytes, float, int]:
    """Send `head` and then body bytes forever (a block each `every` seconds); return what the server
    answered, how long until it stopped taking bytes (EOF then reset, or a reset), and the bytes sent."""
    sock = connect(port, "127.0.0.1")
    sock.sendall(head)
    started = time.monotonic()
    answer, sent = b"", 0
    sock.settimeout(0.5)
    try:
        while time.monotonic() - started < 30:
            if readable([sock], 0):
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    break
                answer += data
            try:
                sent += sock.send(b"x" * block)
            except TimeoutError:
                pass
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(every)
        return answer, time.monotonic() - started, sent
    finally:
        sock.close()


@pytest.mark.parametrize("every, block", [(0.0, 65536), (0.05, 1024)], ids=["fast", "slow"])
def test_a_refused_client_that_never_stops_sending_is_cut_off_within_the_bound(
        daemon: Daemon, port: int, every: float, block: int) -> None:
    """The refusal is readable, but draining its body is bounded: at most the largest body the server
    takes (waitress's bound) and `linger_s` seconds; nothing of it is kept and no worker thread waits."""
    assert daemon.api is not None
    server = daemon.api._server
    head = b"POST /api/v1/infer HTTP/1.1\r\nHost: device\r\nContent-Length: 1000000000000\r\n\r\n"
    result: list[tuple[bytes, float, int]] = []
    sender = threading.Thread(target=lambda: result.append(endless_upload(port, head, every, block)))
    sender.start()
    try:
        time.sleep(0.5)  # refused and draining by now (or closed, before the fix)
        # Meanwhile the server answers others at once: the drain holds no worker thread.
        assert max(healthz_latencies(port, probes=5)) < 0.5
    finally:
        sender.join(40)
    answer, took, sent = result[0]
    assert answer.startswith(b"HTTP/1.1 413 ") and b'"request_entity_too_large"' in answer, answer
    linger_s, bound = daemon.api.limits.linger_s, server.adj.max_request_body_size
    print(f"\nendless {'fast' if every == 0 else 'slow'} sender: cut after {took:.2f} s, {sent} bytes sent")
    if every == 0:  # cut by the byte bound, long before the time bound (socket buffers hold some MB more)
        assert bound <= sent < bound + 40 * 2**20 and took < linger_s, (sent, took)
    else:  # cut by the time bound (CLEANUP_S: the maintenance pass that closes it)
        assert sent < bound and linger_s - 0.5 <= took < linger_s + CLEANUP_S + 2, (sent, took)
    wait_for(lambda: not server.per_client and server.bodies_in_flight == 0, 5, "the connection gone")
