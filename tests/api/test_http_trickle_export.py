"""A client that takes a result export a trickle at a time, against the real waitress server.

Exports run one at a time, and a connection that takes no byte of its answer for 30 s is closed
(test_http_slow_readers.py). A client that read a little every few seconds passed that deadline and
kept the one export slot for as long as it liked: every other client got 429. An export is now cut
when its client takes less than `api.export_min_kib_s` over a window in which it was owed bytes, or
has not taken it whole within `api.export_max_s`; the next client gets the slot. The windows are
scaled down here (seconds, not a minute); the defaults are checked on the bound itself below.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from edge_runtime.api.guard import SEND_STALL_S, GuardedChannel, Limits, SendBound
from edge_runtime.app.daemon import Daemon
from tests.api.test_api import make_daemon
from tests.support.journal_rows import fill_journal
from tests.support.waiting import wait_for

ROWS = 3000
NOTES = "x" * 8000  # ~25 MB of JSON lines, past waitress's 16 MB buffer


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    d = make_daemon(tmp_path_factory.mktemp("trickle"), demo_dir, camera=False)
    fill_journal(d.config.journal.path or d.config.data_dir / "journal.sqlite3", ROWS,
                 {"defect": False, "notes": NOTES})
    yield d
    d.stop()


@pytest.fixture
def scaled(daemon: Daemon) -> Iterator[Limits]:
    """The export bound scaled to seconds: 256 KiB/s over 2 s windows, 60 s in all."""
    assert daemon.api is not None
    limits = daemon.api.limits
    saved = (limits.export_min_bytes_s, limits.export_window_s, limits.export_max_s)
    limits.export_min_bytes_s, limits.export_window_s, limits.export_max_s = 256 * 1024, 2.0, 60.0
    exports = daemon.api.app.extensions["edge_runtime_exports"]
    wait_for(lambda: exports.in_flight == 0, timeout=20, what="the previous test's export to end")
    yield limits
    limits.export_min_bytes_s, limits.export_window_s, limits.export_max_s = saved


class Reader(threading.Thread):
    """Asks for the export and reads it at `rate` bytes/s until `stop` is set or the server closes."""

    def __init__(self, port: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.rate = rate
        self.stop = threading.Event()
        self.got = 0
        self.closed_by_server = False
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect(("127.0.0.1", port))
        self.sock.sendall(b"GET /api/v1/inspections/export.jsonl HTTP/1.1\r\nHost: device\r\n\r\n")
        self.data = bytearray()

    def run(self) -> None:
        t0 = time.monotonic()
        self.sock.settimeout(1.0)
        while not self.stop.is_set():
            ahead = self.got / self.rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(min(ahead, 0.1))
                continue
            try:
                chunk = self.sock.recv(16384)
            except TimeoutError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                self.closed_by_server = True
                break
            self.got += len(chunk)
            self.data += chunk
        self.sock.close()

    def complete(self) -> bool:
        """The chunked answer arrived whole (its last chunk is the zero-length one)."""
        return bytes(self.data).endswith(b"\r\n0\r\n\r\n")


def other_export(port: int) -> requests.Response:
    return requests.get(f"http://127.0.0.1:{port}/api/v1/inspections/export.csv", timeout=60, stream=True)


def test_a_client_that_reads_a_trickle_is_cut_and_the_next_client_gets_the_export(
        daemon: Daemon, scaled: Limits) -> None:
    assert daemon.api is not None
    port, server = daemon.api.port, daemon.api._server
    exports = daemon.api.app.extensions["edge_runtime_exports"]
    trickle = Reader(port, rate=16 * 1024)  # a sixteenth of the bound
    trickle.start()
    try:
        wait_for(lambda: exports.in_flight == 1, timeout=10, what="the trickle's export to be admitted")
        busy = other_export(port)
        assert busy.status_code == 429  # one export at a time: the trickle holds the slot now
        # Cut after a window or two (2 s each), well before the 30 s stall deadline could apply (it
        # never does: the trickle takes a byte every 0.1 s).
        wait_for(lambda: exports.in_flight == 0, timeout=12, what="the trickle's export to be cut")
        trickle.join(10)
        assert trickle.closed_by_server and not trickle.complete()  # cut, not ended as if whole
        assert trickle.got < 25_000_000
        nxt = other_export(port)
        assert nxt.status_code == 200
        assert len(nxt.content.splitlines()) == ROWS + 1  # the header and every row
        assert server.bound_cut["export"] >= 1
        assert 'edge_api_responses_cut_total{what="export"}' in requests.get(
            f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        trickle.stop.set()
        trickle.join(10)


def test_an_export_not_taken_whole_within_export_max_s_is_cut(daemon: Daemon, scaled: Limits) -> None:
    assert daemon.api is not None
    exports = daemon.api.app.extensions["edge_runtime_exports"]
    scaled.export_max_s = 3.0
    reader = Reader(daemon.api.port, rate=1024 * 1024)  # above the rate: only the time bound cuts it
    reader.start()
    try:
        wait_for(lambda: exports.in_flight == 1, timeout=10, what="the export to be admitted")
        t0 = time.monotonic()
        wait_for(lambda: exports.in_flight == 0, timeout=15, what="the export to be cut at export_max_s")
        reader.join(10)
        assert reader.closed_by_server and not reader.complete()
        assert time.monotonic() - t0 < 10
        assert other_export(daemon.api.port).status_code == 200
    finally:
        reader.stop.set()
        reader.join(10)


def test_a_slow_link_that_keeps_to_the_rate_gets_the_whole_export(daemon: Daemon, scaled: Limits) -> None:
    """4 MiB/s against 256 KiB/s: the defaults' ratio (64 KiB/s against 4 KiB/s), scaled."""
    assert daemon.api is not None
    reader = Reader(daemon.api.port, rate=4 * 1024 * 1024)
    reader.start()
    reader.join(60)
    assert not reader.is_alive()
    assert reader.complete(), f"cut after {reader.got} bytes"
    assert reader.data.count(b'"notes"') == ROWS


