"""One station behind the real OPC UA server, and asyncua clients driven as a PLC or an attacker would
(an attacker's client does not refuse what the stock client refuses by itself: `lenient_client`)."""

from __future__ import annotations

import contextlib
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from asyncua import Client, ua
from asyncua.crypto.security_policies import SecurityPolicyNone

from edge_runtime.config.line_protocols import OpcUaConfig
from edge_runtime.lineio.opcua.server import NAMESPACE, OpcUaServer
from edge_runtime.lineio.passwords import hash_password
from tests.support.line_station import Line
from tests.support.mjpeg import free_port
from tests.support.opcua_peer import client_certificate, trust
from tests.support.waiting import wait_for

CLIENT_URI = "urn:test:asyncua-plc"
SERVER_URI = "urn:test-device:edge-runtime"
PASSWORD = "secret"
HASH = hash_password(PASSWORD)


class Served:
    """Station `st1` (every verdict OK at once) on its own job store, served over OPC UA with user `plc`
    and one trusted client certificate."""

    def __init__(self, tmp: Path, **cfg: Any) -> None:
        self.tmp = tmp
        self.line = Line(tmp, name="st1", auto=lambda job: False).start()
        self.port = free_port()
        self.pki = tmp / "pki"
        self.cert, self.key = client_certificate(tmp / "plc-cert", CLIENT_URI)
        trust(self.pki, self.cert)
        opc = OpcUaConfig.model_validate({"enabled": True, "port": self.port,
                                          "users": [{"name": "plc", "password_hash": HASH}], **cfg})
        self.server = OpcUaServer([self.line.station], opc, self.pki, SERVER_URI)
        self.server.start()
        wait_for(lambda: self.server.listening, timeout=30, what="OPC UA server")

    @property
    def url(self) -> str:
        return f"opc.tcp://127.0.0.1:{self.port}/edge-runtime/"

    def jobs(self) -> int:
        """The highest job id in the station's line_jobs table (0: no row)."""
        return self.line.jobs.last_seq("st1")

    def activated_sessions(self) -> int:
        iserver = self.server._server.iserver
        return sum(1 for s in list(iserver._external_sessions.values()) if s.is_activated())

    def close(self) -> None:
        self.server.stop()
        self.line.stop()


async def client(url: str, cert: Path | None = None, key: Path | None = None, mode: str = "SignAndEncrypt",
                 user: str | None = "plc", password: str | None = PASSWORD, uri: str = CLIENT_URI) -> Client:
    """A connected asyncua client (raises what the server answered)."""
    c = Client(url, timeout=10)
    c.application_uri = uri
    if cert is not None:
        await c.set_security_string(f"Basic256Sha256,{mode},{cert},{key}")
    if user is not None:
        c.set_user(user)
        c.set_password(password or "")
    try:
        await c.connect()
    except BaseException:
        with contextlib.suppress(Exception):
            await c.disconnect()
        raise
    return c


async def start_job(c: Client, part: str = "P-1") -> int:
    idx = await c.get_namespace_index(NAMESPACE)
    return int(await c.get_node(f"ns={idx};s=st1").call_method(f"{idx}:StartSingleJob", part, ""))


async def job_or_error(url: str, **kw: Any) -> int | BaseException:
    """StartSingleJob's JobId, or the exception that stopped the client on its way there."""
    try:
        c = await client(url, **kw)
    except Exception as exc:  # noqa: BLE001 - the refusal is the answer
        return exc
    try:
        return await start_job(c)
    except Exception as exc:  # noqa: BLE001
        return exc
    finally:
        with contextlib.suppress(Exception):
            await c.disconnect()


def status_name(error: int | BaseException) -> str:
    """The OPC UA status name in an asyncua exception ('' when none)."""
    code = getattr(error, "code", None)
    return ua.StatusCode(ua.UInt32(code)).name if isinstance(code, int) else ""


def lenient_client(monkeypatch: pytest.MonkeyPatch, plain_password: bool = False) -> None:
    """asyncua's client as an attacker's: it takes any endpoint (the stock one refuses a session when the
    server lists no endpoint of its security policy and mode) and, with `plain_password`, sends the
    password in clear whatever the endpoint asks."""
    find = Client.find_endpoint

    def any_endpoint(endpoints: Any, mode: ua.MessageSecurityMode, uri: str) -> ua.EndpointDescription:
        try:
            return find(endpoints, mode, uri)
        except ua.UaError:
            return ua.EndpointDescription(UserIdentityTokens=[ua.UserTokenPolicy(
                PolicyId="username", TokenType=ua.UserTokenType.UserName, SecurityPolicyUri=SecurityPolicyNone.URI)])
    monkeypatch.setattr(Client, "find_endpoint", staticmethod(any_endpoint))
    if plain_password:
        monkeypatch.setattr(Client, "server_policy", lambda self, token_type: ua.UserTokenPolicy(
            PolicyId="username", TokenType=token_type, SecurityPolicyUri=SecurityPolicyNone.URI))


def server_lines(records: list[logging.LogRecord]) -> list[str]:
    """The server's WARNING and ERROR lines among `records`: not those of the test's own asyncua client,
    which runs in the calling thread (both log under asyncua.*)."""
    me = threading.get_ident()
    return [r.getMessage() for r in records if r.levelno >= logging.WARNING and r.thread != me]

