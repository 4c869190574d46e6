"""Many clients querying a large journal at once (reads need no token by default) against the real
waitress server: each filtered query is a table scan on the journal's one connection, so thirty clients
took every server thread, each waiting its turn, and `/healthz` queued behind them for seconds. Result
queries are now admitted two at a time on threads of their own; the others get a 429 at once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from edge_runtime.app.daemon import Daemon
from tests.api.test_api import make_daemon
from tests.support.journal_rows import fill_journal

ROWS = 40_000


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    d = make_daemon(tmp_path_factory.mktemp("query-flood"), demo_dir, camera=False)
    fill_journal(d.config.journal.path or d.config.data_dir / "journal.sqlite3", ROWS)
    yield d
    d.stop()


def test_thirty_clients_querying_a_large_journal_leave_healthz_answering_in_milliseconds(daemon: Daemon) -> None:
    assert daemon.api is not None
    base = f"http://127.0.0.1:{daemon.api.port}"
    # A filter no row matches: the whole journal is scanned, nothing is sent back.
    queries = [f"{base}/api/v1/inspections?category=nothing&limit=1000", f"{base}/api/v1/results?limit=1000"]
    stop = threading.Event()
    statuses: Counter[int] = Counter()

    def client(k: int) -> None:
        with requests.Session() as s:
            while not stop.is_set():
                r = s.get(queries[k % 2], timeout=60)
                statuses[r.status_code] += 1
                if r.status_code == 429:  # as a client does, if more eagerly than Retry-After asks
                    time.sleep(0.5)

    clients = [threading.Thread(target=client, args=(k,)) for k in range(30)]
    for t in clients:
        t.start()
    waits = []
    try:
        time.sleep(1)
        for _ in range(20):
            t0 = time.monotonic()
            assert requests.get(f"{base}/healthz", timeout=30).status_code == 200
            waits.append(time.monotonic() - t0)
            time.sleep(0.1)
    finally:
        stop.set()
        for t in clients:
            t.join()
    # Before: every probe waited 0.39-0.72 s (the median ~0.43 s); after: ~0.02 s, at most 0.12 s.
    waits.sort()
    assert waits[len(waits) // 2] < 0.1 and waits[-1] < 1.0, waits
    assert statuses[200] and statuses[429], statuses  # some served, the rest told to come back
    assert set(statuses) == {200, 429}
    busy = requests.get(queries[0], timeout=30)
    assert busy.status_code == 200  # the slots came back
