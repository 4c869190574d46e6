"""The Modbus TCP server against a real Station, driven by an independent client (npm modbus-serial)
and by pymodbus's own client where a second opinion is cheap."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pymodbus.client import ModbusTcpClient

from edge_runtime.config.line_protocols import ModbusConfig
from edge_runtime.lineio import modbus_map as rm
from edge_runtime.lineio.modbus import ModbusServer
from edge_runtime.lineio.signals import JobRequest
from tests.support.line_station import Line
from tests.support.npm import npm_package
from tests.support.waiting import wait_for

PLC = Path(__file__).with_name("modbus_plc.js")
MODBUS_SERIAL = "modbus-serial@8.0.25"


def nok_when_part_says_so(job: JobRequest) -> bool:
    return job.part_id.startswith("NOK")


@pytest.fixture
def line(tmp_path: Path) -> Iterator[Line]:
    ln = Line(tmp_path, auto=nok_when_part_says_so).start()
    yield ln
    ln.stop()


def serve(line: Line, **cfg: Any) -> ModbusServer:
    server = ModbusServer([line.station], ModbusConfig(enabled=True, port=0, **cfg))
    server.start()
    assert server.listening.wait(10), server.last_error
    return server


@pytest.fixture
def server(line: Line) -> Iterator[ModbusServer]:
    srv = serve(line)
    yield srv
    srv.stop()


def plc(port: int, *steps: str) -> list[dict[str, Any]]:
    """Run the independent client's steps; one JSON answer per step."""
    modules = npm_package(MODBUS_SERIAL)
    node = shutil.which("node")
    assert node
    out = subprocess.run([node, str(PLC), str(port), *steps], capture_output=True, text=True, timeout=60,
                         env={"NODE_PATH": str(modules), "PATH": "/usr/bin:/bin"})
    answers = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert answers, f"no answer from the client: {out.stderr}"
    return answers


def closed_without_answer(sock: socket.socket) -> bool:
    """Send a valid request (read one register at 50): a refused connection ends with no answer."""
    try:
        sock.sendall(bytes.fromhex("000100000006010300320001"))
        return sock.recv(64) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def test_ok_and_nok_handshakes_through_an_independent_client(line: Line, server: ModbusServer) -> None:
    assert server.port is not None
    ok, nok = plc(server.port, "handshake:PART-0001", "handshake:NOK-PART-0002")
    assert ok.get("result") == 1, (ok, nok)
    assert (ok["result"], ok["defect"], ok["part_id"]) == (1, 0, "PART-0001"), ok
    assert (nok["result"], nok["defect"], nok["part_id"]) == (2, 1, "NOK-PART-0002"), nok
    assert nok["seq"] == ok["seq"] + 1
    assert ok["acq_status"] & rm.ACQUISITION_DONE and ok["acq_status"] & rm.TRIGGER_ACK
    # After the ack the FIFO is empty and ResultValid is down.
    assert nok["buffer_after"] == 0 and not nok["after_status"] & rm.RESULT_VALID
    health = line.station.health().counters
    assert health["acks"] == 2 and health["results_ok"] == 1 and health["results_nok"] == 1
    assert server.health().counters["triggers"] == 2


def test_a_plc_that_drops_off_mid_job_collects_the_result_after_reconnecting(tmp_path: Path) -> None:
    ln = Line(tmp_path).start()  # verdicts by hand: the first connection is gone before this one
    srv = serve(ln)
    try:
        assert srv.port is not None
        (trig,) = plc(srv.port, "trigger:PART-9")
        assert trig["ok"], trig
        ln.verdict(trig["seq"], defect=True)
        (got,) = plc(srv.port, "collect")
        assert (got["seq"], got["result"], got["part_id"], got["buffer_after"]) == (trig["seq"], 2, "PART-9", 0)
        assert srv.health().counters["connections"] == 2
    finally:
        srv.stop()
        ln.stop()


def test_a_write_outside_the_control_registers_is_refused(server: ModbusServer) -> None:
    assert server.port is not None
    status, gap, past = plc(server.port, f"write:{rm.STATUS}:1", "write:30:1", "write:150:1")
    assert (status["ok"], status["code"]) == (False, 2), status  # illegal data address
    assert (gap["ok"], gap["code"]) == (False, 2), gap
    assert (past["ok"], past["code"]) == (False, 2), past
    # pymodbus's client agrees, and coils are an illegal function, not a back door into the same block.
    client = ModbusTcpClient("127.0.0.1", port=server.port)
    assert client.connect()
    try:
        assert client.write_register(rm.SEQ, 7).exception_code == 2
        assert client.write_coil(0, True).exception_code == 1
        assert client.read_holding_registers(rm.SEQ, count=2).registers == [0, 0]
    finally:
        client.close()


