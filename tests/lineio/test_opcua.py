"""The OPC UA server on loopback with an independent client (node-opcua from npm), a real Station and
a real job store; only the camera and the model stand aside (tests/support/line_station.py)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_runtime.config.line_protocols import OpcUaConfig
from edge_runtime.lineio.opcua.server import OpcUaServer
from edge_runtime.lineio.passwords import hash_password
from edge_runtime.lineio.signals import DEFECT_TIMEOUT, LineOutcome
from tests.support.cut_proxy import CutProxy
from tests.support.line_station import Line
from tests.support.mjpeg import free_port
from tests.support.opcua_peer import NodeClient, client_certificate, trust
from tests.support.waiting import wait_for

CLIENT_URI = "urn:test:node-opcua-plc"
SERVER_URI = "urn:test-device:edge-runtime"
PASSWORD_HASH = hash_password("secret")


STATIONS: dict[str, dict[str, Any]] = {
    "hand": {},  # the test gives each verdict
    "level": {"auto": lambda job: False},
    "over": {"auto": lambda job: True, "fifo_depth": 3},
    "slow": {"result_deadline_ms": 150},
    "mid": {},
}


class Plant:
    """Stations served by one OPC UA server, and the trusted PLC's certificate."""

    def __init__(self, tmp: Path, stations: dict[str, dict[str, Any]]) -> None:
        self.tmp = tmp
        self.lines = {name: Line(tmp, name=name, **cfg).start() for name, cfg in stations.items()}
        self.port = free_port()
        self.cert, self.key = client_certificate(tmp / "plc-cert", CLIENT_URI)
        trust(tmp / "pki", self.cert)
        self.server: OpcUaServer | None = None
        self.start_server()

    def start_server(self) -> None:
        cfg = OpcUaConfig(enabled=True, port=self.port, users=[{"name": "plc", "password_hash": PASSWORD_HASH}])
        self.server = OpcUaServer([line.station for line in self.lines.values()], cfg, self.tmp / "pki", SERVER_URI)
        self.server.start()
        wait_for(lambda: self.server is not None and self.server.listening, timeout=30, what="OPC UA server")

    def stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    @property
    def endpoint(self) -> str:
        return f"opc.tcp://127.0.0.1:{self.port}/edge-runtime/"

    def connect(self, client: NodeClient, **kw: Any) -> NodeClient:
        answer = client.connect(self.endpoint, self.cert, self.key, CLIENT_URI, **kw)
        assert answer["ok"], answer
        return client

    def close(self) -> None:
        self.stop_server()
        for line in self.lines.values():
            line.stop()


@pytest.fixture(scope="module")
def plant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plant]:
    made = Plant(tmp_path_factory.mktemp("plant"), STATIONS)
    yield made
    made.close()


@pytest.fixture(scope="module")
def plc(plant: Plant, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeClient]:
    """One node-opcua process and session for the module (starting node costs seconds here)."""
    client = plant.connect(NodeClient(tmp_path_factory.mktemp("node-plc")), max_retry=1000)
    yield client
    client.close()


SIGNALS = ["Ready", "TriggerAck", "AcquisitionDone", "ResultValid", "InspectionSeq", "PartId", "Result",
           "DefectCode", "BufferCount", "Overrun", "Busy"]


def read(plc: NodeClient, station: str, *names: str) -> dict[str, Any]:
    answer = plc.request("read", station=station, names=list(names))
    assert answer["ok"], answer
    return dict(answer["values"])


