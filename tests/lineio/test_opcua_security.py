"""OPC UA with security on, against asyncua clients that do not refuse what the stock client refuses by
itself (a PLC's or an attacker's need not): no session over SecurityPolicy None, none without an
OpenSecureChannel, no password in clear over a channel that does not encrypt, no channel for a
certificate outside the trust list; each refusal one log line naming the peer, and asyncua's own
lines (an ERROR per refused login) tamed. Before: the None channel with user `plc` got a JobId and a
line_jobs row, and nothing was logged."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from asyncua import Client, ua
from asyncua.client.ua_client import UaClient
from asyncua.common.connection import SecureConnection, TransportLimits
from asyncua.crypto.security_policies import SecurityPolicyNone
from asyncua.ua.ua_binary import struct_to_binary, uatcp_to_binary
from cryptography.x509 import load_pem_x509_certificate

from edge_runtime.lineio.opcua.guard import Refusals
from edge_runtime.lineio.opcua.pki import fingerprint
from tests.support.opcua_asyncua import (
    Served,
    job_or_error,
    lenient_client,
    server_lines,
    status_name,
)
from tests.support.opcua_peer import client_certificate

MSG, HEL = cast(ua.MessageType, ua.MessageType.SecureMessage), cast(ua.MessageType, ua.MessageType.Hello)


@pytest.fixture(scope="module")
def plant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    s = Served(tmp_path_factory.mktemp("opcua-security"))  # one server for the module: starting one costs seconds
    yield s
    s.close()


@pytest.fixture
def served(plant: Served) -> Served:
    plant.server.door.refusals = Refusals()  # each test sees its refusal's first line
    return plant


async def endpoints(url: str) -> list[ua.EndpointDescription]:
    return list(await Client(url, timeout=10).connect_and_get_server_endpoints())


def test_a_none_channel_with_the_plc_password_gets_no_session_no_job_and_one_log_line(
        served: Served, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    listed = asyncio.run(endpoints(served.url))
    offered = {(e.SecurityPolicyUri.rsplit("#", 1)[-1], e.SecurityMode.name) for e in listed}
    assert offered == {("Basic256Sha256", "Sign"), ("Basic256Sha256", "SignAndEncrypt")}  # no None endpoint
    lenient_client(monkeypatch)
    jobs = served.jobs()
    with caplog.at_level(logging.WARNING):
        answer = asyncio.run(job_or_error(served.url, user="plc"))  # no certificate: SecurityPolicy None
    assert status_name(answer) == "BadSecurityPolicyRejected", answer
    assert served.jobs() == jobs and served.activated_sessions() == 0
    lines = server_lines(caplog.records)
    assert len(lines) == 1, lines
    assert "SecurityPolicy None from 127.0.0.1:" in lines[0] and "CreateSession" in lines[0], lines
    assert served.server.health().counters["refused_none_policy"] == 1


def test_a_request_sent_without_any_open_secure_channel_is_refused_and_closed(
        served: Served, caplog: pytest.LogCaptureFixture) -> None:
    """A hand-built client: Hello, then CreateSession in a MSG chunk of channel 0 with no OpenSecureChannel
    (asyncua answered it with a session before)."""
    hello = ua.Hello(ReceiveBufferSize=ua.UInt32(65535), SendBufferSize=ua.UInt32(65535),
                     EndpointUrl=ua.String(served.url))
    request = ua.CreateSessionRequest()
    request.Parameters.ClientNonce = b"n" * 32
    request.Parameters.RequestedSessionTimeout = 60_000
    request.Parameters.EndpointUrl = served.url
    chunk = SecureConnection(SecurityPolicyNone(), TransportLimits()).message_to_binary(
        struct_to_binary(request), message_type=MSG, request_id=1)
    jobs = served.jobs()
    with caplog.at_level(logging.WARNING), socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
        sock.sendall(uatcp_to_binary(HEL, hello))
        assert sock.recv(4096)[:3] == b"ACK"
        sock.sendall(chunk)
        answer = sock.recv(65536)
        assert answer[:3] == b"ERR", answer[:64]
        assert int.from_bytes(answer[8:12], "little") == ua.StatusCodes.BadSecureChannelIdInvalid
        assert sock.recv(64) == b""  # closed
    assert served.activated_sessions() == 0 and served.jobs() == jobs
    lines = server_lines(caplog.records)
    assert len(lines) == 1 and "before any secure channel from 127.0.0.1:" in lines[0], lines


def test_a_password_in_clear_over_a_sign_only_channel_is_refused_and_an_encrypted_one_is_not(
        served: Served, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = served.jobs()
    with monkeypatch.context() as patched:
        lenient_client(patched, plain_password=True)
        with caplog.at_level(logging.WARNING):
            answer = asyncio.run(job_or_error(served.url, cert=served.cert, key=served.key, mode="Sign"))
    assert status_name(answer) == "BadSecurityModeInsufficient", answer
    assert served.jobs() == jobs and served.activated_sessions() == 0
    lines = server_lines(caplog.records)
    assert len(lines) == 1 and "password sent in clear from 127.0.0.1:" in lines[0] and "'plc'" in lines[0], lines
    # The stock client on the same Sign-only channel encrypts the password for the server's key: accepted.
    assert asyncio.run(job_or_error(served.url, cert=served.cert, key=served.key, mode="Sign")) == jobs + 1


def test_an_untrusted_certificate_gets_no_channel_no_job_and_one_log_line(
        served: Served, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cert, key = client_certificate(tmp_path / "stranger", "urn:test:stranger")
    jobs, refused = served.jobs(), served.server.health().counters["refused_certificates"]
    with caplog.at_level(logging.WARNING):
        answer = asyncio.run(job_or_error(served.url, cert=cert, key=key, uri="urn:test:stranger"))
    assert status_name(answer) == "BadCertificateUntrusted", answer
    assert served.jobs() == jobs and served.activated_sessions() == 0
    lines = server_lines(caplog.records)
    assert len(lines) == 1, lines
    assert "client certificate from 127.0.0.1:" in lines[0] and "not in the trust list" in lines[0], lines
    assert (served.pki / "rejected" / f"{fingerprint(load_pem_x509_certificate(cert.read_bytes()))[:40]}.der").exists()
    assert served.server.health().counters["refused_certificates"] == refused + 1


def test_a_create_session_that_names_no_certificate_on_a_secure_channel_is_refused(
        served: Served, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """asyncua checked the certificate CreateSession names, and none when it names none."""
    create = UaClient.create_session

    async def unnamed(self: UaClient, params: ua.CreateSessionParameters) -> ua.CreateSessionResult:
        params.ClientCertificate = None
        return await create(self, params)
    monkeypatch.setattr(UaClient, "create_session", unnamed)
    jobs = served.jobs()
    with caplog.at_level(logging.WARNING):
        answer = asyncio.run(job_or_error(served.url, cert=served.cert, key=served.key))
    assert status_name(answer) == "BadCertificateInvalid", answer
    assert served.jobs() == jobs and served.activated_sessions() == 0
    assert len(server_lines(caplog.records)) == 1


def test_a_flood_of_wrong_passwords_is_logged_once_and_asyncua_stays_quiet(
        served: Served, caplog: pytest.LogCaptureFixture) -> None:
    """asyncua logged an ERROR for every refused login (47 lines for 42 refusals)."""
    jobs = served.jobs()
    with caplog.at_level(logging.WARNING):
        for i in range(12):
            answer = asyncio.run(job_or_error(served.url, cert=served.cert, key=served.key, password=f"guess-{i}"))
            assert status_name(answer) == "BadUserAccessDenied", answer
    lines = server_lines(caplog.records)
    assert len(lines) == 1 and "a login from 127.0.0.1:" in lines[0] and "'plc'" in lines[0], lines
    assert served.server.health().counters["refused_logins"] == 12
    # The PLC itself still gets in, at once.
    assert asyncio.run(job_or_error(served.url, cert=served.cert, key=served.key)) == jobs + 1



def test_an_anonymous_login_is_one_line_not_asyncuas_error_too(served: Served,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """asyncua logs its own ERROR for a refused anonymous login; the door's line names the peer instead."""
    with caplog.at_level(logging.WARNING):
        answer = asyncio.run(job_or_error(served.url, cert=served.cert, key=served.key, user=None))
    assert status_name(answer) == "BadIdentityTokenRejected", answer
    lines = server_lines(caplog.records)
    assert len(lines) == 1 and "a login from 127.0.0.1:" in lines[0] and "anonymous" in lines[0], lines
