"""Clients that ask for a large response and then stop reading it, against the real waitress server.

waitress buffers a response up to 16 MB per connection, then the thread writing it waits until the
client reads. An export of a journal larger than that (100,000 results of ~1 KB is ~100 MB) to a
client that never reads held a server thread for as long as the client kept the connection open:
ten such clients (no token needed for reads by default) took every thread, and `/healthz` and
`/readyz` stopped answering. Exports are now admitted one at a time on a thread of their own, and a
connection that owes a response and takes no byte of it for `Limits.send_stall_s` is closed.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from edge_runtime.api.guard import SEND_STALL_S
from edge_runtime.app.daemon import Daemon
from tests.api.test_api import make_daemon
from tests.support.journal_rows import fill_journal
from tests.support.waiting import wait_for

ROWS = 3000
NOTES = "x" * 8000  # 3,000 results of ~8 KB: an export of ~25 MB, past waitress's 16 MB buffer


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    d = make_daemon(tmp_path_factory.mktemp("slow-readers"), demo_dir, camera=False)
    fill_journal(d.config.journal.path or d.config.data_dir / "journal.sqlite3", ROWS,
                 {"defect": False, "notes": NOTES})
    yield d
    d.stop()


def stalled_export(port: int) -> socket.socket:
    """An export request whose client never reads a byte of the answer."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /api/v1/inspections/export.jsonl HTTP/1.1\r\nHost: device\r\n\r\n")
    return s


def healthz_s(port: int) -> float:
    t0 = time.monotonic()
    r = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
    assert r.status_code == 200
    return time.monotonic() - t0


def test_exports_nobody_reads_leave_healthz_and_readyz_answering(daemon: Daemon) -> None:
    assert daemon.api is not None
    port = daemon.api.port
    socks = [stalled_export(port) for _ in range(daemon.config.api.threads + 4)]
    try:
        time.sleep(4)  # each admitted export fills its 16 MB and waits for its client
        assert healthz_s(port) < 1.0
        ready = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=10)
        assert ready.status_code == 200
        # One export at a time: the others were told to come back, not left holding a thread.
        busy = requests.get(f"http://127.0.0.1:{port}/api/v1/inspections/export.csv", timeout=10)
        assert busy.status_code == 429 and busy.headers["Retry-After"] == "2"
        assert busy.json()["error"]["type"] == "overloaded"
        metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        assert 'edge_api_in_flight{kind="exports"} 1.0' in metrics
    finally:
        for s in socks:
            s.close()


def test_a_connection_that_takes_no_byte_of_its_answer_is_closed_and_its_export_slot_returns(
        daemon: Daemon) -> None:
    assert daemon.api is not None
    port = daemon.api.port
    server = daemon.api._server
    exports = daemon.api.app.extensions["edge_runtime_exports"]
    wait_for(lambda: exports.in_flight == 0, timeout=15,
             what="the previous test's exports to end")
    server.limits.send_stall_s = 2.0
    try:
        s = stalled_export(port)
        wait_for(lambda: exports.in_flight == 1, timeout=10,
                 what="the export to be admitted")
        stalled_before = server.stalled
        # Cut within the stall bound (plus the maintenance pass): the thread and the slot come back.
        wait_for(lambda: exports.in_flight == 0, timeout=15, what="the stalled export to be cut")
        assert server.stalled == stalled_before + 1
        s.close()
        whole = requests.get(f"http://127.0.0.1:{port}/api/v1/inspections/export.jsonl", timeout=60)
        assert whole.status_code == 200 and len(whole.content.splitlines()) == ROWS
        assert "edge_api_responses_stalled_total 1.0" in requests.get(
            f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        server.limits.send_stall_s = SEND_STALL_S
