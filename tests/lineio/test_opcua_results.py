"""What an OPC UA subscriber sees of the results, through a real asyncua client (SignAndEncrypt, user
plc) subscribed with a publishing interval of 0 (the server publishes each change as it is written):
one snapshot of the station is written node by node, and a job shown valid never carries another
job's Result, DefectCode or PartId, nor a new job's TriggerAck the job before's AcquisitionDone."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from asyncua import ua
from asyncua.common.subscription import Subscription

from edge_runtime.core.result import Result
from edge_runtime.lineio.opcua.server import NAMESPACE
from edge_runtime.lineio.signals import JobRequest
from tests.support.opcua_asyncua import Served, client
from tests.support.waiting import wait_for

WATCHED = ["ResultValid", "InspectionSeq", "PartId", "Result", "DefectCode"]


def _record_batches(monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[int, Any]]]:
    """Each PublishResponse the client gets, as (client handle, value) pairs: one moment of the server's
    address space each."""
    batches: list[list[tuple[int, Any]]] = []
    publish = Subscription.publish_callback

    async def recorded(self: Subscription, result: ua.PublishResult) -> None:
        batch = [(m.ClientHandle, m.Value.Value.Value) for n in result.NotificationMessage.NotificationData or []
                 for m in getattr(n, "MonitoredItems", None) or []]
        if batch:
            batches.append(batch)
        await publish(self, result)
    monkeypatch.setattr(Subscription, "publish_callback", recorded)
    return batches


class _Quiet:
    def datachange_notification(self, node: Any, val: Any, data: Any) -> None:
        return None


async def _subscribe_at_once(c: Any, idx: int, watched: list[str]) -> dict[int, str]:
    """Subscribe to the station's `watched` nodes at publishing interval 0 (each write sent on its own);
    returns each monitored item's handle -> node name."""
    nodes = [c.get_node(f"ns={idx};s=st1.{name}") for name in watched]
    sub = await c.create_subscription(0, _Quiet())
    await sub.subscribe_data_change(nodes, queuesize=100)
    ids = [n.nodeid for n in nodes]
    return {handle: watched[ids.index(item.node.nodeid)] for handle, item in sub._monitored_items.items()
            if item.node is not None}


def _views(batches: list[list[tuple[int, Any]]], names: dict[int, str]) -> Iterator[dict[str, Any]]:
    """What the subscriber knows after each notification batch: every watched node's latest value."""
    view: dict[str, Any] = {}
    for batch in batches:
        for handle, value in batch:
            view[names[handle]] = value
        yield view


def test_a_subscriber_never_sees_a_valid_result_with_another_jobs_values(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    batches = _record_batches(monkeypatch)
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
            names = await _subscribe_at_once(c, idx, WATCHED)
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
    shown = set()
    for view in _views(batches, names):
        if view.get("ResultValid"):
            seq = view["InspectionSeq"]
            assert seq in expected, f"ResultValid with job {seq}, which is no job of this test"
            assert (view["PartId"], view["Result"], view["DefectCode"]) == expected[seq], \
                f"job {seq} shown valid with another job's values: {view}"
            shown.add(seq)
    assert shown == set(expected), "every result was seen valid"


def test_a_subscriber_sees_trigger_ack_only_with_the_new_jobs_acquisition_done(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TriggerAck of a new job never shows beside the previous job's AcquisitionDone (still high): a PLC
    that lets the part go on TriggerAck and AcquisitionDone would move it before its frame is taken."""
    batches = _record_batches(monkeypatch)
    served = Served(tmp_path)
    line = served.line
    frames: dict[int, Callable[[], None]] = {}

    def start(job: JobRequest, on_acquired: Callable[[], None]) -> Future[Result]:
        frames[job.seq] = on_acquired  # the frame is taken when the test says
        return Future()
    monkeypatch.setattr(line.station, "_start", start)
    watched = ["TriggerAck", "AcquisitionDone", "InspectionSeq"]

    async def body() -> dict[int, str]:
        c = await client(served.url, cert=served.cert, key=served.key)
        try:
            idx = await c.get_namespace_index(NAMESPACE)
            names = await _subscribe_at_once(c, idx, watched)

            async def write(name: str, value: Any, vtype: ua.VariantType) -> None:
                await c.get_node(f"ns={idx};s=st1.{name}").write_value(ua.Variant(value, vtype))
            for n, part in enumerate(["A", "B", "C", "D"], start=1):
                await write("PartIdIn", part, ua.VariantType.String)
                await write("Trigger", True, ua.VariantType.Boolean)
                await asyncio.to_thread(wait_for, functools.partial(frames.__contains__, n), 10, f"job {n} frame")
                await asyncio.sleep(0.2)  # TriggerAck is out; the frame is not taken yet
                await write("Trigger", False, ua.VariantType.Boolean)  # TriggerAck follows it down
                await asyncio.to_thread(wait_for, lambda: not line.station.signals().trigger_ack, 10, "TriggerAck low")
                await asyncio.sleep(0.1)
                frames[n]()  # only now: while TriggerAck was high, this job's AcquisitionDone was low
                await asyncio.to_thread(wait_for, lambda: line.station.signals().ready, 10, "ready again")
            return names
        finally:
            with contextlib.suppress(Exception):
                await c.disconnect()

    try:
        names = asyncio.run(body())
    finally:
        served.close()
    acked = set()
    for view in _views(batches, names):
        if view.get("TriggerAck"):
            acked.add(view["InspectionSeq"])
            # Each frame was taken after its TriggerAck fell: AcquisitionDone high beside it is the job before's.
            assert not view["AcquisitionDone"], f"TriggerAck with the previous job's AcquisitionDone: {view}"
    assert acked == {1, 2, 3, 4}, "TriggerAck shown with another job's InspectionSeq"