@pytest.mark.parametrize("defect,expected", [(False, LineOutcome.OK), (True, LineOutcome.NOK)])
def test_handshake_over_opcua_start_job_acquisition_result_ack(plant: Plant, plc: NodeClient, defect: bool,
                                                                 expected: LineOutcome) -> None:
    since = len(plc.notes)
    if expected == LineOutcome.OK:
        assert plc.request("subscribe", station="hand", names=SIGNALS, interval=10, events=True)["ok"]
    call = plc.request("call", station="hand", method="StartSingleJob", args=[f"PART-{defect}", ""])
    assert call["status"] == "Good", call
    seq = call["out"][0]
    assert seq == plant.lines["hand"].jobs.last_seq("hand")

    def new(pred: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        return plc.wait_note(lambda n: plc.notes.index(n) >= since and n.get("station") == "hand" and pred(n))
    new(lambda n: n.get("change") == "AcquisitionDone" and n["value"] is True)
    assert read(plc, "hand", "ResultValid")["ResultValid"] is False  # the frame is taken, the verdict is not there
    plant.lines["hand"].verdict(seq, defect)
    event = new(lambda n: n.get("event") == "ResultReady")
    assert (event["jobId"], event["partId"], event["result"]) == (seq, f"PART-{defect}", int(expected))
    values = read(plc, "hand", *SIGNALS)
    assert values["ResultValid"] is True and values["Result"] == int(expected) and values["BufferCount"] == 1
    assert values["PartId"] == f"PART-{defect}" and values["InspectionSeq"] == seq
    ack = plc.request("call", station="hand", method="ResultAck", args=[seq])
    assert ack["status"] == "Good" and ack["out"] == [True]
    new(lambda n: n.get("change") == "ResultValid" and n["value"] is False)
    row = plant.lines["hand"].jobs.job("hand", seq)
    assert row is not None and row["acked"] is not None and row["result"] == int(expected)


def test_level_trigger_and_result_ack_by_writes(plc: NodeClient) -> None:
    assert plc.request("write", station="level", name="PartIdIn", type="String", value="LVL-7")["status"] == "Good"
    assert plc.request("write", station="level", name="Trigger", type="Boolean", value=True)["status"] == "Good"
    wait_for(lambda: read(plc, "level", "ResultValid")["ResultValid"], timeout=5, what="ResultValid")
    assert read(plc, "level", "TriggerAck", "PartId", "Result") == {"TriggerAck": True, "PartId": "LVL-7", "Result": 1}
    plc.request("write", station="level", name="Trigger", type="Boolean", value=False)
    wait_for(lambda: not read(plc, "level", "TriggerAck")["TriggerAck"], timeout=5, what="TriggerAck low")
    plc.request("write", station="level", name="ResultAckIn", type="Boolean", value=True)
    wait_for(lambda: not read(plc, "level", "ResultValid")["ResultValid"], timeout=5, what="ResultValid low")
    # The signals are the device's: a PLC cannot write them.
    assert plc.request("write", station="level", name="Result", type="UInt32", value=1)["status"] != "Good"


def test_fifo_overrun_and_a_plc_that_never_acks(plant: Plant, plc: NodeClient) -> None:
    station = plant.lines["over"].station
    for i in range(3):
        assert plc.request("call", station="over", method="StartSingleJob", args=[f"P{i}", ""])["status"] == "Good"
        # The call returns once the trigger is durable; its frame is taken just after. A trigger before
        # that is refused busy (a loaded machine got there first), so wait for AcquisitionDone as a PLC does.
        wait_for(lambda: station.signals().acquisition_done, timeout=5, what=f"the frame of P{i}")
    wait_for(lambda: station.signals().buffer_count == 3, timeout=5, what="three results waiting")
    refused = plc.request("call", station="over", method="StartSingleJob", args=["P3", ""])
    assert refused["status"] == "BadResourceUnavailable"
    wait_for(lambda: "overrun" in read(plc, "over", "LastRefusal")["LastRefusal"], timeout=5, what="LastRefusal")
    values = read(plc, "over", "Overrun", "Ready", "BufferCount", "InspectionSeq", "PartId")
    assert values == {"Overrun": True, "Ready": False, "BufferCount": 3, "InspectionSeq": 1, "PartId": "P0"}
    time.sleep(0.3)  # nobody acks: the results wait, none is dropped or replaced
    assert station.signals().buffer_count == 3 and plant.lines["over"].jobs.last_seq("over") == 3


def test_deadline_gives_nok_timeout_over_opcua(plc: NodeClient) -> None:
    since = len(plc.notes)
    plc.request("subscribe", station="slow", names=["ResultValid"], interval=10, events=True)
    seq = plc.request("call", station="slow", method="StartSingleJob", args=["SLOW", ""])["out"][0]
    event = plc.wait_note(lambda n: plc.notes.index(n) >= since and n.get("event") == "ResultReady"
                          and n["station"] == "slow", timeout=5)
    assert (event["jobId"], event["result"], event["defectCode"]) == (seq, int(LineOutcome.NOK), DEFECT_TIMEOUT)


def test_wrong_credentials_untrusted_certificate_and_no_security_are_refused(plant: Plant,
                                                                               tmp_path: Path) -> None:
    before = sum(line.jobs.last_seq(name) for name, line in plant.lines.items())
    other = NodeClient(tmp_path / "stranger")
    try:
        answer = other.connect(plant.endpoint, plant.cert, plant.key, CLIENT_URI, password="guess")
        assert not answer["ok"] and "BadUserAccessDenied" in answer["error"], answer
        assert plant.server is not None and plant.server.users.refused >= 1
        stranger_cert, stranger_key = client_certificate(tmp_path / "other-cert", "urn:test:stranger")
        refused = plant.server.trust.refused
        answer = other.connect(plant.endpoint, stranger_cert, stranger_key, "urn:test:stranger")
        assert not answer["ok"], answer
        assert plant.server.trust.refused > refused
        assert list((plant.tmp / "pki" / "rejected").iterdir())  # kept for an operator to trust by hand
        answer = other.connect(plant.endpoint, plant.cert, plant.key, CLIENT_URI, mode="None", policy="None")
        assert not answer["ok"], answer
        answer = other.connect(plant.endpoint, plant.cert, plant.key, CLIENT_URI, user=None, password=None)
        assert not answer["ok"], answer
    finally:
        other.close()
    assert sum(line.jobs.last_seq(name) for name, line in plant.lines.items()) == before


def test_a_plc_that_disconnects_mid_job_reconnects_and_its_subscription_comes_back(
        plant: Plant, tmp_path: Path) -> None:
    proxy = CutProxy(plant.port)  # the cable between PLC and device
    plc = NodeClient(tmp_path / "node-cut")
    try:
        answer = plc.connect(f"opc.tcp://127.0.0.1:{proxy.port}/edge-runtime/", plant.cert, plant.key, CLIENT_URI,
                             max_retry=1000)
        assert answer["ok"], answer
        plc.request("subscribe", station="mid", names=["ResultValid"], interval=10)
        seq = plc.request("call", station="mid", method="StartSingleJob", args=["MID", ""])["out"][0]
        proxy.cut()  # the connection drops mid-job
        plc.wait_note(lambda n: n.get("notice") == "connection_lost", timeout=10)
        plant.lines["mid"].verdict(seq, False)  # the verdict comes while the PLC is away
        time.sleep(0.5)
        proxy.restore()
        note = plc.wait_note(lambda n: n.get("change") == "ResultValid" and n["value"] is True, timeout=30)
        assert note["t"] > plc.wait_note(lambda n: n.get("notice") == "connection_lost")["t"]
        assert plc.request("call", station="mid", method="ResultAck", args=[seq])["out"] == [True]
    finally:
        plc.close()
        proxy.close()


def test_connections_beyond_max_clients_are_refused(tmp_path: Path) -> None:
    line = Line(tmp_path, name="lim").start()
    port = free_port()
    cfg = OpcUaConfig(enabled=True, port=port, max_clients=2, anonymous=True, security=["none"])
    server = OpcUaServer([line.station], cfg, tmp_path / "pki", SERVER_URI)
    server.start()
    socks: list[socket.socket] = []
    try:
        wait_for(lambda: server.listening, timeout=30, what="OPC UA server")
        for _ in range(2):
            socks.append(socket.create_connection(("127.0.0.1", port)))
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", port))
        socks.append(extra)
        extra.settimeout(5)
        assert extra.recv(64) == b""  # closed by the server at once: the limit holds
    finally:
        for s in socks:
            s.close()
        server.stop()
        line.stop()


def test_a_plc_write_of_trigger_enable_still_reaches_the_station(plant: Plant, plc: NodeClient) -> None:
    station = plant.lines["hand"].station
    try:
        off = plc.request("write", station="hand", name="TriggerEnable", type="Boolean", value=False)
        assert off["status"] == "Good"
        wait_for(lambda: not station.signals().trigger_enable, timeout=5, what="TriggerEnable off")
        assert not station.signals().ready
    finally:
        plc.request("write", station="hand", name="TriggerEnable", type="Boolean", value=True)
        wait_for(lambda: station.signals().trigger_enable, timeout=5, what="TriggerEnable on")


def test_trigger_enable_changed_twice_while_the_loop_is_busy_settles_without_echo_loop(tmp_path: Path) -> None:
    """TriggerEnable is both the line's input and the shown state: echoing stale snapshots must not go back
    through the node's setter to the station (each echo would make a new snapshot: an endless loop)."""
    line = Line(tmp_path, name="echo").start()
    cfg = OpcUaConfig(enabled=True, port=free_port(), anonymous=True, security=["none"])
    server = OpcUaServer([line.station], cfg, tmp_path / "pki", SERVER_URI)
    changes: list[bool] = []
    last = [line.station.signals().trigger_enable]

    def seen(s: Any) -> None:
        if s.trigger_enable != last[0]:
            last[0] = s.trigger_enable
            changes.append(s.trigger_enable)
    unwatch = line.station.watch(seen)
    server.start()
    try:
        wait_for(lambda: server.listening, timeout=30, what="OPC UA server")
        loop = server._loop
        assert loop is not None
        writes = server.counters["writes"]
        loop.call_soon_threadsafe(time.sleep, 0.3)  # the OPC UA loop is busy ...
        time.sleep(0.05)
        line.station.set_trigger_enable(False)  # ... while another protocol changes TriggerEnable twice
        line.station.set_trigger_enable(True)
        time.sleep(1.25)
        assert changes == [False, True], changes[:10]
        assert len(changes) <= 4
        assert line.station.signals().trigger_enable
        node = server._nodes[0].inputs["TriggerEnable"]
        assert server._server.read_attribute_value(node.nodeid).Value.Value is True
        assert server.counters["writes"] - writes <= 8  # the two snapshots (TriggerEnable and Ready each)
    finally:
        unwatch()
        server.stop()
        line.stop()
