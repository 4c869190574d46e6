"""One Modbus TCP connection of the server: who may hold one, for how long, and its requests answered
in order.

pymodbus 3.16's connection handler answers only the first of two requests that arrive in one TCP
segment (sending an answer empties its receive buffer), drops everything when more than 264 bytes
wait, and holds a connection whose peer vanished without closing (a cut cable, a power loss) for
ever: four of those filled `max_clients` and locked the PLC out until a restart. `Link` replaces its
receive path and adds the connection's life cycle:
- every complete request is queued and answered in order, one at a time (a write that waits for the
  disk holds back the next request of that connection only); reading pauses while 4 KiB wait or
  while the peer does not take its answers, so one connection holds a bounded amount of memory; a
  stream that is not Modbus TCP (protocol id not 0, a length outside 2-254) is closed;
- TCP keepalive (first probe after 10 s of silence, then every 5 s, 3 unanswered: ~25 s to notice a
  peer that is gone) and TCP_USER_TIMEOUT 30 s (an answer unacknowledged that long ends it);
- a connection without a complete request for `idle_timeout_s` (60 s) is closed;
- when `max_clients` connections are held, a new connection from an allowed address takes the place
  of the one silent longest, if that one has been silent at least `evict_after_s` (1 s) and has no
  request in progress; otherwise the new one is closed. A PLC that reboots always gets back in; a
  line with more live pollers than `max_clients` is refused, not juggled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from typing import Any, Protocol

from pymodbus.constants import ExcCodes
from pymodbus.exceptions import ModbusIOException
from pymodbus.pdu import ExceptionResponse
from pymodbus.server.requesthandler import ServerRequestHandler

from edge_runtime.config.line_protocols import ModbusConfig
from edge_runtime.core.supervise import RateLimitedLog

KEEPALIVE_IDLE_S = 10
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_COUNT = 3
USER_TIMEOUT_S = 30
IDLE_TIMEOUT_S = 60.0
EVICT_AFTER_S = 1.0
INBOX_BYTES = 4096
_MBAP = 7  # transaction id, protocol id, length, unit id


class Guard(Protocol):
    """What a connection asks of its server (lineio/modbus.py's ModbusServer)."""

    cfg: ModbusConfig
    counters: Any  # connections, refused_clients, evicted, idle_closed, bad_streams, station_errors
    refusal_log: RateLimitedLog
    eviction_log: RateLimitedLog
    evict_after_s: float

    def refuse_reason(self, host: str) -> str: ...


class Link(ServerRequestHandler):
    """A client connection: admitted or closed by `guard`, requests answered one at a time in order."""

    guard: Guard

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.peer = ""
        self.busy = False
        self.last_request = time.monotonic()  # a connection that never asks is silent since it came
        self._inbox = bytearray()
        self._wake = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._reading_paused = False
        self._worker: asyncio.Task[None] | None = None

    # ---- life cycle ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if peer else ""
        self.peer = f"{host}:{peer[1]}" if peer and len(peer) > 1 else host
        reason = self.guard.refuse_reason(host) or self._make_room()
        if reason:
            self.guard.counters.refused_clients += 1
            self.guard.refusal_log.log(logging.WARNING, "modbus: closed a connection from %s: %s", self.peer, reason)
            self.close()
            return
        _keepalive(transport.get_extra_info("socket"))
        self.guard.counters.connections += 1
        self._worker = asyncio.get_running_loop().create_task(self._serve())

    def _make_room(self) -> str:
        """'' when this connection may stay: under max_clients, or after closing the silent one."""
        listener = self.listener
        others = [c for c in (listener.active_connections.values() if listener else ()) if c is not self]
        limit = self.guard.cfg.max_clients
        if len(others) < limit:
            return ""
        now = time.monotonic()
        silent = [c for c in others if isinstance(c, Link) and not c.busy  # bytes trickling in are not a request
                  and now - c.last_request >= self.guard.evict_after_s]
        if not silent:
            return (f"max_clients ({limit}) connections held, none silent for {self.guard.evict_after_s:g} s "
                    "(raise line_io.modbus.max_clients if this line has more clients)")
        oldest = min(silent, key=lambda c: c.last_request)
        self.guard.counters.evicted += 1
        self.guard.eviction_log.log(logging.WARNING, "modbus: closed the connection from %s (silent for %.1f s) to "
                                    "let %s in: max_clients (%d) were held", oldest.peer,
                                    now - oldest.last_request, self.peer, limit)
        oldest.close()
        return ""

    def expire_if_idle(self, now: float, idle_timeout_s: float) -> bool:
        """Close this connection when it has sent no request for `idle_timeout_s`."""
        if self.busy or now - self.last_request < idle_timeout_s:
            return False
        self.guard.counters.idle_closed += 1
        self.guard.eviction_log.log(logging.INFO, "modbus: closed the connection from %s: no request for %.0f s",
                                    self.peer, now - self.last_request)
        self.close()
        return True

    def close(self, reconnect: bool = False) -> None:
        if self._worker is not None and self._worker is not asyncio.current_task():
            self._worker.cancel()
        super().close(reconnect=reconnect)

    def callback_disconnected(self, exc: Exception | None) -> None:
        if self._worker is not None:
            self._worker.cancel()
        super().callback_disconnected(exc)

    # ---- flow control ------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._inbox += data
        if len(self._inbox) > INBOX_BYTES and not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()  # type: ignore[attr-defined]
        self._wake.set()

    def pause_writing(self) -> None:
        self._writable.clear()  # the peer does not take its answers: ask nothing more of the server

    def resume_writing(self) -> None:
        self._writable.set()

    # ---- requests, in order --------------------------------------------------------------------------

    async def _serve(self) -> None:
        while self.transport is not None:
            await self._wake.wait()
            self._wake.clear()
            while (frame := self._next_frame()) is not None:
                await self._writable.wait()
                self.busy = True
                self.last_request = time.monotonic()
                try:
                    await self._answer(frame)
                except Exception:  # noqa: BLE001 - this connection ends, the server and the others go on
                    self.guard.counters.station_errors += 1
                    self.guard.refusal_log.log(logging.ERROR, "modbus: a request from %s failed; connection closed",
                                               self.peer, exc_info=True)
                    self.close()
                    return
                finally:
                    self.busy = False
                    self.last_request = time.monotonic()
                if self._reading_paused and len(self._inbox) <= INBOX_BYTES and self.transport is not None:
                    self._reading_paused = False
                    self.transport.resume_reading()  # type: ignore[attr-defined]

    def _next_frame(self) -> bytes | None:
        """The first complete request in the inbox (taken out of it), None while it is incomplete."""
        inbox = self._inbox
        if len(inbox) < _MBAP:
            return None
        protocol, length = int.from_bytes(inbox[2:4], "big"), int.from_bytes(inbox[4:6], "big")
        if protocol != 0 or not 2 <= length <= 254:
            self.guard.counters.bad_streams += 1
            self.guard.refusal_log.log(logging.WARNING, "modbus: closed the connection from %s: not Modbus TCP "
                                       "(protocol id %d, length %d)", self.peer, protocol, length)
            self._inbox.clear()
            self.close()
            return None
        if len(inbox) < 6 + length:
            return None
        frame = bytes(inbox[:6 + length])
        del inbox[:6 + length]
        return frame

    async def _answer(self, frame: bytes) -> None:
        tid, unit = int.from_bytes(frame[0:2], "big"), frame[6]
        try:
            _used, pdu = self.framer.handleFrame(self.trace_packet(False, frame), 0, 0)
        except ModbusIOException:
            pdu = None
        if pdu is None:  # a function code pymodbus does not know
            self.server_send(ExceptionResponse(frame[7], exception_code=ExcCodes.ILLEGAL_FUNCTION, device_id=unit,
                                               transaction=tid), None)
            return
        self.last_pdu = self.trace_pdu(False, pdu)
        self.last_addr = None
        await self.handle_request()  # pymodbus's: the datastore (our actions), then the answer

    def server_send(self, pdu: Any, addr: Any) -> None:
        if self.transport is not None:  # closed while the request waited (for the disk)
            super().server_send(pdu, addr)


def sweep(links: list[Any], idle_timeout_s: float) -> None:
    """Close the connections without a request for `idle_timeout_s` (called by the server's loop)."""
    now = time.monotonic()
    for link in links:
        if isinstance(link, Link):
            link.expire_if_idle(now, idle_timeout_s)


def _keepalive(sock: Any) -> None:
    """TCP keepalive and user timeout on an accepted socket (Linux options; others keep the OS's)."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                            ("TCP_KEEPCNT", KEEPALIVE_COUNT), ("TCP_USER_TIMEOUT", USER_TIMEOUT_S * 1000)):
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