def test_a_client_outside_the_allow_list_is_closed(line: Line) -> None:
    srv = serve(line, allow=["10.99.0.0/16"])
    try:
        assert srv.port is not None
        answers = plc(srv.port, "read:50:1")
        assert not answers[0].get("ok", False), answers
        with socket.create_connection(("127.0.0.1", srv.port), timeout=2) as sock:
            assert closed_without_answer(sock)
        assert srv.health().counters["refused_clients"] >= 2
        assert srv.health().counters["connections"] == 0
    finally:
        srv.stop()


def test_too_many_connections_are_closed(line: Line) -> None:
    """Past max_clients a new connection is closed while the ones held are not silent (a connection
    silent for `evict_after_s` would give its place: test_modbus_connections.py)."""
    srv = ModbusServer([line.station], ModbusConfig(enabled=True, port=0, max_clients=1), evict_after_s=60)
    srv.start()
    assert srv.listening.wait(10), srv.last_error
    try:
        assert srv.port is not None
        first = ModbusTcpClient("127.0.0.1", port=srv.port)
        assert first.connect()
        deadline = time.monotonic() + 5
        while srv.health().counters["connections"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # the server has taken the first connection
        with socket.create_connection(("127.0.0.1", srv.port), timeout=2) as sock:
            assert closed_without_answer(sock)
        assert not first.read_holding_registers(rm.STATUS, count=1).isError()
        first.close()
    finally:
        srv.stop()


def test_a_first_control_write_with_trigger_enable_off_disables_the_station(line: Line, server: ModbusServer) -> None:
    """The station is enabled at start, and the ControlWord shows it (bit 0): a PLC whose first write
    (after a start or a restart of the daemon) has TriggerEnable off turns triggers off, as the map says.
    The register read 0, so that write changed no bit and the station stayed enabled."""
    client = ModbusTcpClient("127.0.0.1", port=server.port or 0)
    try:
        assert client.connect()
        assert line.station.signals().trigger_enable
        client.write_register(rm.CONTROL, 0)  # the line is stopped: no triggers
        status = client.read_holding_registers(rm.STATUS, count=1).registers[0]
        assert not line.station.signals().trigger_enable and not status & rm.TRIGGER_ENABLED
        assert not status & rm.READY
        client.write_register(rm.CONTROL, rm.TRIGGER_ENABLE)
        client.write_register(rm.CONTROL, 0)
        assert not line.station.signals().trigger_enable
        client.write_register(rm.CONTROL, rm.TRIGGER)  # a trigger without TriggerEnable is refused
        regs = client.read_holding_registers(rm.STATUS, count=8).registers
        assert regs[rm.LAST_REFUSAL - rm.STATUS] == rm.REFUSAL_CODES["disabled"] and line.jobs.last_seq("st1") == 0
        client.write_register(rm.CONTROL, rm.TRIGGER_ENABLE)
        assert line.station.signals().trigger_enable
        assert client.read_holding_registers(rm.CONTROL, count=1).registers == [rm.TRIGGER_ENABLE]
    finally:
        client.close()


def test_a_refused_trigger_says_why(tmp_path: Path) -> None:
    ln = Line(tmp_path, fifo_depth=1).start()  # no verdicts: the first job stays, the second overruns
    srv = serve(ln)
    client = ModbusTcpClient("127.0.0.1", port=srv.port or 0)
    try:
        assert client.connect()
        client.write_registers(0, [rm.TRIGGER_ENABLE | rm.TRIGGER, *rm.encode_text("A", 16)])
        # Part A taken before B comes: a trigger while the station still takes A's frame is refused as
        # busy, not overrun (a loaded fresh-clone CI run got there first).
        wait_for(lambda: len(ln.pending) == 1, 10, "part A taken")
        client.write_register(0, rm.TRIGGER_ENABLE)
        client.write_registers(0, [rm.TRIGGER_ENABLE | rm.TRIGGER, *rm.encode_text("B", 16)])
        regs = client.read_holding_registers(rm.STATUS, count=rm.STATUS_END - rm.STATUS).registers
        assert regs[rm.LAST_REFUSAL - rm.STATUS] == rm.REFUSAL_CODES["overrun"]
        assert regs[0] & rm.OVERRUN and rm.decode_text(regs[rm.PART_ID_ECHO - rm.STATUS:]) == "A"
        client.write_registers(0, [rm.TRIGGER_ENABLE, *rm.encode_text("bad\x01id", 16)])
        client.write_register(0, rm.TRIGGER_ENABLE | rm.TRIGGER)
        regs = client.read_holding_registers(rm.STATUS, count=8).registers
        assert regs[rm.LAST_REFUSAL - rm.STATUS] == rm.REFUSAL_CODES["bad_part_id"]
    finally:
        client.close()
        srv.stop()
        ln.stop()


def test_a_flood_of_writes_is_held_in_bounded_memory(line: Line, server: ModbusServer) -> None:
    client = ModbusTcpClient("127.0.0.1", port=server.port or 0)
    assert client.connect()
    stop = threading.Event()

    def flood() -> None:
        while not stop.is_set():
            client.write_registers(0, [rm.TRIGGER_ENABLE | rm.TRIGGER, *rm.encode_text("FLOOD", 16)])
            client.write_register(0, rm.TRIGGER_ENABLE | rm.RESULT_ACK)

    tracemalloc.start()
    try:
        flood_thread = threading.Thread(target=flood)
        flood_thread.start()
        time.sleep(1.0)
        before = tracemalloc.get_traced_memory()[0]
        time.sleep(2.0)
        grown = tracemalloc.get_traced_memory()[0] - before
        stop.set()
        flood_thread.join(5)
    finally:
        tracemalloc.stop()
        client.close()
    counters = server.health().counters
    assert counters["writes"] > 200, counters
    assert grown < 2_000_000, f"memory grew {grown} bytes during the flood"
    assert server.health().ok


def test_text_registers_round_trip() -> None:
    regs = rm.encode_text("AB-12345678901234567890123456789", rm.PART_ID_REGS)
    assert len(regs) == 16 and regs[0] == 0x4142
    assert rm.decode_text(regs) == "AB-12345678901234567890123456789"
    assert rm.decode_text(rm.encode_text("", 16)) == ""


def test_a_port_in_use_shows_in_health_and_the_server_retries(line: Line) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        srv = ModbusServer([line.station], ModbusConfig(enabled=True, port=port))
        srv.start()
        try:
            deadline = time.monotonic() + 5
            while srv.health().counters["restarts"] == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            health = srv.health()
            assert not health.ok and "listen" in health.detail.lower(), health
            assert srv.threads()[0].is_alive(), "the thread retries; it does not die"
        finally:
            srv.stop()


def test_a_control_write_is_answered_once_durable_while_other_reads_go_on(tmp_path: Path) -> None:
    """The job store's disk hangs: the PLC's trigger write is answered only once the trigger is on disk
    (so its next read sees TriggerAck, as a polling PLC expects), and meanwhile the server still answers
    another client's status reads at once (its loop does not wait for the disk)."""
    ln = Line(tmp_path).start()
    gate, held = threading.Event(), threading.Event()
    commit = ln.jobs._commit

    def hung_then_released() -> None:
        if not gate.is_set():
            held.set()
            gate.wait(10)
        commit()
    ln.jobs._commit = hung_then_released  # type: ignore[method-assign]
    srv = serve(ln)
    plc, scada = ModbusTcpClient("127.0.0.1", port=srv.port or 0), ModbusTcpClient("127.0.0.1", port=srv.port or 0)
    answered = threading.Event()
    try:
        assert plc.connect() and scada.connect()

        def trigger() -> None:
            plc.write_registers(0, [rm.TRIGGER_ENABLE | rm.TRIGGER, *rm.encode_text("SLOW-DISK", 16)])
            answered.set()
        writer = threading.Thread(target=trigger)
        writer.start()
        assert held.wait(5)
        t0 = time.monotonic()
        status = scada.read_holding_registers(rm.STATUS, count=1).registers[0]
        assert time.monotonic() - t0 < 0.5, "a read waited for the disk"
        assert not status & rm.TRIGGER_ACK and not answered.is_set()
        gate.set()
        writer.join(10)
        assert answered.is_set()
        regs = plc.read_holding_registers(rm.STATUS, count=rm.STATUS_END - rm.STATUS).registers
        assert regs[0] & rm.TRIGGER_ACK and rm.decode_text(regs[rm.PART_ID_ECHO - rm.STATUS:]) == "SLOW-DISK"
    finally:
        gate.set()
        plc.close()
        scada.close()
        srv.stop()
        ln.stop()
