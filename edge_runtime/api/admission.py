"""Admission before cost: inference requests and event streams are counted before their bodies are
parsed or decoded, and refused at once (429 with Retry-After) beyond the bound.

Why: waitress has a fixed pool of threads. A request that waits for a verdict, or an event stream,
holds one. Left unbounded they take every thread, and `/healthz` queues behind them. So long-lived
requests get at most `api.threads` threads between them (the server runs `api.threads` +
`QUICK_THREADS`), and decoded pixels in flight are bounded so fifty 49-MP uploads cannot take GBs.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import Any

from PIL import Image

from edge_runtime.api.errors import ApiError, invalid
from edge_runtime.core import strict_json
from edge_runtime.core.errors import StorageFull
from edge_runtime.core.images import SUPPORTED_FORMATS, header_flood

QUICK_THREADS = 2  # always free for status, metrics and refusals (health has its own: guard.HEALTH_THREADS)
EXPORT_THREADS = 1  # result exports (export.csv / .jsonl) at once, each on a thread of its own
QUERY_THREADS = 2  # result queries (/api/v1/results, /api/v1/inspections) at once, on threads of their own
RETRY_AFTER_S = 2
MAX_JSON_DEPTH = 32  # a request body is never legitimately deeper; json.loads recurses per level
# The most commas, arrays and objects one body may hold, in strings too: 64 messages of 512 parts are ~66k,
# their text at most 262,144 characters (MAX_TEXT_CHARS), the rest (schema, knobs) far fewer.
MAX_JSON_VALUES = 400_000


def slots(threads: int) -> tuple[int, int]:
    """(event streams, inference requests) that may hold a thread at once, out of `api.threads`.

    Two thirds go to inference: chat clients are served side by side in the worker's batch
    (`inspection.max_batch`, 4 by default), so the default 6 threads admit 4 of them at once instead of
    refusing the fourth with a 429 while the batch had room for it; event streams get the rest."""
    streams = max(1, threads // 3)
    return streams, max(1, threads - streams)


class Closing:
    """An iterable whose close() runs `on_close` even when the generator never started (a client
    that left before the first byte), so stream slots and subscriptions are always given back."""

    def __init__(self, gen: Generator[str, None, None], on_close: Callable[[], None]) -> None:
        self.gen, self.on_close = gen, on_close

    def __iter__(self) -> Iterator[str]:
        return self.gen

    def close(self) -> None:
        self.gen.close()
        self.on_close()


class Ticket:
    """One admitted request; holds its share of the pixel budget until released (idempotent)."""

    def __init__(self, gate: Admission) -> None:
        self._gate = gate
        self.pixels = 0
        self._released = False

    def reserve_pixels(self, width: int, height: int, field: str) -> None:
        self._gate.reserve(self, width * height, field)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._gate.release(self)


class Admission:
    """Counts requests in flight and the pixels they will decode; beyond either bound: 429 at once."""

    def __init__(self, max_requests: int, max_pixels: int, what: str = "inference requests") -> None:
        self.max_requests, self.max_pixels, self.what = max_requests, max_pixels, what
        self._lock = threading.Lock()
        self.in_flight = 0
        self.pixels = 0
        self.refused = 0

    def _busy(self, message: str) -> ApiError:
        # 429, not 503: the client asked for more than its share; 5xx stays for faults of ours.
        self.refused += 1
        return ApiError(429, "overloaded", f"{message}; retry shortly", headers={"Retry-After": str(RETRY_AFTER_S)})

    def enter(self) -> Ticket:
        with self._lock:
            if self.in_flight >= self.max_requests:
                raise self._busy(f"{self.in_flight} {self.what} are in flight, the most this device takes")
            self.in_flight += 1
        return Ticket(self)

    @contextmanager
    def admitted(self) -> Iterator[Ticket]:
        ticket = self.enter()
        try:
            yield ticket
        finally:
            ticket.release()

    def reserve(self, ticket: Ticket, pixels: int, field: str) -> None:
        with self._lock:
            # A request whose own images pass the device's budget can never fit: a retry would get the
            # same 429 forever, so it is refused for good. One image alone always fits (its own size
            # limit is checked when it is decoded); only other requests' pixels make a 429.
            if ticket.pixels and ticket.pixels + pixels > self.max_pixels:
                raise ApiError(413, "image_too_large", f"{field}: this request's images declare "
                               f"{ticket.pixels + pixels} pixels together, more than the device decodes at once "
                               f"(images.max_pixels, {self.max_pixels})", field=field)
            if self.pixels and self.pixels + pixels > self.max_pixels:
                raise self._busy(f"{field}: images of {self.pixels} pixels are being decoded, "
                                 f"{pixels} more would pass the device's {self.max_pixels}")
            self.pixels += pixels
            ticket.pixels += pixels

    def release(self, ticket: Ticket) -> None:
        with self._lock:
            self.in_flight -= 1
            self.pixels -= ticket.pixels


def image_size(data: bytes) -> tuple[int, int] | None:
    """Width and height from the image header (no pixel decoded); None when it is not readable —
    the decoder then says why."""
    if header_flood(data):  # Pillow would read each chunk or segment first, in Python
        return None
    try:
        with Image.open(io.BytesIO(data), formats=SUPPORTED_FORMATS) as header:
            width, height = header.size
            return int(width), int(height)
    except Exception:  # noqa: BLE001 - Pillow raises many types for garbage; the decoder reports it
        return None


def parse_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH, max_values: int = MAX_JSON_VALUES) -> Any:
    """Parse a request body strictly (core/strict_json.py): malformed, deeply nested or non-finite
    JSON, a key twice in one object and lone surrogates are each a 400 naming the field (or `body`)."""
    if not raw.strip():
        raise invalid("body", "a JSON body is required")
    try:
        return strict_json.loads(raw, max_depth, max_values)
    except strict_json.StrictJsonError as exc:
        raise invalid(exc.field or "body", str(exc)) from None


def storage_full(exc: StorageFull) -> ApiError:
    """The device cannot journal verdicts now (disk full): a fault of the device, healing by itself."""
    return ApiError(503, "storage_full", str(exc), headers={"Retry-After": str(RETRY_AFTER_S * 5)})