def test_a_steady_slow_reader_is_not_taken_for_a_stalled_one(daemon: Daemon) -> None:
    """The kernel takes a few MB of the answer at once, then nothing until about a third of it has
    gone: at 128 KiB/s the server's sends succeeded seconds apart, and a 64 KiB/s export (default
    bound) was closed as stalled after 158 s ('took no byte of its answer for 31 s'). What the client
    acknowledged counts now. Scaled: a 3 s stall deadline against a reader that never pauses."""
    assert daemon.api is not None
    server = daemon.api._server
    exports = daemon.api.app.extensions["edge_runtime_exports"]
    wait_for(lambda: exports.in_flight == 0, timeout=20, what="the previous test's export to end")
    server.limits.send_stall_s = 3.0
    stalled_before = server.stalled
    reader = Reader(daemon.api.port, rate=128 * 1024)
    reader.start()
    try:
        reader.join(15)
        assert reader.is_alive() and not reader.closed_by_server, f"closed after {reader.got} bytes"
        assert server.stalled == stalled_before
    finally:
        server.limits.send_stall_s = SEND_STALL_S
        reader.stop.set()
        reader.join(10)


def test_a_bound_ends_with_its_answer_on_a_keep_alive_connection() -> None:
    """A bound stayed on the connection until the once-a-second pass saw its answer done and sent, so the
    next answer on a keep-alive connection was judged by the bound's rate (and its max_s counted from the
    bound answer's start): an ordinary answer the client took its time over was cut. (Exports are chunked,
    and waitress closes a chunked answer's connection; a bound answer with a Content-Length keeps it.)
    The bound ends, and its slot is given back, when its last byte leaves waitress's buffer. Scaled: a
    1 s window; the next answer (2 MB) is left unread for three windows, far within the stall deadline;
    both ends' socket buffers are small, so it waits in waitress's buffer."""
    from edge_runtime.api.guard import bind, create_guarded_server

    limits = Limits(export_min_bytes_s=256 * 1024, export_window_s=1.0, export_max_s=60.0)
    ended = threading.Event()

    class Bound:
        def __init__(self, environ: dict[str, Any]) -> None:
            self.bound = bind(environ, "export", limits, on_end=ended.set)

        def __iter__(self) -> Iterator[bytes]:
            yield b"b" * 65536

        def close(self) -> None:
            if self.bound is not None:
                self.bound.done = True

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        size = 65536 if environ["PATH_INFO"] == "/bound" else 2 * 2**20
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(size))])
        return Bound(environ) if environ["PATH_INFO"] == "/bound" else [b"n" * size]

    loop_map: dict[int, Any] = {}
    server = create_guarded_server(app, limits, map=loop_map, host="127.0.0.1", port=0, threads=2,
                                   cleanup_interval=1, channel_timeout=30)
    loop = threading.Thread(target=server.run, daemon=True)
    loop.start()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn = http.client.HTTPConnection("127.0.0.1", server.socket.getsockname()[1], timeout=30)
    try:
        sock.connect(("127.0.0.1", server.socket.getsockname()[1]))
        channel = wait_for(lambda: [c for c in list(server.active_channels.values())
                                    if c.socket.getpeername() == sock.getsockname()], 5, "the connection")[0]
        channel.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        conn.sock = sock
        conn.request("GET", "/bound")
        resp = conn.getresponse()
        assert resp.status == 200 and len(resp.read()) == 65536 and not resp.will_close
        assert ended.wait(1), "the bound did not end with its answer"
        conn.request("GET", "/next")  # the same connection (keep-alive)
        time.sleep(3.5)
        resp = conn.getresponse()
        assert resp.status == 200 and len(resp.read()) == 2 * 2**20
        assert conn.sock is sock and server.bound_cut["export"] == 0
    finally:
        conn.close()
        server.task_dispatcher.shutdown(cancel_pending=True, timeout=5)
        server.trigger.pull_trigger(lambda: [d.close() for d in list(loop_map.values())])
        loop.join(5)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    """A ~6 MB export: all of it fits waitress's buffer, so its thread is done at once and the whole
    answer is sent after it, under waitress's idle timeout."""
    d = make_daemon(tmp_path_factory.mktemp("small-export"), demo_dir, camera=False)
    fill_journal(d.config.journal.path or d.config.data_dir / "journal.sqlite3", 750,
                 {"defect": False, "notes": NOTES})
    yield d
    d.stop()


