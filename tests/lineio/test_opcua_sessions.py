"""OPC UA sessions against real asyncua clients: authentication tokens are random, a session is bound to
the secure channel that holds it, and a subscription to its session. Before: tokens were 1000, 1001,
...; a second trusted client that sent the first client's token in an ActivateSession took that
session over (even with a signature that did not verify) and started jobs as it, and any session
could delete or take another's subscriptions by their ids 1, 2, ...."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from asyncua import Client, ua

from edge_runtime.lineio.opcua.guard import Refusals
from edge_runtime.lineio.opcua.server import NAMESPACE
from tests.support.cut_proxy import CutProxy
from tests.support.opcua_asyncua import CLIENT_URI, PASSWORD, Served, client, server_lines, status_name
from tests.support.opcua_peer import client_certificate, trust
from tests.support.waiting import wait_for

OTHER_URI = "urn:test:other-plc"


class Plant(Served):
    """The served station with a second trusted client certificate (another PLC on the line)."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.other_cert, self.other_key = client_certificate(tmp / "other-plc", OTHER_URI)
        trust(self.pki, self.other_cert)


@pytest.fixture(scope="module")
def plant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plant]:
    p = Plant(tmp_path_factory.mktemp("opcua-sessions"))
    yield p
    p.close()


@pytest.fixture
def served(plant: Plant) -> Plant:
    plant.server.door.refusals = Refusals()  # each test sees its refusals' first line
    return plant


class Beats:
    """A client's data changes of st1.Heartbeat (one a second while the station runs)."""

    def __init__(self) -> None:
        self.values: list[Any] = []

    def datachange_notification(self, node: Any, val: Any, data: Any) -> None:
        self.values.append(val)


async def heartbeat_subscription(c: Client) -> tuple[Any, Beats]:
    idx = await c.get_namespace_index(NAMESPACE)
    beats = Beats()
    sub = await c.create_subscription(50, beats)
    await sub.subscribe_data_change(c.get_node(f"ns={idx};s=st1.Heartbeat"))
    return sub, beats


async def beats_again(beats: Beats, timeout: float = 5.0) -> None:
    """A new heartbeat reaches the subscription."""
    seen, end = len(beats.values), asyncio.get_running_loop().time() + timeout
    while len(beats.values) <= seen:
        assert asyncio.get_running_loop().time() < end, "the subscription got no heartbeat"
        await asyncio.sleep(0.05)


async def channel_only(served: Plant, cert: Path, key: Path, uri: str) -> Client:
    """A client with a secure channel of its own and no session."""
    c = Client(served.url, timeout=10)
    c.application_uri = uri
    await c.set_security_string(f"Basic256Sha256,SignAndEncrypt,{cert},{key}")
    await c.connect_sessionless()
    return c


async def with_token(c: Client, token: ua.NodeId, nonce: bytes | None = None, user: str | None = "plc",
                     password: str = PASSWORD) -> str:
    """ActivateSession with another client's token (and last server nonce): the status name ('' if accepted)."""
    c.uaclient.session.restore_authentication_token(token)
    c._server_nonce = nonce  # type: ignore[assignment]  # asyncua types it None until a session exists
    return await answer(lambda: c.activate_session(username=user, password=password if user else None))


async def answer(call: Callable[[], Awaitable[Any]]) -> str:
    """'' when the call went through, else the OPC UA status name it was refused with."""
    try:
        await call()
    except Exception as exc:  # noqa: BLE001 - the refusal is the answer
        return status_name(exc) or repr(exc)
    return ""


async def job(c: Client, idx: int) -> int:
    return int(await c.get_node(f"ns={idx};s=st1").call_method(f"{idx}:StartSingleJob", "P-1", ""))


async def ack(c: Client, idx: int, seq: int) -> bool:
    """ResultAck of job `seq` once its verdict is valid (false until then)."""
    end = asyncio.get_running_loop().time() + 5.0
    while True:
        if await c.get_node(f"ns={idx};s=st1").call_method(f"{idx}:ResultAck", ua.Variant(seq, ua.VariantType.UInt32)):
            return True
        if asyncio.get_running_loop().time() > end:
            return False
        await asyncio.sleep(0.02)


async def drop(c: Client) -> None:
    """Close the channel and socket without a CloseSession (its token may be another client's)."""
    with contextlib.suppress(Exception):
        await c.close_secure_channel()
    c.disconnect_socket()


