"""What an OPC UA subscriber sees of the results, through a real asyncua client (SignAndEncrypt, user
plc) subscribed with a publishing interval of 0 (the server publishes each change as it is written):
one snapshot of the station is written node by node, and a job shown valid never carries another
job's Result, DefectCode or PartId."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from pathlib import Path
from typing import Any

import pytest
from asyncua import ua
from asyncua.common.subscription import Subscription

from edge_runtime.lineio.opcua.server import NAMESPACE
from tests.support.opcua_asyncua import Served, client
from tests.support.waiting import wait_for

WATCHED = ["ResultValid", "InspectionSeq", "PartId", "Result", "DefectCode"]


class _Quiet:
    def datachange_notification(self, node: Any, val: Any, data: Any) -> None:
        return None


def test_a_subscriber_never_sees_a_valid_result_with_another_jobs_values(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each PublishResponse is one moment of the server's address space: record them as they come.
    batches: list[list[tuple[int, Any]]] = []
    publish = Subscription.publish_callback

    async def recorded(self: Subscription, result: ua.PublishResult) -> None:
        batch = [(m.ClientHandle, m.Value.Value.Value) for n in result.NotificationMessage.NotificationData or []
                 for m in getattr(n, "MonitoredItems", None) or []]
        if batch:
            batches.append(batch)
        await publish(self, result)
    monkeypatch.setattr(Subscription, "publish_callback", recorded)

    served = Served(tmp_path)
    line = served.line
    line.auto = None  # the test gives each verdict
    parts = {"A": False, "B": True, "C": False, "D": True, "E": True, "F": False}  # defect: NOK
    expected: dict[int, tuple[str, int, int]] = {}  # seq -> (part, Result, DefectCode)

    def shows(seq: int) -> bool:
        s = line.station.signals()
        return s.result_valid and s.inspection_seq == seq

    async def body() -> dict[int, str]:
        c = await client(served.url, cert=served.cert, key=served.key)
        try:
            idx = await c.get_namespace_index(NAMESPACE)
            nodes = [c.get_node(f"ns={idx};s=st1.{name}") for name in WATCHED]
            sub = await c.create_subscription(0, _Quiet())
            await sub.subscribe_data_change(nodes, queuesize=100)
            ids = [n.nodeid for n in nodes]
            names = {handle: WATCHED[ids.index(item.node.nodeid)] for handle, item in sub._monitored_items.items()
                     if item.node is not None}
            station = c.get_node(f"ns={idx};s=st1")
            for part, defect in parts.items():
                seq = int(await station.call_method(f"{idx}:StartSingleJob", part, ""))
                expected[seq] = (part, 2 if defect else 1, 1 if defect else 0)
            await asyncio.to_thread(wait_for, lambda: len(line.pending) == len(parts), 10, "every frame")
            for seq in sorted(expected, reverse=True):  # the last first: each waits behind the one before
                line.verdict(seq, parts[expected[seq][0]])
            for seq in sorted(expected):
                await asyncio.to_thread(wait_for, functools.partial(shows, seq), 10, f"job {seq} shown")
                await asyncio.sleep(0.1)  # its notifications are out
                assert await station.call_method(f"{idx}:ResultAck", ua.Variant(seq, ua.VariantType.UInt32))
            await asyncio.sleep(0.3)
            return names
        finally:
            with contextlib.suppress(Exception):
                await c.disconnect()

    try:
        names = asyncio.run(body())
    finally:
        served.close()
    view: dict[str, Any] = {}
    shown = set()
    for batch in batches:
        for handle, value in batch:
            view[names[handle]] = value
        if view.get("ResultValid"):
            seq = view["InspectionSeq"]
            assert seq in expected, f"ResultValid with job {seq}, which is no job of this test"
            assert (view["PartId"], view["Result"], view["DefectCode"]) == expected[seq], \
                f"job {seq} shown valid with another job's values: {view}"
            shown.add(seq)
    assert shown == set(expected), "every result was seen valid"
