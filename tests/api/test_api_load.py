"""The real waitress server under attack: open event streams, idle connections, overload and big images.
`/healthz` must answer in well under a second through all of it (issue 14 items 6 and 7)."""

from __future__ import annotations

import json
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from edge_runtime.api import CHANNEL_TIMEOUT_S, CLEANUP_S
from edge_runtime.app.daemon import Daemon
from edge_runtime.core.samples import part_image
from tests.api.test_api import make_daemon
from tests.support.images import encode

JPEG = encode(part_image(2), ".jpg")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    d = make_daemon(tmp_path_factory.mktemp("load"), demo_dir)
    d.config.api.max_request_mb = 8  # the 49-MP PNG below is ~150 KB compressed; room for it
    deadline = time.monotonic() + 20
    while d.journal.counts()["total"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def base(daemon: Daemon) -> str:
    assert daemon.api is not None
    return f"http://127.0.0.1:{daemon.api.port}"


def health_latencies(base: str, probes: int = 20) -> list[float]:
    out = []
    for _ in range(probes):
        started = time.perf_counter()
        assert requests.get(f"{base}/healthz", timeout=5).status_code == 200
        out.append(time.perf_counter() - started)
    return out


def report(what: str, latencies: list[float]) -> None:
    """Printed with `pytest -s` (the figures in docs/reliability.md)."""
    ordered = sorted(latencies)
    print(f"\n{what}: /healthz p50 {ordered[len(ordered) // 2] * 1000:.1f} ms, max {ordered[-1] * 1000:.1f} ms "
          f"({len(ordered)} probes)")


def idle_sockets(base: str, count: int) -> list[socket.socket]:
    port = base.rsplit(":", 1)[1]
    return [socket.create_connection(("127.0.0.1", int(port)), timeout=5) for _ in range(count)]


def open_stream(base: str, after: int | None = None) -> requests.Response:
    params = {"last_event_id": after} if after is not None else None
    return requests.get(f"{base}/api/v1/events", params=params, stream=True, timeout=(5, 30))


def test_health_is_fast_with_event_streams_and_idle_connections_open(base: str) -> None:
    streams = [open_stream(base) for _ in range(8)]
    idle = idle_sockets(base, 120)
    try:
        codes = sorted(s.status_code for s in streams)
        assert 200 in codes and codes[-1] == 429  # streams beyond the cap are refused, not queued
        refused = next(s for s in streams if s.status_code == 429)
        assert refused.headers["Retry-After"] and refused.json()["error"]["type"] == "overloaded"
        latencies = health_latencies(base)
        report(f"{len(streams)} event streams ({codes.count(200)} admitted) + {len(idle)} idle connections",
               latencies)
        ready = requests.get(f"{base}/readyz", timeout=5)
        assert ready.status_code == 200 and ready.json()["state"] == "ok"
        assert max(latencies) < 1.0, latencies
    finally:
        for s in streams:
            s.close()
        for sock in idle:
            sock.close()


def test_idle_connections_are_closed_by_the_server(base: str) -> None:
    (sock,) = idle_sockets(base, 1)
    sock.settimeout(CHANNEL_TIMEOUT_S + CLEANUP_S + 10)
    started = time.monotonic()
    try:
        assert sock.recv(1) == b""  # the server closed it
    finally:
        sock.close()
    assert time.monotonic() - started < CHANNEL_TIMEOUT_S + CLEANUP_S + 3


def events_of(response: requests.Response, want: int, timeout: float = 20,
              lines: list[str] | None = None) -> list[tuple[int, dict[str, Any]]]:
    """(id, result) of the next `want` result events, or fewer when the stream ends."""
    got: list[tuple[int, dict[str, Any]]] = []
    event_id = None
    deadline = time.monotonic() + timeout
    for line in response.iter_lines(decode_unicode=True):
        assert isinstance(line, str)  # decode_unicode with the text/event-stream charset
        if lines is not None:
            lines.append(line)
        if line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("data: "):
            assert event_id is not None, "every event carries an id"
            got.append((event_id, json.loads(line[6:])))
            if len(got) >= want or time.monotonic() > deadline:
                break
    return got


def test_results_made_before_the_stream_connects_are_replayed(base: str, daemon: Daemon) -> None:
    page = requests.get(f"{base}/api/v1/results?limit=5", timeout=5).json()
    newest = page["results"][0]["journal_seq"]
    deadline = time.monotonic() + 15  # results keep coming (interval camera) before we connect
    while daemon.journal.query(limit=1)[0]["journal_seq"] < newest + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    missed = [r["id"] for r in reversed(daemon.journal.query(limit=2))]
    with open_stream(base, page["last_event_id"]) as stream:
        replayed = [r["id"] for _, r in events_of(stream, 5)]
    assert set(missed) <= set(replayed)


def test_a_stream_ends_after_its_lifetime_and_resumes_without_a_gap(base: str, daemon: Daemon) -> None:
    assert daemon.api is not None
    daemon.api.app.config["EDGE_STREAM_SECONDS"] = 1.5
    try:
        with open_stream(base) as first:
            started = time.monotonic()
            lines: list[str] = []
            seen = events_of(first, 1000, lines=lines)  # until the server ends the stream
            assert time.monotonic() - started < 5 and lines[0].startswith("retry: ")
        last = seen[-1][0] if seen else requests.get(f"{base}/api/v1/results?limit=1", timeout=5).json()[
            "last_event_id"]
        # results made while no stream is open (as between browser reconnects): wait for one, since a
        # loaded 2-core machine can take seconds per demo verdict
        deadline = time.monotonic() + 30
        while (requests.get(f"{base}/api/v1/results?limit=1", timeout=5).json()["last_event_id"] <= last
               and time.monotonic() < deadline):
            time.sleep(0.1)
        resumed = requests.get(f"{base}/api/v1/events", headers={"Last-Event-ID": str(last)}, stream=True,
                               timeout=(5, 30))
        with resumed:
            ids = [i for i, _ in events_of(resumed, 3)]
        assert ids and ids == list(range(last + 1, last + 1 + len(ids)))  # consecutive: no gap
    finally:
        daemon.api.app.config["EDGE_STREAM_SECONDS"] = 300


def test_overload_is_refused_at_once_and_health_stays_fast(base: str) -> None:
    def infer(_: int) -> tuple[int, float, str | None]:
        started = time.perf_counter()
        r = requests.post(f"{base}/api/v1/infer", files={"image": ("p.jpg", JPEG)}, timeout=60)
        return r.status_code, time.perf_counter() - started, r.headers.get("Retry-After")

    with ThreadPoolExecutor(100) as pool:
        attack = pool.map(infer, range(100))
        latencies = health_latencies(base, 10)
        outcomes = list(attack)
    refused = [o for o in outcomes if o[0] == 429]
    report(f"100 concurrent /api/v1/infer ({len(refused)} refused with 429, slowest refusal "
           f"{max(o[1] for o in refused) * 1000:.0f} ms)", latencies)
    assert {o[0] for o in outcomes} <= {200, 429}
    assert len(refused) >= 80 and all(o[2] for o in refused)
    assert max(o[1] for o in refused) < 3.0  # at once, not after queueing (2-core machine, 100 threads)
    assert max(latencies) < 1.0, latencies


def _grey_png(width: int, height: int) -> bytes:
    """A real, fully decodable 8-bit greyscale PNG of zeros (~150 KB for 49 MP)."""
    import struct

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    comp = zlib.compressobj(9)
    row = b"\0" * (width + 1)
    idat = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_fifty_concurrent_49_megapixel_pngs_leave_memory_bounded(base: str) -> None:
    png = _grey_png(7000, 7000)
    baseline, peak = rss_mb(), [0.0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb())
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()

    def upload(_: int) -> int:
        return requests.post(f"{base}/api/v1/infer", files={"image": ("big.png", png)}, timeout=120).status_code

    try:
        with ThreadPoolExecutor(50) as pool:
            attack = pool.map(upload, range(50))
            latencies = health_latencies(base, 10)
            codes = list(attack)
    finally:
        done.set()
        sampler.join()
    assert set(codes) <= {200, 429} and codes.count(429) >= 40
    # One 49-MP image decodes at a time (147 MB of BGR, plus OpenCV's working copies).
    assert peak[0] - baseline < 700, (baseline, peak[0])
    assert max(latencies) < 1.0, latencies
    report(f"50 concurrent 49-MP PNGs (RSS {baseline:.0f} MB before, peak {peak[0]:.0f} MB; "
           f"{codes.count(429)} refused with 429)", latencies)


def test_stop_ends_streams_and_connections_promptly(tmp_path: Path, demo_dir: Path) -> None:
    d = make_daemon(tmp_path, demo_dir, camera=False)
    assert d.api is not None
    base = f"http://127.0.0.1:{d.api.port}"
    stream = open_stream(base)
    idle = idle_sockets(base, 20)
    assert stream.status_code == 200
    started = time.monotonic()
    d.stop()
    try:
        assert time.monotonic() - started < 6
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{base}/healthz", timeout=2)
        assert idle[0].recv(1) == b""
    finally:
        stream.close()
        for sock in idle:
            sock.close()
