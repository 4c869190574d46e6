"""The Modbus TCP server's connections against raw sockets and pymodbus's client: half-open connections
(a cut cable: the peer goes silent and never closes) no longer lock the PLC out, a silent connection
is closed after the idle timeout, accepted sockets keep alive, and requests that arrive together in
one TCP segment are all answered, in order (pymodbus answered the first only)."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pymodbus.client import ModbusTcpClient

from edge_runtime.config.line_protocols import ModbusConfig
from edge_runtime.lineio import modbus_link
from edge_runtime.lineio import modbus_map as rm
from edge_runtime.lineio.modbus import ModbusServer
from tests.support.line_station import Line
from tests.support.waiting import wait_for


@pytest.fixture
def line(tmp_path: Path) -> Iterator[Line]:
    ln = Line(tmp_path, auto=lambda job: False).start()
    yield ln
    ln.stop()


def serve(line: Line, **kw: Any) -> ModbusServer:
    server = ModbusServer([line.station], ModbusConfig(enabled=True, port=0), **kw)
    server.start()
    assert server.listening.wait(10), server.last_error
    return server


def read_request(tid: int, address: int, count: int = 1) -> bytes:
    return struct.pack(">HHHBBHH", tid, 0, 6, 1, 3, address, count)


def write_request(tid: int, address: int, values: list[int]) -> bytes:
    body = struct.pack(">BBHHB", 1, 16, address, len(values), 2 * len(values)) + b"".join(
        struct.pack(">H", v) for v in values)
    return struct.pack(">HHH", tid, 0, len(body)) + body


def answers(sock: socket.socket, n: int) -> list[tuple[int, bytes]]:
    """n Modbus TCP answers as (transaction id, PDU), in the order they came."""
    buf, out = b"", list[tuple[int, bytes]]()
    while len(out) < n:
        while len(buf) >= 6 and len(buf) >= 6 + int.from_bytes(buf[4:6], "big"):
            end = 6 + int.from_bytes(buf[4:6], "big")
            out.append((int.from_bytes(buf[0:2], "big"), buf[7:end]))
            buf = buf[end:]
        if len(out) < n:
            chunk = sock.recv(65536)
            assert chunk, f"closed after {len(out)} of {n} answers"
            buf += chunk
    return out


def closed_by_server(sock: socket.socket, timeout: float = 3.0) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(64) == b""
    except (ConnectionResetError, TimeoutError):
        return False


def test_silent_half_open_connections_give_their_place_to_the_plc_at_once(line: Line) -> None:
    srv = serve(line)  # max_clients 4, the default
    assert srv.port is not None
    dead: list[socket.socket] = []
    try:
        for i in range(4):  # four PLC connections that asked once, then the cable was cut: silence, no FIN
            sock = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
            sock.sendall(read_request(i + 1, rm.STATUS))
            assert answers(sock, 1)[0][0] == i + 1
            dead.append(sock)
        wait_for(lambda: srv.health().counters["connections"] == 4, 5, "four connections")
        time.sleep(srv.evict_after_s + 0.2)
        plc = ModbusTcpClient("127.0.0.1", port=srv.port, timeout=3, retries=0)
        t0 = time.monotonic()
        try:
            assert plc.connect()
            status = plc.read_holding_registers(rm.STATUS, count=1)
            served_in = time.monotonic() - t0
            assert not status.isError(), status
            assert status.registers[0] & rm.READY
        finally:
            plc.close()
        assert served_in < 1.0, f"the PLC waited {served_in:.2f} s"
        assert closed_by_server(dead[0])  # the one silent longest made room
        assert srv.health().counters["evicted"] == 1 and srv.health().counters["refused_clients"] == 0
    finally:
        for sock in dead:
            sock.close()
        srv.stop()


def test_a_full_table_of_live_clients_still_refuses_a_new_one(line: Line) -> None:
    srv = serve(line, evict_after_s=30)
    assert srv.port is not None
    live = [ModbusTcpClient("127.0.0.1", port=srv.port, timeout=3) for _ in range(4)]
    try:
        for client in live:
            assert client.connect()
            assert not client.read_holding_registers(rm.STATUS, count=1).isError()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=3) as extra:
            assert closed_by_server(extra)
        assert all(not c.read_holding_registers(rm.STATUS, count=1).isError() for c in live)
        assert srv.health().counters["evicted"] == 0 and srv.health().counters["refused_clients"] == 1
    finally:
        for client in live:
            client.close()
        srv.stop()


def test_a_connection_without_requests_is_closed_after_the_idle_timeout_and_sockets_keep_alive(line: Line) -> None:
    srv = serve(line, idle_timeout_s=0.6)
    assert srv.port is not None
    poller = ModbusTcpClient("127.0.0.1", port=srv.port, timeout=3, retries=0)
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as silent:
            assert poller.connect()
            wait_for(lambda: len(srv._server.active_connections) == 2 if srv._server else False, 5, "two links")
            for link in list(srv._server.active_connections.values()) if srv._server else []:
                sock = link.transport.get_extra_info("socket")
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == modbus_link.KEEPALIVE_IDLE_S
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == modbus_link.KEEPALIVE_INTERVAL_S
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == modbus_link.KEEPALIVE_COUNT
            t0 = time.monotonic()
            while time.monotonic() - t0 < 1.5:  # the poller asks every 0.1 s: never idle
                assert not poller.read_holding_registers(rm.STATUS, count=1).isError()
                time.sleep(0.1)
            assert closed_by_server(silent, timeout=1.0)
        assert srv.health().counters["idle_closed"] == 1
    finally:
        poller.close()
        srv.stop()


def test_requests_in_one_segment_are_all_answered_in_order(line: Line) -> None:
    srv = serve(line)
    assert srv.port is not None
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(read_request(1, rm.STATUS) + read_request(2, rm.HEARTBEAT))  # one segment
            got = answers(sock, 2)
            assert [tid for tid, _ in got] == [1, 2]
            assert all(pdu[0] == 3 and pdu[1] == 2 for _, pdu in got)
            # A trigger and the PLC's status read, pipelined: the read is answered after the write, and sees
            # what the write did (TriggerAck once the trigger is durable).
            trigger = write_request(3, 0, [rm.TRIGGER_ENABLE | rm.TRIGGER, *rm.encode_text("PIPE-1", 16)])
            sock.sendall(trigger + read_request(4, rm.STATUS, count=rm.STATUS_END - rm.STATUS))
            (wtid, wpdu), (rtid, rpdu) = answers(sock, 2)
            assert (wtid, wpdu[0], rtid, rpdu[0]) == (3, 16, 4, 3)
            status = int.from_bytes(rpdu[2:4], "big")
            assert status & rm.TRIGGER_ACK and rm.decode_text(
                [int.from_bytes(rpdu[2 + 2 * i:4 + 2 * i], "big") for i in range(8, 24)]) == "PIPE-1"
            # 60 reads at once (720 bytes: pymodbus dropped whatever passed 264 waiting bytes).
            sock.sendall(b"".join(read_request(100 + i, rm.HEARTBEAT) for i in range(60)))
            assert [tid for tid, _ in answers(sock, 60)] == list(range(100, 160))
    finally:
        srv.stop()


def test_a_stream_that_is_not_modbus_tcp_is_closed(line: Line) -> None:
    srv = serve(line)
    assert srv.port is not None
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert closed_by_server(sock)
        assert srv.health().counters["bad_streams"] == 1
        client = ModbusTcpClient("127.0.0.1", port=srv.port, timeout=3)
        assert client.connect() and not client.read_holding_registers(rm.STATUS, count=1).isError()
        client.close()
    finally:
        srv.stop()
