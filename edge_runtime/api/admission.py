"""Admission before cost: inference requests and event streams are counted before their bodies are
parsed or decoded, and refused at once (429 with Retry-After) beyond the bound.

Why: waitress has a fixed pool of threads. A request that waits for a verdict, or an event stream,
holds one. Left unbounded they take every thread, and `/healthz` queues behind them. So long-lived
requests get at most `api.threads` threads between them (the server runs `api.threads` +
`QUICK_THREADS`), and decoded pixels in flight are bounded so fifty 49-MP uploads cannot take GBs.
"""

from __future__ import annotations

import io
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from PIL import Image

from edge_runtime.api.errors import ApiError, invalid

QUICK_THREADS = 2  # always free for health, status, metrics and refusals
RETRY_AFTER_S = 2
MAX_JSON_DEPTH = 32  # a request body is never legitimately deeper; json.loads recurses per level


def slots(threads: int) -> tuple[int, int]:
    """(event streams, inference requests) that may hold a thread at once, out of `api.threads`."""
    streams = max(1, threads // 2)
    return streams, max(1, threads - streams)


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
            # One image alone always fits (its own size limit is checked when it is decoded).
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
    try:
        with Image.open(io.BytesIO(data)) as header:
            width, height = header.size
            return int(width), int(height)
    except Exception:  # noqa: BLE001 - Pillow raises many types for garbage; the decoder reports it
        return None


def json_depth(value: Any) -> int:
    """Nesting depth, walked without recursion (bounded by the already size-checked body)."""
    depth, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        depth = max(depth, level)
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return depth


def parse_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse a request body; malformed, deeply nested or non-finite JSON is a 400 naming `body`."""
    if not raw.strip():
        raise invalid("body", "a JSON body is required")

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        value = json.loads(raw, parse_constant=no_constant, object_pairs_hook=_no_duplicates)
    except ApiError:
        raise
    except RecursionError:  # the C decoder guards its recursion: a deep body ends here, not in a crash
        raise invalid("body", f"the JSON is nested deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise invalid("body", f"not valid JSON ({exc})") from None
    if json_depth(value) > max_depth:
        raise invalid("body", f"the JSON is nested deeper than {max_depth} levels")
    bad = surrogate_path(value)
    if bad is not None:
        raise invalid(bad, "contains a lone surrogate (\\ud800-\\udfff); text must be valid UTF-8")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object with a key twice is refused: the second value would slip past what checked the first."""
    out: dict[str, Any] = {}
    for key, item in pairs:
        if key in out:
            shown = key if not has_surrogate(key) else key.encode("utf-8", "backslashreplace").decode()
            raise invalid(shown, "the key appears more than once in one JSON object")
        out[key] = item
    return out


_SURROGATE = re.compile("[\ud800-\udfff]")


def has_surrogate(text: str) -> bool:
    """A lone surrogate (JSON's "\\ud800" escape) cannot be encoded as UTF-8: refused at the door, not
    as a UnicodeEncodeError deep in storage. Searched in place, with no encoded copy of the text."""
    return _SURROGATE.search(text) is not None


def surrogate_path(value: Any) -> str | None:
    """The dotted path of the first string (a key or a value) holding a lone surrogate, else None.
    Walked without recursion (the depth is already bounded)."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if has_surrogate(item):
                return path or "body"
        elif isinstance(item, dict):
            for key, sub in item.items():
                where = f"{path}.{key}" if path else str(key)
                if has_surrogate(key):
                    return (f"{path}.{key}" if path else key).encode("utf-8", "backslashreplace").decode()
                stack.append((sub, where))
        elif isinstance(item, list):
            stack.extend((sub, f"{path}.{i}" if path else str(i)) for i, sub in enumerate(item))
    return None
