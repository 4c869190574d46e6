"""What the line writes and calls over OPC UA, through a real asyncua client (SignAndEncrypt, user plc):
LastRefusal says why the last trigger was refused and is empty again after an accepted one; a write
to an input with a status other than Good is refused with a Bad status and changes nothing (asyncua
passed it on as a null value, which turned TriggerEnable off)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from asyncua import Client, ua

from edge_runtime.lineio.opcua.server import NAMESPACE
from tests.support.opcua_asyncua import Served, client, status_name


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    s = Served(tmp_path_factory.mktemp("opcua-inputs"))
    yield s
    s.close()


async def _with_plc(served: Served, body: Any) -> Any:
    c = await client(served.url, cert=served.cert, key=served.key)
    try:
        idx = await c.get_namespace_index(NAMESPACE)
        return await body(c, lambda name: c.get_node(f"ns={idx};s=st1{'.' + name if name else ''}"), idx)
    finally:
        with contextlib.suppress(Exception):
            await c.disconnect()


def test_last_refusal_is_cleared_by_the_next_accepted_trigger(served: Served) -> None:
    async def body(c: Client, node: Any, idx: int) -> tuple[str, str, str, str]:
        async def last_refusal(expect_empty: bool) -> str:
            for _ in range(100):  # written on the server's loop just after the answer
                text = str(await node("LastRefusal").read_value())
                if (text == "") == expect_empty:
                    return text
                await asyncio.sleep(0.02)
            return str(await node("LastRefusal").read_value())

        with pytest.raises(ua.UaStatusCodeError) as refused:
            await node("").call_method(f"{idx}:StartSingleJob", "bad\x01part", "")
        after_refusal = await last_refusal(expect_empty=False)
        seq = await node("").call_method(f"{idx}:StartSingleJob", "GOOD-1", "")
        after_method = await last_refusal(expect_empty=True)
        # The same over the Trigger variable: refused (a bad part id), then accepted.
        await node("PartIdIn").write_value(ua.Variant("bad\x01part", ua.VariantType.String))
        await node("Trigger").write_value(ua.Variant(True, ua.VariantType.Boolean))
        after_write_refusal = await last_refusal(expect_empty=False)
        await node("Trigger").write_value(ua.Variant(False, ua.VariantType.Boolean))
        await node("").call_method(f"{idx}:ResultAck", ua.Variant(int(seq), ua.VariantType.UInt32))
        await node("PartIdIn").write_value(ua.Variant("GOOD-2", ua.VariantType.String))
        await node("Trigger").write_value(ua.Variant(True, ua.VariantType.Boolean))
        after_write = await last_refusal(expect_empty=True)
        await node("Trigger").write_value(ua.Variant(False, ua.VariantType.Boolean))
        assert status_name(refused.value) == "BadInvalidArgument"
        return after_refusal, after_method, after_write_refusal, after_write

    refusal, cleared, write_refusal, write_cleared = asyncio.run(_with_plc(served, body))
    assert refusal.startswith("bad_part_id") and write_refusal.startswith("bad_part_id")
    assert cleared == "" and write_cleared == ""


def test_a_trigger_enable_write_with_a_bad_status_is_refused_and_changes_nothing(served: Served) -> None:
    station = served.line.station
    assert station.signals().trigger_enable

    async def body(c: Client, node: Any, idx: int) -> tuple[str, str, bool]:
        bad = ua.DataValue(ua.Variant(False, ua.VariantType.Boolean),
                           StatusCode=ua.StatusCode(ua.UInt32(ua.StatusCodes.BadSensorFailure)))
        uncertain = ua.DataValue(ua.Variant(False, ua.VariantType.Boolean),
                                 StatusCode=ua.StatusCode(ua.UInt32(ua.StatusCodes.UncertainLastUsableValue)))
        answers = []
        for value in (bad, uncertain):
            with pytest.raises(ua.UaStatusCodeError) as refused:
                await node("TriggerEnable").write_value(value)
            answers.append(status_name(refused.value))
        return answers[0], answers[1], bool(await node("TriggerEnable").read_value())

    bad, uncertain, shown = asyncio.run(_with_plc(served, body))
    assert (bad, uncertain) == ("BadWriteNotSupported", "BadWriteNotSupported")
    assert station.signals().trigger_enable and station.signals().ready and shown  # nothing changed


def test_inputs_with_a_bad_status_do_not_trigger(served: Served) -> None:
    jobs = served.jobs()

    async def body(c: Client, node: Any, idx: int) -> str:
        bad = ua.DataValue(ua.Variant(True, ua.VariantType.Boolean),
                           StatusCode=ua.StatusCode(ua.UInt32(ua.StatusCodes.BadCommunicationError)))
        with pytest.raises(ua.UaStatusCodeError) as refused:
            await node("Trigger").write_value(bad)
        return status_name(refused.value)

    assert asyncio.run(_with_plc(served, body)) == "BadWriteNotSupported"
    assert served.jobs() == jobs


def test_an_array_written_to_an_input_is_refused_and_changes_nothing(served: Served) -> None:
    # The inputs are scalars, but asyncua took an array of the right type: `[False]` written to Trigger
    # is truthy, so it started a job; to TriggerEnable it left the line enabled (and the node held the array).
    station = served.line.station
    jobs = served.jobs()
    assert station.signals().trigger_enable

    async def body(c: Client, node: Any, idx: int) -> tuple[list[str], bool, bool]:
        answers = []
        for name, value in (("Trigger", [False]), ("Trigger", [True]), ("TriggerEnable", [False]),
                            ("ResultAckIn", [True]), ("PartIdIn", ["P-1"])):
            vtype = ua.VariantType.String if name == "PartIdIn" else ua.VariantType.Boolean
            with pytest.raises(ua.UaStatusCodeError) as refused:
                await node(name).write_value(ua.Variant(value, vtype))
            answers.append(status_name(refused.value))
        return answers, await node("Trigger").read_value(), await node("TriggerEnable").read_value()

    answers, trigger, enable = asyncio.run(_with_plc(served, body))
    assert answers == ["BadTypeMismatch"] * 5
    assert trigger is False and enable is True  # the nodes keep their scalar values
    assert served.jobs() == jobs and station.signals().trigger_enable
