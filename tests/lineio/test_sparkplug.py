"""The Sparkplug B edge node against the real Mosquitto broker and a real Station."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from pydantic import SecretStr

from edge_runtime.config.line_protocols import SparkplugConfig
from edge_runtime.config.mqtt import MqttConfig
from edge_runtime.delivery.mqtt.client import configure_client
from edge_runtime.lineio.signals import JobRequest
from edge_runtime.lineio.sparkplug import payload as spb
from edge_runtime.lineio.sparkplug.node import SparkplugNode
from tests.support.broker import Broker
from tests.support.line_station import Line

GROUP = "plant1"
NODE = "cell7"
CHILD = Path(__file__).with_name("sparkplug_child.py")


class Host:
    """A Sparkplug host application's view: every message under spBv1.0/, decoded."""

    def __init__(self, port: int) -> None:
        self.messages: list[tuple[str, dict[str, Any], int | None, int]] = []  # topic, metrics, seq, qos
        self.cond = threading.Condition()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="scada-host")
        self.client.on_message = self._on_message
        subscribed = threading.Event()
        self.client.on_subscribe = lambda *_a: subscribed.set()
        self.client.on_connect = lambda c, *_a: c.subscribe("spBv1.0/#", qos=1)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert subscribed.wait(5)

    def _on_message(self, _c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
        try:
            p = spb.decode(bytes(msg.payload))
            entry = (msg.topic, spb.metric_values(p), p.seq if p.HasField("seq") else None, msg.qos)
        except Exception:  # noqa: BLE001 - the garbage the tests themselves send
            entry = (msg.topic, {"undecodable": True}, None, msg.qos)
        with self.cond:
            self.messages.append(entry)
            self.cond.notify_all()

    def wait(self, pred: Callable[[str, dict[str, Any]], bool], after: int = 0,
             timeout: float = 10) -> tuple[int, tuple[str, dict[str, Any], int | None, int]]:
        """The first message from index `after` on that `pred` accepts (index, message)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for i in range(after, len(self.messages)):
                    if pred(self.messages[i][0], self.messages[i][1]):
                        return i, self.messages[i]
                left = deadline - time.monotonic()
                assert left > 0, f"no such message; saw {[m[0] for m in self.messages[after:]]}"
                self.cond.wait(left)

    def command(self, topic: str, metrics: list[tuple[str, int, Any]], wait: bool = True) -> None:
        info = self.client.publish(topic, spb.payload(None, metrics), qos=1)
        if wait:
            info.wait_for_publish(5)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def node_seqs(host: Host) -> list[int]:
    """The seq of every message the node sent (births and data; commands are the host's)."""
    return [s if s is not None else -1 for t, _m, s, _q in host.messages
            if t.split("/")[2] in ("NBIRTH", "DBIRTH", "DDATA")]


def topic(kind: str, device: str | None = None) -> str:
    return f"spBv1.0/{GROUP}/{kind}/{NODE}" + (f"/{device}" if device else "")


def is_(kind: str, device: str | None = None) -> Callable[[str, dict[str, Any]], bool]:
    return lambda t, _m: t == topic(kind, device)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path / "broker").start()
    yield b
    b.stop()


@pytest.fixture
def host(broker: Broker) -> Iterator[Host]:
    h = Host(broker.port)
    yield h
    h.close()


def nok_when_part_says_so(job: JobRequest) -> bool:
    return job.part_id.startswith("NOK")


@pytest.fixture
def line(tmp_path: Path) -> Iterator[Line]:
    ln = Line(tmp_path, auto=nok_when_part_says_so).start()
    yield ln
    ln.stop()


def make_node(line: Line, broker: Broker, tmp_path: Path, **cfg: Any) -> SparkplugNode:
    mqtt_cfg = MqttConfig(host="127.0.0.1", port=broker.port, keepalive=5)
    cfg = {"device_commands": True, **cfg}  # the tests play the host that may command the stations
    return SparkplugNode([line.station], SparkplugConfig(enabled=True, group_id=GROUP, **cfg), mqtt_cfg, NODE,
                         tmp_path / "sparkplug" / "bdseq", configure=lambda c: configure_client(c, mqtt_cfg))


@pytest.fixture
def node(line: Line, broker: Broker, host: Host, tmp_path: Path) -> Iterator[SparkplugNode]:
    n = make_node(line, broker, tmp_path)
    n.start()
    yield n
    n.stop()


def test_births_on_connect_then_a_dcmd_trigger_runs_the_handshake(node: SparkplugNode, host: Host,
                                                                   line: Line) -> None:
    i, (_t, nbirth, seq, qos) = host.wait(is_("NBIRTH"))
    assert (nbirth[spb.BDSEQ], nbirth[spb.REBIRTH], seq, qos) == (0, False, 0, 0)
    i, (_t, dbirth, seq, _q) = host.wait(is_("DBIRTH", "st1"), i)
    assert seq == 1 and dbirth["Ready"] is True and dbirth["ResultValid"] is False and "Trigger" in dbirth
    host.command(topic("DCMD", "st1"), [("PartId", spb.STRING, "NOK-77"), ("Trigger", spb.BOOLEAN, True)])
    j, _msg = host.wait(lambda t, m: t == topic("DDATA", "st1") and m.get("ResultValid") is True, i)
    seen = {k: v for _t, m, _s, _q in host.messages[i + 1:j + 1] for k, v in m.items()}
    assert seen["TriggerAck"] is True and seen["AcquisitionDone"] is True
    assert (seen["PartId"], seen["Result"], seen["DefectCode"], seen["InspectionSeq"]) == ("NOK-77", 2, 1, 1)
    host.command(topic("DCMD", "st1"), [("Trigger", spb.BOOLEAN, False), ("ResultAck", spb.BOOLEAN, True)])
    host.wait(lambda t, m: t == topic("DDATA", "st1") and m.get("ResultValid") is False, j)
    assert line.station.health().counters["acks"] == 1
    seqs = node_seqs(host)
    assert seqs == list(range(len(seqs))), host.messages


def test_rebirth_on_ncmd_restarts_seq_with_the_same_bdseq(node: SparkplugNode, host: Host) -> None:
    i, _msg = host.wait(is_("DBIRTH", "st1"))
    host.command(topic("NCMD"), [(spb.REBIRTH, spb.BOOLEAN, True)])
    i, (_t, again, seq, _q) = host.wait(is_("NBIRTH"), i + 1)
    assert seq == 0 and again[spb.BDSEQ] == 0
    _i, (_t, _m, seq, _q) = host.wait(is_("DBIRTH", "st1"), i)
    assert seq == 1


def test_a_flood_of_rebirth_requests_is_answered_by_a_bounded_number_of_births(
        node: SparkplugNode, host: Host, caplog: pytest.LogCaptureFixture) -> None:
    # Each NCMD rebirth sent the births again and logged a line: 2,000 requests in a burst made 1,752
    # NBIRTHs (5,506 messages with the DBIRTHs) and 2,000 INFO lines. Requests within a second of the
    # last births are folded into one more, sent when the second is up: the last request is answered.
    import logging

    from edge_runtime.lineio.sparkplug.node import MIN_REBIRTH_INTERVAL_S

    caplog.set_level(logging.INFO)
    i, _msg = host.wait(is_("DBIRTH", "st1"))
    started = time.monotonic()
    for _ in range(2000):
        host.command(topic("NCMD"), [(spb.REBIRTH, spb.BOOLEAN, True)], wait=False)
    deadline = time.monotonic() + 10
    while node.counters["commands"] < 2000 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert node.counters["commands"] == 2000
    while node._rebirth_asked and time.monotonic() < deadline + 5:  # births answer every request made
        time.sleep(0.02)
    assert not node._rebirth_asked
    host.wait(is_("DBIRTH", "st1"), i + 1)
    elapsed = time.monotonic() - started
    births = [m for m in host.messages[i + 1:] if m[0] == topic("NBIRTH")]
    assert 1 <= len(births) <= elapsed / MIN_REBIRTH_INTERVAL_S + 2, (len(births), elapsed)
    assert sum("rebirth" in r.getMessage() for r in caplog.records) <= 2


def test_a_retained_dcmd_does_not_trigger_again_on_every_connect(line: Line, broker: Broker, host: Host,
                                                                  tmp_path: Path) -> None:
    # A DCMD published with retain (against the specification) sat on the broker, which hands it to every
    # new subscription: each start and reconnect of the node ran its Trigger again (a job each time).
    trigger = spb.payload(None, [("PartId", spb.STRING, "OK-R"), ("Trigger", spb.BOOLEAN, True)])
    host.client.publish(topic("DCMD", "st1"), trigger, qos=1, retain=True).wait_for_publish(5)
    node = make_node(line, broker, tmp_path)
    node.start()
    try:
        host.wait(is_("DBIRTH", "st1"))
        deadline = time.monotonic() + 5
        while node.counters["refused_commands"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert node.counters["refused_commands"] == 1 and node.counters["triggers"] == 0
        assert line.station.signals().inspection_seq == 0
    finally:
        host.client.publish(topic("DCMD", "st1"), b"", qos=1, retain=True).wait_for_publish(5)  # cleared
        node.stop()


def test_bad_commands_are_refused_and_the_node_goes_on(node: SparkplugNode, host: Host) -> None:
    host.wait(is_("DBIRTH", "st1"))
    host.client.publish(topic("DCMD", "st1"), b"\xff\x00garbage", qos=1).wait_for_publish(5)
    host.command(topic("DCMD", "st1"), [("Fault", spb.BOOLEAN, True)])  # read-only
    host.command(topic("DCMD", "st1"), [("Trigger", spb.STRING, "yes")])  # wrong type
    host.client.publish(topic("DCMD", "st1"), b"\x00" * 20_000, qos=1).wait_for_publish(5)  # over the limit
    host.command(topic("DCMD", "nope"), [("Trigger", spb.BOOLEAN, True)])
    deadline = time.monotonic() + 5
    while node.counters["refused_commands"] < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert node.counters["refused_commands"] == 5 and node.counters["triggers"] == 0
    host.command(topic("DCMD", "st1"), [("PartId", spb.STRING, "OK-1"), ("Trigger", spb.BOOLEAN, True)])
    host.wait(lambda t, m: t == topic("DDATA", "st1") and m.get("Result") == 1)
    assert node.health().ok



def test_a_rebirth_of_the_wrong_type_and_an_empty_dcmd_are_refused_and_counted(
        node: SparkplugNode, host: Host, line: Line, caplog: pytest.LogCaptureFixture) -> None:
    """They were ignored without a word: not counted, not logged, no rebirth, nothing done."""
    i, _msg = host.wait(is_("DBIRTH", "st1"))
    refused = node.counters["refused_commands"]
    with caplog.at_level(logging.WARNING, logger="edge_runtime.lineio.sparkplug.node"):
        host.command(topic("NCMD"), [(spb.REBIRTH, spb.INT32, 1)])
        host.command(topic("NCMD"), [(spb.REBIRTH, spb.STRING, "true")])
        host.command(topic("DCMD", "st1"), [])
        deadline = time.monotonic() + 20  # generous: a loaded 2-core machine
        while node.counters["refused_commands"] < refused + 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert node.counters["refused_commands"] == refused + 3
    # WARNING and above only: caplog also holds INFO lines logged before the block (e.g. "connected")
    lines = [r.getMessage() for r in caplog.records
             if r.name == "edge_runtime.lineio.sparkplug.node" and r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "must be a Boolean, not an integer" in lines[0], lines  # then once a minute
    assert not any(t == topic("NBIRTH") for t, *_ in host.messages[i:])
    assert line.station.health().counters["triggers"] == 0
    host.command(topic("NCMD"), [(spb.REBIRTH, spb.BOOLEAN, True)])  # the right one still works
    host.wait(is_("NBIRTH"), i + 1)

def test_ndeath_carries_the_births_bdseq_when_the_connection_drops(node: SparkplugNode, host: Host) -> None:
    i, (_t, birth, _s, _q) = host.wait(is_("NBIRTH"))
    client = node._client
    assert client is not None
    sock = client.socket()
    assert isinstance(sock, socket.socket)
    sock.shutdown(socket.SHUT_RDWR)  # the TCP connection ends without a DISCONNECT: the broker sends the Will
    i, (_t, death, seq, qos) = host.wait(is_("NDEATH"), i)
    assert death == {spb.BDSEQ: birth[spb.BDSEQ]} and seq is None and qos == 1
    _i, (_t, reborn, _s, _q) = host.wait(is_("NBIRTH"), i)
    assert reborn[spb.BDSEQ] == birth[spb.BDSEQ] + 1


def test_kill_9_sends_ndeath_and_bdseq_goes_on_after_restart(broker: Broker, host: Host, tmp_path: Path) -> None:
    def child() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, str(CHILD), str(broker.port), str(tmp_path), GROUP, NODE],
                                cwd=Path(__file__).parents[2], env={**os.environ, "PYTHONPATH": "."})

    proc = child()
    try:
        i, (_t, birth, _s, _q) = host.wait(is_("NBIRTH"), timeout=30)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        i, (_t, death, _s, qos) = host.wait(is_("NDEATH"), i)
        assert death[spb.BDSEQ] == birth[spb.BDSEQ] and qos == 1
        proc = child()
        _i, (_t, again, _s, _q) = host.wait(is_("NBIRTH"), i, timeout=30)
        assert again[spb.BDSEQ] == (birth[spb.BDSEQ] + 1) % 256
    finally:
        proc.kill()
        proc.wait(10)


def test_a_clean_stop_publishes_ndeath(line: Line, broker: Broker, host: Host, tmp_path: Path) -> None:
    n = make_node(line, broker, tmp_path)
    n.start()
    i, (_t, birth, _s, _q) = host.wait(is_("NBIRTH"))
    n.stop()
    _i, (_t, death, _s, _q) = host.wait(is_("NDEATH"), i)
    assert death[spb.BDSEQ] == birth[spb.BDSEQ]


def test_seq_wraps_from_255_to_0(node: SparkplugNode, host: Host) -> None:
    host.wait(is_("DBIRTH", "st1"))
    for k in range(300):  # each change of TriggerEnable is one DDATA (TriggerEnable and Ready)
        host.command(topic("DCMD", "st1"), [("TriggerEnable", spb.BOOLEAN, k % 2 == 1)], wait=k == 299)
    deadline = time.monotonic() + 20
    while len(node_seqs(host)) < 302 and time.monotonic() < deadline:
        time.sleep(0.05)
    seqs = node_seqs(host)
    assert len(seqs) >= 302 and node.counters["dropped"] == 0
    assert all(b == (a + 1) % 256 for a, b in itertools.pairwise(seqs)), seqs
    assert seqs[256] == 0


def test_after_a_broker_restart_the_node_is_born_again_with_the_next_bdseq(node: SparkplugNode, host: Host,
                                                                          broker: Broker, line: Line) -> None:
    _i, (_t, birth, _s, _q) = host.wait(is_("NBIRTH"))
    broker.stop()
    broker.start()  # same port; both clients reconnect on their own
    mark = len(host.messages)
    _i, (_t, again, _s, _q) = host.wait(is_("NBIRTH"), mark, timeout=30)
    assert again[spb.BDSEQ] == birth[spb.BDSEQ] + 1
    j, _m = host.wait(is_("DBIRTH", "st1"), mark)
    # The DCMD subscription is back: a trigger sent now runs.
    host.command(topic("DCMD", "st1"), [("PartId", spb.STRING, "AFTER"), ("Trigger", spb.BOOLEAN, True)])
    host.wait(lambda t, m: t == topic("DDATA", "st1") and m.get("PartId") == "AFTER", j)
    assert node.health().ok and node.counters["connects"] == 2


def test_a_flood_of_signal_changes_is_held_in_a_bounded_queue(line: Line, broker: Broker, host: Host,
                                                               tmp_path: Path) -> None:
    n = make_node(line, broker, tmp_path, max_pending=8)
    n.start()
    try:
        host.wait(is_("DBIRTH", "st1"))
        dev = n.devices["st1"]
        longest = 0
        for k in range(5000):
            line.station.set_trigger_enable(k % 2 == 0)
            longest = max(longest, len(dev.pending))
        assert longest <= 8
        deadline = time.monotonic() + 20
        # The publisher takes a change off `pending` before it counts it: wait for the counts, not the queue.
        while (dev.pending or sum(n.counters[k] for k in ("ddata", "dropped", "superseded")) < 5000 - 8) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        assert n.health().ok
        # Every change was published, dropped from the full queue, or superseded (a birth or a later change carried it).
        assert sum(n.counters[k] for k in ("ddata", "dropped", "superseded")) >= 5000 - 8
    finally:
        n.stop()


def test_broker_credentials_come_from_the_mqtt_settings(line: Line, tmp_path: Path) -> None:
    broker = Broker(tmp_path / "auth", password=("edge", "s3cret-pw")).start()
    try:
        good = MqttConfig(host="127.0.0.1", port=broker.port, username="edge", password="s3cret-pw")
        bad = good.model_copy(update={"password": SecretStr("wrong")})
        refused = SparkplugNode([line.station], SparkplugConfig(enabled=True, group_id=GROUP), bad, "n-bad",
                                tmp_path / "bad" / "bdseq", configure=lambda c: configure_client(c, bad))
        accepted = SparkplugNode([line.station], SparkplugConfig(enabled=True, group_id=GROUP), good, "n-good",
                                 tmp_path / "good" / "bdseq", configure=lambda c: configure_client(c, good))
        refused.start()
        accepted.start()
        try:
            deadline = time.monotonic() + 10
            while not (accepted.connected and refused.last_error) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert accepted.health().ok
            health = refused.health()
            assert not health.ok and "refused" in health.detail, health
        finally:
            refused.stop()
            accepted.stop()
    finally:
        broker.stop()


def test_device_commands_are_refused_unless_the_config_allows_them(line: Line, broker: Broker, host: Host,
                                                                    tmp_path: Path) -> None:
    n = make_node(line, broker, tmp_path, device_commands=False)
    n.start()
    try:
        i, _ = host.wait(is_("DBIRTH", "st1"))
        host.command(topic("DCMD", "st1"), [("PartId", spb.STRING, "X-1"), ("Trigger", spb.BOOLEAN, True)])
        deadline = time.monotonic() + 10
        while n.counters["refused_commands"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert n.counters["refused_commands"] == 1 and n.counters["triggers"] == 0
        assert line.station.signals().inspection_seq == 0  # nothing was triggered
        host.command(topic("NCMD"), [(spb.REBIRTH, spb.BOOLEAN, True)])  # node control is still obeyed
        host.wait(is_("NBIRTH"), after=i + 1)
    finally:
        n.stop()



# ---- Trigger and ResultAck are edges, as on OPC UA and Modbus (docs/line-io.md, Sparkplug B) ----------------

def until(pred: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def decided_jobs(line: Line, n: int) -> Callable[[], bool]:
    return lambda: line.station.signals().buffer_count == n


def commands_done(node: SparkplugNode, host: Host, n: int) -> None:
    """Wait until the node has taken `n` commands in all: paho hands them over one at a time, in order, so
    every earlier command has been applied when a later one is counted; then let a write it began land."""
    host.command(topic("DCMD", "st1"), [("TriggerEnable", spb.BOOLEAN, True)])  # no change: a marker
    deadline = time.monotonic() + 10
    while node.counters["commands"] < n + 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert node.counters["commands"] >= n + 1
    time.sleep(0.5)  # a trigger or ack the earlier command started is durable by then


def test_a_redelivered_trigger_true_makes_one_job_not_two(node: SparkplugNode, host: Host, line: Line,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    # Each Trigger=true was a trigger: the same DCMD delivered again (QoS 1 redelivery, a host that
    # republishes) made a second job for the one part once the first one's frame was taken.
    i, _msg = host.wait(is_("DBIRTH", "st1"))
    trigger = spb.payload(None, [("PartId", spb.STRING, "OK-1"), ("Trigger", spb.BOOLEAN, True)])
    host.client.publish(topic("DCMD", "st1"), trigger, qos=1).wait_for_publish(5)
    host.wait(lambda t, m: t == topic("DDATA", "st1") and m.get("ResultValid") is True, i)
    host.client.publish(topic("DCMD", "st1"), trigger, qos=1).wait_for_publish(5)  # the same bytes again
    host.command(topic("DCMD", "st1"), [("PartId", spb.STRING, "OK-2"), ("Trigger", spb.BOOLEAN, True)])
    commands_done(node, host, 3)
    counters = line.station.health().counters
    assert counters["triggers"] == 1 and counters["refused"] == 0, counters
    assert node.counters["triggers"] == 1 and node.counters["repeated_commands"] == 2
    assert "wrote true while it was already true: ignored" in caplog.text  # a level-writing host hears why
    assert line.station.signals().inspection_seq == 1 and node.devices["st1"].last_refusal == ""
    # The host sees the level the node holds: Trigger stays true until the host drops it.
    seen = {k: v for t, m, _s, _q in host.messages[i + 1:] if t == topic("DDATA", "st1") for k, v in m.items()}
    assert seen["Trigger"] is True and seen["TriggerAck"] is True


def test_a_redelivered_result_ack_does_not_ack_the_next_job(node: SparkplugNode, host: Host, line: Line) -> None:
    # Each ResultAck=true was an ack of whatever the FIFO head was: the same DCMD delivered again once the
    # first ack was durable took the next part's result away before anyone read it.
    i, _msg = host.wait(is_("DBIRTH", "st1"))
    host.command(topic("DCMD", "st1"), [("PartId", spb.STRING, "OK-1"), ("Trigger", spb.BOOLEAN, True)])
    host.wait(lambda t, m: t == topic("DDATA", "st1") and m.get("ResultValid") is True, i)
    host.command(topic("DCMD", "st1"), [("Trigger", spb.BOOLEAN, False)])
    host.command(topic("DCMD", "st1"), [("PartId", spb.STRING, "NOK-2"), ("Trigger", spb.BOOLEAN, True)])
    deadline = time.monotonic() + 10
    while line.station.signals().buffer_count < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert line.station.signals().buffer_count == 2  # two decided results wait: job 1 at the head
    mark = len(host.messages)
    ack = spb.payload(None, [("ResultAck", spb.BOOLEAN, True)])
    host.client.publish(topic("DCMD", "st1"), ack, qos=1).wait_for_publish(5)
    host.wait(lambda t, m: t == topic("DDATA", "st1") and m.get("InspectionSeq") == 2, mark)  # job 2 shown
    host.client.publish(topic("DCMD", "st1"), ack, qos=1).wait_for_publish(5)  # the same bytes again
    commands_done(node, host, 5)
    s = line.station.signals()
    assert line.station.health().counters["acks"] == 1
    assert (s.result_valid, s.inspection_seq, s.part_id, s.buffer_count) == (True, 2, "NOK-2", 1)
    assert node.counters["acks"] == 1 and node.counters["repeated_commands"] == 1


def test_trigger_and_result_ack_going_false_then_true_make_the_next_job_and_ack(node: SparkplugNode, host: Host,
                                                                                line: Line) -> None:
    def decided(seq: int) -> Callable[[], bool]:
        return lambda: (line.station.signals().inspection_seq, line.station.signals().result_valid) == (seq, True)

    host.wait(is_("DBIRTH", "st1"))
    for n, part in enumerate(("OK-1", "NOK-2", "OK-3"), start=1):
        host.command(topic("DCMD", "st1"), [("PartId", spb.STRING, part), ("Trigger", spb.BOOLEAN, True)])
        until(decided(n))
        host.command(topic("DCMD", "st1"), [("Trigger", spb.BOOLEAN, False), ("ResultAck", spb.BOOLEAN, True)])
        until(lambda: not line.station.signals().result_valid)
        host.command(topic("DCMD", "st1"), [("ResultAck", spb.BOOLEAN, False)])
    commands_done(node, host, 9)
    counters = line.station.health().counters
    assert (counters["triggers"], counters["acks"], counters["results_ok"], counters["results_nok"]) == (3, 3, 2, 1)
    assert node.counters["repeated_commands"] == 0 and line.station.signals().inspection_seq == 3


def test_a_birth_shows_the_trigger_and_ack_levels_the_node_holds(node: SparkplugNode, host: Host) -> None:
    # A DBIRTH always said Trigger=false: after a rebirth with Trigger held, a host that believed it and
    # wrote true would see nothing happen (not an edge). The birth carries the held levels instead.
    i, (_t, dbirth, _s, _q) = host.wait(is_("DBIRTH", "st1"))
    assert (dbirth["Trigger"], dbirth["ResultAck"]) == (False, False)
    host.command(topic("DCMD", "st1"), [("PartId", spb.STRING, "OK-1"), ("Trigger", spb.BOOLEAN, True)])
    host.wait(lambda t, m: t == topic("DDATA", "st1") and m.get("Trigger") is True, i)
    host.command(topic("NCMD"), [(spb.REBIRTH, spb.BOOLEAN, True)])
    _j, (_t, again, _s, _q) = host.wait(is_("DBIRTH", "st1"), i + 1)
    assert (again["Trigger"], again["ResultAck"]) == (True, False)


def test_an_ack_naming_its_job_is_idempotent_even_when_the_whole_pair_comes_again(node: SparkplugNode, host: Host,
                                                                                 line: Line) -> None:
    # A level alone cannot tell a resent pair (ResultAck true, then false: a host's client resending both
    # after a reconnect) from the next ack. With the job's InspectionSeq the ack is of that job only: once
    # it is acknowledged, the same ack again does nothing, as OPC UA's ResultAck(JobId) answers it again.
    host.wait(is_("DBIRTH", "st1"))
    for n, part in enumerate(("OK-1", "NOK-2"), start=1):
        host.command(topic("DCMD", "st1"), [("PartId", spb.STRING, part), ("Trigger", spb.BOOLEAN, True)])
        until(decided_jobs(line, n))  # the next trigger only once this one is taken (else: `busy`)
        host.command(topic("DCMD", "st1"), [("Trigger", spb.BOOLEAN, False)])
    mark = len(host.messages)
    ack = spb.payload(None, [("ResultAck", spb.BOOLEAN, True), ("InspectionSeq", spb.UINT64, 1)])
    drop = spb.payload(None, [("ResultAck", spb.BOOLEAN, False)])
    for body in (ack, drop):
        host.client.publish(topic("DCMD", "st1"), body, qos=1).wait_for_publish(5)
    host.wait(lambda t, m: t == topic("DDATA", "st1") and m.get("InspectionSeq") == 2, mark)  # job 2 shown
    for body in (ack, drop):  # the pair once more, the same bytes
        host.client.publish(topic("DCMD", "st1"), body, qos=1).wait_for_publish(5)
    host.command(topic("DCMD", "st1"), [("ResultAck", spb.BOOLEAN, True), ("InspectionSeq", spb.UINT64, 7)])
    commands_done(node, host, 9)
    s = line.station.signals()
    assert line.station.health().counters["acks"] == 1
    assert (s.result_valid, s.inspection_seq, s.buffer_count) == (True, 2, 1)
    assert node.counters["refused_commands"] == 0 and node.counters["unmatched_acks"] == 1  # job 7: not shown
    assert node.counters["repeated_commands"] == 1  # job 1's ack again
    # The job id is the edge: job 2's ack acts while ResultAck is still true (from job 7's ack).
    host.command(topic("DCMD", "st1"), [("ResultAck", spb.BOOLEAN, True), ("InspectionSeq", spb.UINT64, 2)])
    until(lambda: line.station.health().counters["acks"] == 2 and not line.station.signals().result_valid)


def test_an_inspection_seq_without_result_ack_is_refused(node: SparkplugNode, host: Host, line: Line) -> None:
    host.wait(is_("DBIRTH", "st1"))
    host.command(topic("DCMD", "st1"), [("InspectionSeq", spb.UINT64, 1)])
    host.command(topic("DCMD", "st1"), [("ResultAck", spb.BOOLEAN, True), ("InspectionSeq", spb.BOOLEAN, True)])
    until(lambda: node.counters["refused_commands"] == 2)
    assert node.counters["acks"] == 0 and line.station.health().counters["acks"] == 0