def test_a_steady_reader_gets_the_end_of_an_export_whose_writer_has_finished(small: Daemon) -> None:
    """Once the export's last row is in waitress's buffer its thread is done, and waitress's idle timeout
    (10 s without a successful send) closed the connection with the rest still owed: a 64 KiB/s export
    of 25 MB ended after ~10 MB (the kernel accepts nothing for tens of seconds at that pace). Taking
    bytes is activity now. Scaled: a 1 s idle timeout, 512 KiB/s."""
    assert small.api is not None
    server = small.api._server
    saved = server.adj.channel_timeout
    server.adj.channel_timeout = 1.0
    reader = Reader(small.api.port, rate=512 * 1024)
    reader.start()
    try:
        reader.join(60)
        assert reader.complete(), f"closed after {reader.got} bytes"
    finally:
        server.adj.channel_timeout = saved
        reader.stop.set()
        reader.join(10)


class FakeChannel(GuardedChannel):
    def __init__(self) -> None:  # no socket: only the counters the bound reads
        self.taken, self.drained, self.total_outbufs_len = 0, -1.0, 16 * 2**20


def test_the_default_bound_lets_64_kib_s_take_100_mb_and_cuts_a_trickle() -> None:
    limits = Limits()
    link = FakeChannel()
    bound = SendBound("export", limits.export_min_bytes_s, limits.export_window_s, limits.export_max_s, 0.0, 0.0, 0)
    t = 0.0
    while link.taken < 100_000_000:  # the maintenance pass runs every second
        t += 1.0
        link.taken += 64 * 1024
        assert bound.breached(link, t) is None, f"cut at {t} s"
    assert t < limits.export_max_s / 2  # ~26 minutes of the hour

    trickle = FakeChannel()
    bound = SendBound("export", limits.export_min_bytes_s, limits.export_window_s, limits.export_max_s, 0.0, 0.0, 0)
    t, why = 0.0, None
    while why is None and t < 600:
        t += 1.0
        trickle.taken += 2 * 1024 if t % 25 == 0 else 0  # 2 KiB every 25 s: never 30 s without a byte
        why = bound.breached(trickle, t)
    assert why is not None and 60 <= t <= 61


def test_a_reload_sets_the_export_bound_from_the_next_export_on(daemon: Daemon) -> None:
    assert daemon.api is not None
    api, cfg = daemon.api, daemon.config.api
    try:
        restart = api.apply(cfg.model_copy(update={"export_min_kib_s": 32, "export_max_s": 7200}))
        assert restart == []
        assert (api.limits.export_min_bytes_s, api.limits.export_max_s) == (32 * 1024, 7200)
    finally:
        api.apply(cfg)
    assert (api.limits.export_min_bytes_s, api.limits.export_max_s) == (4 * 1024, 3600)
