"""What an OPC UA client sees when our server restarts: a real asyncua client with auto_reconnect
(SignAndEncrypt, a user), subscribed by node id to data changes and to ResultReady events, keeps
those node ids across the restart, re-creates its subscription by them and gets notifications again
without browsing. The restarted server lists another station first (a changed config), so a node id
that came from creation order would have moved."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncua import Client, ua

from edge_runtime.config.line_protocols import OpcUaConfig
from edge_runtime.lineio.opcua.server import NAMESPACE, OpcUaServer
from edge_runtime.lineio.passwords import hash_password
from edge_runtime.lineio.signals import LineOutcome
from edge_runtime.lineio.station import Station
from tests.support.line_station import Line
from tests.support.mjpeg import free_port
from tests.support.opcua_peer import client_certificate, trust
from tests.support.waiting import wait_for

CLIENT_URI = "urn:test:asyncua-plc"
SERVER_URI = "urn:test-device:edge-runtime"
HASH = hash_password("secret")


def serve(stations: list[Station], port: int, pki: Path) -> OpcUaServer:
    cfg = OpcUaConfig(enabled=True, port=port, users=[{"name": "plc", "password_hash": HASH}])
    server = OpcUaServer(stations, cfg, pki, SERVER_URI)
    server.start()
    wait_for(lambda: server.listening, timeout=30, what="OPC UA server")
    return server


class Handler:
    """The client's notifications, as they come."""

    def __init__(self) -> None:
        self.changes: list[tuple[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.status: list[Any] = []

    def datachange_notification(self, node: Any, val: Any, data: Any) -> None:
        self.changes.append((node.nodeid.Identifier, val))

    def event_notification(self, event: Any) -> None:
        self.events.append({k: v.Value for k, v in event.get_event_props_as_fields_dict().items()})

    def status_change_notification(self, status: Any) -> None:
        self.status.append(status)


async def until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def namespace_ids(server: OpcUaServer) -> dict[str, str]:
    """Every node of our namespace: node id string -> browse name, as the server holds them."""
    space = server._server.iserver.aspace
    idx = next(n.NamespaceIndex for n in space._nodes if n.Identifier == "EdgeRuntime")
    return {nid.to_string(): data.attributes[ua.AttributeIds.BrowseName].value.Value.Value.Name
            for nid, data in space._nodes.items() if nid.NamespaceIndex == idx}


def test_node_ids_are_strings_and_stay_the_same_when_the_config_adds_a_station(tmp_path: Path) -> None:
    st1 = Line(tmp_path, name="st1").start()
    other = Line(tmp_path, name="aaa").start()
    pki = tmp_path / "pki"
    try:
        server = serve([st1.station], free_port(), pki)
        first = namespace_ids(server)
        server.stop()
        server = serve([other.station, st1.station], free_port(), pki)  # a station more, listed first
        second = namespace_ids(server)
        server.stop()
    finally:
        st1.stop()
        other.stop()
    numeric = [n for n in second if ";i=" in n]
    assert numeric == [], f"node ids from creation order: {numeric}"
    assert {n: b for n, b in second.items() if "aaa" not in n} == first, "st1's and the shared ids moved"
    assert "ns=2;s=ResultReadyEventType" in first and "ns=2;s=st1.StartSingleJob.InputArguments" in first


def test_an_auto_reconnecting_asyncua_client_gets_notifications_again_after_a_server_restart(tmp_path: Path) -> None:
    st1 = Line(tmp_path, name="st1", auto=lambda job: job.part_id.startswith("NOK")).start()
    other = Line(tmp_path, name="aaa").start()
    port = free_port()
    pki = tmp_path / "pki"
    cert, key = client_certificate(tmp_path / "plc", CLIENT_URI)
    trust(pki, cert)
    servers = [serve([st1.station], port, pki)]

    def restart() -> OpcUaServer:
        servers.append(serve([other.station, st1.station], port, pki))
        return servers[-1]
    try:
        asyncio.run(_client_across_restart(port, cert, key, servers[0].stop, restart))
    finally:
        for server in servers:  # the restarted one too: it ran on into the next modules
            server.stop()
        st1.stop()
        other.stop()


async def _client_across_restart(port: int, cert: Path, key: Path,
                                 stop: Callable[[], None], start: Callable[[], OpcUaServer]) -> None:
    client = Client(f"opc.tcp://127.0.0.1:{port}/edge-runtime/", timeout=5, watchdog_intervall=0.5)
    client.application_uri = CLIENT_URI
    await client.set_security_string(f"Basic256Sha256,SignAndEncrypt,{cert},{key}")
    client.set_user("plc")
    client.set_password("secret")
    await client.connect(auto_reconnect=True, reconnect_max_delay=1.0)
    try:
        # Once, at connect: the namespace index from its URI; from here on only node ids, no browsing.
        idx = await client.get_namespace_index(NAMESPACE)

        def nid(name: str) -> ua.NodeId:
            return ua.NodeId.from_string(f"ns={idx};s={name}")

        def node(name: str) -> Any:
            return client.get_node(nid(f"st1.{name}" if name else "st1"))
        handler = Handler()
        sub = await client.create_subscription(20, handler)
        await sub.subscribe_data_change([node("ResultValid"), node("InspectionSeq")])
        await sub.subscribe_events(node(""), client.get_node(nid("ResultReadyEventType")))

        async def job(part: str) -> int:
            seq = int(await node("").call_method(nid("st1.StartSingleJob"), part, ""))
            await until(lambda: any(e.get("JobId") == seq for e in handler.events), 10,
                        f"the event of {part} (events: {handler.events}, changes: {handler.changes})")
            await until(lambda: ("st1.InspectionSeq", seq) in handler.changes, 10, f"InspectionSeq {seq}")
            assert await node("").call_method(nid("st1.ResultAck"),
                                              ua.Variant(seq, ua.VariantType.UInt32)) is True
            return seq

        first = await job("OK-1")
        event = next(e for e in handler.events if e.get("JobId") == first)
        assert (event["PartId"], event["Result"], event["Station"]) == ("OK-1", int(LineOutcome.OK), "st1")

        stop()  # the daemon restarts: every session and subscription on the server is gone
        await asyncio.sleep(1.0)
        start()
        changes_before = len(handler.changes)
        # The client reconnects by itself and re-creates its subscription with the same node ids; the
        # subscription's first publish brings the current values again.
        await until(lambda: any(n == "st1.ResultValid" for n, _ in handler.changes[changes_before:]), 30,
                    "the re-created subscription's first data change")
        second = await job("NOK-2")
        assert second == first + 1
        event = next(e for e in handler.events if e.get("JobId") == second)
        assert (event["PartId"], event["Result"]) == ("NOK-2", int(LineOutcome.NOK))
    finally:
        await client.disconnect()