def test_session_tokens_are_32_random_bytes_not_a_sequence(served: Plant) -> None:
    async def tokens() -> list[ua.NodeId]:
        clients = [await client(served.url, cert=served.cert, key=served.key) for _ in range(3)]
        try:
            return [c.uaclient.session.authentication_token for c in clients]
        finally:
            for c in clients:
                await c.disconnect()
    got = asyncio.run(tokens())
    assert all(t.NodeIdType == ua.NodeIdType.ByteString for t in got), got
    raw = [bytes(t.Identifier) for t in got]  # type: ignore[arg-type]  # a ByteString NodeId's identifier
    assert all(len(r) == 32 for r in raw) and len(set(raw)) == 3, raw
    # No shared prefix or counter: any two differ in most bytes (random pairs share ~1 of 32).
    for i, a in enumerate(raw):
        for b in raw[i + 1:]:
            assert sum(x == y for x, y in zip(a, b, strict=True)) < 8, (a, b)


def test_a_second_trusted_client_with_the_first_clients_token_gets_no_session_no_job_no_ack(
        served: Plant, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        plc = await client(served.url, cert=served.cert, key=served.key)
        other = await channel_only(served, served.other_cert, served.other_key, OTHER_URI)
        try:
            idx = await plc.get_namespace_index(NAMESPACE)
            _, beats = await heartbeat_subscription(plc)
            seq = await job(plc, idx)  # decided OK at once; its ack is the PLC's
            token, jobs = plc.uaclient.session.authentication_token, served.jobs()
            # The other PLC, trusted and with the right password, activates the first one's session.
            assert await with_token(other, token, plc._server_nonce) == "BadSessionIdInvalid"
            # Its calls with that token: no job, no ack.
            assert await answer(lambda: job(other, idx)) == "BadSecureChannelIdInvalid"
            assert await answer(lambda: ack(other, idx, seq)) == "BadSecureChannelIdInvalid"
            row = served.line.jobs.job("st1", seq)
            assert served.jobs() == jobs and row is not None and row["acked"] is None
            # The first PLC keeps its session, its subscription and its job.
            await beats_again(beats)
            assert await ack(plc, idx, seq) is True
            assert await job(plc, idx) == jobs + 1
            assert await ack(plc, idx, jobs + 1) is True
        finally:
            await drop(other)
            await plc.disconnect()
    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    lines = server_lines(caplog.records)
    assert len(lines) == 1, lines
    assert "session or subscription not its own from 127.0.0.1:" in lines[0], lines
    assert "another client certificate" in lines[0] and "BadSessionIdInvalid" in lines[0], lines
    assert served.server.health().counters["refused_sessions"] == 3


def test_a_request_with_another_sessions_token_on_a_channel_with_its_own_session_is_refused(served: Plant) -> None:
    """asyncua served it as the connection's own session whatever token it carried."""
    async def scenario() -> None:
        plc = await client(served.url, cert=served.cert, key=served.key)
        other = await client(served.url, cert=served.other_cert, key=served.other_key, uri=OTHER_URI)
        try:
            idx = await plc.get_namespace_index(NAMESPACE)
            own, jobs = other.uaclient.session.authentication_token, served.jobs()
            other.uaclient.session.restore_authentication_token(plc.uaclient.session.authentication_token)
            assert await answer(lambda: job(other, idx)) == "BadSecureChannelIdInvalid"
            other.uaclient.session.restore_authentication_token(ua.NodeId(ua.Int32(1000)))  # asyncua's first token
            assert await answer(lambda: job(other, idx)) == "BadSessionIdInvalid"
            assert served.jobs() == jobs
            other.uaclient.session.restore_authentication_token(own)  # its own session still works
            seq = await job(other, idx)
            assert seq == jobs + 1 and await ack(other, idx, seq) is True
        finally:
            await other.disconnect()
            await plc.disconnect()
    asyncio.run(scenario())
    assert served.server.health().counters["refused_sessions"] == 2


def test_the_same_client_back_on_a_new_channel_takes_its_session_only_with_its_password(served: Plant) -> None:
    """OPC UA lets a client move its session to a new channel (after a lost connection): only the same
    client certificate, the same user and that user's password again; a failed try leaves the session
    where it was (asyncua had moved it and its subscriptions before checking the password)."""
    async def scenario() -> None:
        plc = await client(served.url, cert=served.cert, key=served.key)
        idx = await plc.get_namespace_index(NAMESPACE)
        _, beats = await heartbeat_subscription(plc)
        token, jobs = plc.uaclient.session.authentication_token, served.jobs()
        back = await channel_only(served, served.cert, served.key, CLIENT_URI)
        try:
            assert await with_token(back, token, plc._server_nonce, password="wrong") == "BadUserAccessDenied"
            assert await with_token(back, token, plc._server_nonce, user=None) == "BadIdentityChangeNotSupported"
            assert await answer(lambda: job(back, idx)) == "BadSecureChannelIdInvalid"
            assert served.jobs() == jobs
            await beats_again(beats)  # the session and its subscription stayed with the first channel
            assert await job(plc, idx) == jobs + 1 and await ack(plc, idx, jobs + 1) is True
            # With the password: the session moves; the channel it left serves it no more.
            assert await with_token(back, token, plc._server_nonce) == ""
            assert await job(back, idx) == jobs + 2 and await ack(back, idx, jobs + 2) is True
            assert await answer(lambda: job(plc, idx)) == "BadSecureChannelIdInvalid"
            assert served.jobs() == jobs + 2
        finally:
            await drop(plc)
            await back.disconnect()
    asyncio.run(scenario())
    assert served.server.health().counters["refused_sessions"] == 3  # identity change + two calls


def test_another_sessions_subscription_can_be_neither_deleted_nor_taken(served: Plant) -> None:
    async def scenario() -> None:
        plc = await client(served.url, cert=served.cert, key=served.key)
        other = await client(served.url, cert=served.other_cert, key=served.other_key, uri=OTHER_URI)
        try:
            sub, beats = await heartbeat_subscription(plc)
            theirs = sub.subscription_id
            assert await answer(lambda: other.uaclient.delete_subscriptions([theirs])) == "BadSubscriptionIdInvalid"
            params = ua.TransferSubscriptionsParameters(SubscriptionIds=[theirs], SendInitialValues=True)
            assert await answer(lambda: other.uaclient.transfer_subscriptions(params)) == "BadUserAccessDenied"
            await beats_again(beats)  # still the first PLC's
        finally:
            await other.disconnect()
            await plc.disconnect()
    asyncio.run(scenario())


def test_sessions_created_and_never_activated_do_not_pile_up(served: Plant) -> None:
    """asyncua keeps a replaced session that was never activated registered for good (no timeout)."""
    registry = served.server._server.iserver._external_sessions
    before = len(registry)

    async def scenario() -> None:
        c = await channel_only(served, served.cert, served.key, CLIENT_URI)
        try:
            for _ in range(20):
                await c.create_session()
            for _ in range(100):  # the replaced one is closed just after the answer
                if len(registry) == before + 1:
                    break
                await asyncio.sleep(0.02)
            assert len(registry) == before + 1
        finally:
            await drop(c)
    asyncio.run(scenario())
    wait_for(lambda: len(registry) == before, timeout=5, what="the last session closed with its connection")


def test_an_auto_reconnecting_asyncua_client_keeps_its_session_and_subscription_across_a_cut(served: Plant) -> None:
    """asyncua's client, back after a pulled cable, activates its session on the new channel."""
    proxy = CutProxy(served.port)

    async def scenario() -> None:
        c = Client(f"opc.tcp://127.0.0.1:{proxy.port}/edge-runtime/", timeout=5, watchdog_intervall=0.5)
        c.application_uri = CLIENT_URI
        await c.set_security_string(f"Basic256Sha256,SignAndEncrypt,{served.cert},{served.key}")
        c.set_user("plc")
        c.set_password(PASSWORD)
        await c.connect(auto_reconnect=True, reconnect_max_delay=0.5)
        try:
            token = c.uaclient.session.authentication_token
            idx = await c.get_namespace_index(NAMESPACE)
            _, beats = await heartbeat_subscription(c)
            proxy.cut()
            await asyncio.sleep(2.0)
            proxy.restore()
            await beats_again(beats, timeout=20)
            assert c.uaclient.session.authentication_token == token  # the same session, moved
            seq = await job(c, idx)
            assert await ack(c, idx, seq) is True
        finally:
            await c.disconnect()
    try:
        asyncio.run(scenario())
    finally:
        proxy.close()
    assert served.server.health().counters["refused_sessions"] == 0
