"""The OPC UA server's door: which connections, secure channels, sessions and logins get through, and
the log of those that did not.

asyncua 2.1's server, whatever endpoints it offers, gives a session to a client on a SecurityPolicy
None channel (a connection's channel starts as None, and None matches it), even to one that sent no
OpenSecureChannel at all, checks the client certificate only when CreateSession names one, and takes
a password in clear over a Sign-only channel. `GuardedServer` is asyncua's `Server` whose connections
go through `_GuardedProcessor`, which refuses, unless the config lists security `none`:
- on a SecurityPolicy None channel, every service but discovery (GetEndpoints and FindServers, which
  OPC UA clients call on a None channel to learn the endpoints and the server's certificate):
  CreateSession and the rest are answered BadSecurityPolicyRejected and the connection is closed;
- a message before any OpenSecureChannel (BadSecureChannelIdInvalid, an OPC UA Error message, closed);
- a secure channel whose client certificate is outside its validity or the trust list
  (BadCertificateTimeInvalid / BadCertificateUntrusted, an Error message at the OpenSecureChannel,
  closed), and a CreateSession naming another certificate than its channel's (BadCertificateInvalid);
and, whatever the config, a password that is not encrypted over a channel that does not encrypt
(BadSecurityModeInsufficient: the client may try again on that connection, as after a wrong password).
Sessions (unguessable tokens, each bound to its secure channel, subscriptions to their session) are
sessions.py's rules, checked here for every request.
Each refusal is counted and logged with the peer's address: the first of a kind at once, then at most
one line a minute with the count. asyncua's own WARNING/ERROR lines (one ERROR per refused login) go
through `asyncua_logs.tame_asyncua_logs`: those that repeat a refusal logged here are dropped, the others
limited.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

from asyncua import Server, ua
from asyncua.common.utils import Buffer, ServiceError
from asyncua.crypto import uacrypto
from asyncua.crypto.security_policies import SecurityPolicyNone
from asyncua.server.binary_server_asyncio import BinaryServer, OPCUAProtocol
from asyncua.server.uaprocessor import UaProcessor
from asyncua.ua.ua_binary import struct_from_binary, uatcp_to_binary
from cryptography.exceptions import InvalidSignature

from edge_runtime.config.line_protocols import OpcUaConfig
from edge_runtime.core.supervise import RateLimitedLog
from edge_runtime.lineio.opcua.pki import CertificateRefused, TrustList, ensure_server_certificate, fingerprint
from edge_runtime.lineio.opcua.sessions import (
    SESSIONLESS,
    KeyedInternalServer,
    MoveUndo,
    SessionBindings,
    SessionRefused,
    identity,
)

log = logging.getLogger(__name__)
LOG_INTERVAL_S = 60.0
_POLICIES = {"sign": ua.SecurityPolicyType.Basic256Sha256_Sign,
             "sign_and_encrypt": ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt,
             "none": ua.SecurityPolicyType.NoSecurity}
_POLICY_NAMES = {"sign": "Basic256Sha256 Sign", "sign_and_encrypt": "Basic256Sha256 SignAndEncrypt", "none": "None"}
_CREATE = ua.NodeId(ua.Int32(ua.ObjectIds.CreateSessionRequest_Encoding_DefaultBinary))
_ACTIVATE = ua.NodeId(ua.Int32(ua.ObjectIds.ActivateSessionRequest_Encoding_DefaultBinary))
_DISCOVERY = frozenset({ua.NodeId(ua.Int32(ua.ObjectIds.GetEndpointsRequest_Encoding_DefaultBinary)),
                        ua.NodeId(ua.Int32(ua.ObjectIds.FindServersRequest_Encoding_DefaultBinary)),
                        ua.NodeId(ua.Int32(ua.ObjectIds.CloseSecureChannelRequest_Encoding_DefaultBinary))})
# Refusal kind -> what was refused, for the log line.
KINDS = {"none_policy": "a request over SecurityPolicy None", "no_channel": "a request before any secure channel",
         "bad_channels": "a secure channel", "certificates": "a client certificate",
         "clear_passwords": "a password sent in clear", "logins": "a login",
         "sessions": "a request for a session or subscription not its own"}


class Refused(Exception):
    """A connection, channel or session the door does not let through."""

    def __init__(self, kind: str, code: int, why: str) -> None:
        super().__init__(why)
        self.kind, self.code, self.why = kind, code, why


class Refusals:
    """Refusals per kind: counted, and logged with the peer (the first at once, then once a minute)."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(KINDS, 0)
        self._logs = {kind: RateLimitedLog(log, LOG_INTERVAL_S) for kind in KINDS}

    def refuse(self, refused: Refused, peer: str) -> None:
        self.counts[refused.kind] += 1
        self._logs[refused.kind].log(logging.WARNING, "opcua: refused %s from %s: %s (%s)", KINDS[refused.kind],
                                     peer, refused.why, _status(refused.code).name)


class Door:
    """The checks, for every connection of one server."""

    def __init__(self, cfg: OpcUaConfig, trust: TrustList) -> None:
        self.allow_none = "none" in cfg.security
        self.offered = " and ".join(_POLICY_NAMES[s] for s in cfg.security if s != "none") or "None"
        self.trust = trust
        self.refusals = Refusals()
        self.sessions = SessionBindings()

    def check_channel(self, policy_uri: str | None, sender_certificate: bytes | None) -> None:
        """An OpenSecureChannel that opens a channel (not a renewal); a None one is checked per request."""
        if policy_uri == SecurityPolicyNone.URI:
            return
        cert = _leaf(sender_certificate)
        if cert is None:
            raise Refused("certificates", ua.StatusCodes.BadCertificateInvalid, "no readable client certificate")
        problem = self.trust.verdict(cert)
        if problem is not None:
            raise Refused("certificates", problem[0], self.trust.refuse(cert, problem[1]))

    def check_request(self, channel: Any, typeid: ua.NodeId) -> None:
        """Over SecurityPolicy None, only discovery (unless the config lists security none)."""
        if channel.URI == SecurityPolicyNone.URI and not self.allow_none and typeid not in _DISCOVERY:
            raise Refused("none_policy", ua.StatusCodes.BadSecurityPolicyRejected,
                          f"{_service(typeid)}: this server's endpoints are {self.offered} only")

    def check_create(self, channel: Any, params: ua.CreateSessionParameters) -> None:
        """The certificate a CreateSession names must be its secure channel's (asyncua validates the one named)."""
        if channel.Mode == ua.MessageSecurityMode.None_:
            return
        named, own = _leaf(params.ClientCertificate), _leaf(channel.peer_certificate)
        if named is None or own is None or fingerprint(named) != fingerprint(own):
            raise Refused("certificates", ua.StatusCodes.BadCertificateInvalid,
                          "CreateSession names another certificate than its secure channel's")

    def check_activate(self, channel: Any, params: ua.ActivateSessionParameters) -> None:
        """A password travels encrypted: in an encrypted channel, or encrypted for the server's key."""
        token = params.UserIdentityToken
        if (isinstance(token, ua.UserNameIdentityToken) and not token.EncryptionAlgorithm
                and channel.Mode != ua.MessageSecurityMode.SignAndEncrypt):
            raise Refused("clear_passwords", ua.StatusCodes.BadSecurityModeInsufficient,
                          f"user {_text(token.UserName)}: the password was not encrypted and the channel "
                          f"({channel.Mode.name}) does not encrypt")

    @staticmethod
    def login_refused(exc: ServiceError | ua.UaStatusCodeError, params: ua.ActivateSessionParameters | None) -> Refused:
        token = params.UserIdentityToken if params is not None else None
        who = f"user {_text(token.UserName)}" if isinstance(token, ua.UserNameIdentityToken) else \
            "anonymous" if isinstance(token, ua.AnonymousIdentityToken | None) else type(token).__name__
        return Refused("logins", exc.code, f"{who}: {_status(exc.code).doc or 'refused'}")


class _GuardedProcessor(UaProcessor):
    """asyncua's per-connection processor with the door's checks in front of its own."""

    door: Door

    @property
    def peer(self) -> str:
        name = self.name
        return f"{name[0]}:{name[1]}" if isinstance(name, tuple) and len(name) >= 2 else str(name)

    async def process(self, header: Any, body: Any) -> bool:
        opening = not self._connection.is_open()
        try:
            if opening and header.MessageType == ua.MessageType.SecureMessage:
                raise Refused("no_channel", ua.StatusCodes.BadSecureChannelIdInvalid,
                              "no OpenSecureChannel came first")
            return bool(await super().process(header, body))
        except Refused as exc:
            return self._close(exc)
        except Exception as exc:  # a channel that cannot be opened is closed, not left half open
            if opening and header.MessageType == ua.MessageType.SecureOpen:
                return self._close(Refused("bad_channels", ua.StatusCodes.BadSecurityChecksFailed,
                                           f"the OpenSecureChannel failed: {type(exc).__name__}: {str(exc)[:200]}"))
            raise

    def open_secure_channel(self, algohdr: Any, seqhdr: Any, body: Any) -> None:
        if not self._connection.is_open():
            self.door.check_channel(algohdr.SecurityPolicyURI, algohdr.SenderCertificate)
        super().open_secure_channel(algohdr, seqhdr, body)

    async def _process_message(self, typeid: Any, requesthdr: Any, seqhdr: Any, body: Buffer) -> Any:
        channel = self._connection.security_policy
        params: Any = None
        try:
            self.door.check_request(channel, typeid)
            if typeid == _CREATE:
                params = struct_from_binary(ua.CreateSessionParameters, body.copy())
                self.door.check_create(channel, params)
            elif typeid == _ACTIVATE:
                params = struct_from_binary(ua.ActivateSessionParameters, body.copy())
            if typeid not in SESSIONLESS:
                self._check_session(typeid, requesthdr.AuthenticationToken, body, params)
            if typeid == _ACTIVATE:
                self.door.check_activate(channel, params)
            return await self._serve(typeid, requesthdr, seqhdr, body, params)
        except Refused as exc:
            refused = exc
        except SessionRefused as exc:
            refused = Refused("sessions", exc.code, exc.why)
        except InvalidSignature:  # asyncua's check of ActivateSession's client signature
            refused = Refused("sessions", ua.StatusCodes.BadApplicationSignatureInvalid,
                              "ActivateSession: the client signature does not verify")
        except CertificateRefused as exc:  # asyncua's call of the trust list at CreateSession
            refused = Refused("certificates", exc.code, exc.why)
        except (ServiceError, ua.UaStatusCodeError) as exc:
            if typeid not in (_CREATE, _ACTIVATE):
                raise  # asyncua answers it
            refused = Door.login_refused(exc, params if typeid == _ACTIVATE else None)
        self.door.refusals.refuse(refused, self.peer)
        fault = ua.ServiceFault()
        fault.ResponseHeader.ServiceResult = _status(refused.code)
        self.send_response(requesthdr.RequestHandle, seqhdr, fault)
        # A refused login or session request may be tried again on the same connection, as OPC UA allows
        # (a client whose session could not move opens a new one there); any other refusal closes it (a
        # refused CreateSession leaves asyncua's half-made session: it goes with the connection).
        return refused.kind in ("logins", "clear_passwords", "sessions")

    def _certificate(self) -> str | None:
        """SHA-256 of this channel's client certificate (None on a channel without security)."""
        cert = _leaf(self._connection.security_policy.peer_certificate)
        return fingerprint(cert) if cert is not None else None

    def _check_session(self, typeid: ua.NodeId, token: ua.NodeId, body: Buffer, params: Any) -> None:
        found = self.iserver.lookup_external_session(token)
        user, cert = (identity(params.UserIdentityToken), self._certificate()) if typeid == _ACTIVATE else (None, None)
        self.door.sessions.check(self, self.session, found, typeid, token, cert, user)
        if self.session is not None and self.session.is_activated():
            self.door.sessions.check_subscriptions(self.iserver, self.session, typeid, body)

    async def _serve(self, typeid: ua.NodeId, requesthdr: Any, seqhdr: Any, body: Buffer, params: Any) -> Any:
        """asyncua's handling, and the sessions' bindings kept after it."""
        before = self.session
        moving = self.iserver.lookup_external_session(requesthdr.AuthenticationToken) \
            if typeid == _ACTIVATE and before is None else None
        undo = MoveUndo(self, moving) if moving is not None else None
        try:
            answered = await super()._process_message(typeid, requesthdr, seqhdr, body)
        except BaseException:
            if undo is not None:
                undo.apply()  # asyncua moved the session here before its checks failed
            raise
        if typeid == _CREATE and self.session is not None and self.session is not before:
            self.door.sessions.created(self.session, self, self._certificate())
            if before is not None and not before.is_activated():
                # asyncua serves one session a connection and times out only activated ones: the
                # replaced one would stay registered for good
                await before.close_session(True)
        elif typeid == _ACTIVATE and self.session is not None:
            left = self.door.sessions.activated(self.session, self, identity(params.UserIdentityToken))
            if left is not None:
                left.session = None  # the connection it left serves it no more
        return answered

    def _close(self, refused: Refused) -> bool:
        self.door.refusals.refuse(refused, self.peer)
        error = ua.ErrorMessage(_status(refused.code), ua.String(KINDS[refused.kind]))  # the details stay in our log
        self._transport.write(uatcp_to_binary(cast(ua.MessageType, ua.MessageType.Error), error))
        return False  # asyncua closes the connection


class _GuardedProtocol(OPCUAProtocol):
    door: Door

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        if self.processor is not None:  # taken (not over max_connections): its messages are not read yet
            processor = _GuardedProcessor(self.iserver, transport, self.limits)
            processor.door = self.door
            processor.set_policies(self.policies)
            self.processor = processor


class _GuardedBinaryServer(BinaryServer):
    door: Door

    def _make_protocol(self) -> OPCUAProtocol:
        protocol = _GuardedProtocol(iserver=self.iserver, policies=self._policies, clients=self.clients,
                                    closing_tasks=self.closing_tasks, limits=self.limits)
        protocol.door = self.door
        return protocol


class GuardedServer(Server):
    """asyncua's Server whose connections go through `door` (its `start` with the guarded socket server)."""

    def __init__(self, door: Door, user_manager: Any = None) -> None:
        super().__init__(iserver=KeyedInternalServer(user_manager=user_manager))  # random session tokens
        self.door = door

    async def start(self) -> None:
        await self._setup_server_nodes()
        await self.iserver.start()
        try:
            host, port = self._get_bind_socket_info()
            bserver = _GuardedBinaryServer(self.iserver, host, port, self.limits)  # type: ignore[arg-type]
            bserver.door = self.door
            bserver.set_policies(self._policies)
            self.bserver = bserver
            await bserver.start()
        except Exception:
            await self.iserver.stop()
            raise


async def secure(server: Server, cfg: OpcUaConfig, pki_dir: Path, application_uri: str, trust: TrustList) -> None:
    """The endpoints' security policies, the identity tokens, the server's certificate and the trust list."""
    if "none" in cfg.security:
        log.warning("opcua: security 'none' is enabled by the config: any client on the network can "
                    "trigger and acknowledge without signing or encryption")
        if cfg.users and set(cfg.security) == {"none"}:
            log.warning("opcua: with security 'none' alone a password would travel in clear, so users "
                        "cannot log in: add sign or sign_and_encrypt")
    server.set_security_policy([_POLICIES[s] for s in cfg.security])
    tokens: list[type] = [ua.UserNameIdentityToken] + ([ua.AnonymousIdentityToken] if cfg.anonymous else [])
    server.set_identity_tokens(tokens)
    cert, key = ensure_server_certificate(pki_dir, application_uri)
    await server.load_certificate(str(cert))
    await server.load_private_key(str(key))
    server.set_certificate_validator(trust)


def only_good_writes(server: Server, inputs: set[ua.NodeId]) -> None:
    """A client's write to one of `inputs` whose status is not Good is answered BadWriteNotSupported
    (OPC UA's answer for a value/status combination a server does not take) and changes nothing:
    asyncua would pass it on as a null value, which read as false (TriggerEnable off). An array is
    answered BadTypeMismatch: the inputs are scalars, but asyncua checks only the element type, and
    `[False]` is truthy (written to Trigger it started a job; to TriggerEnable it left the line enabled)."""
    aspace = server.iserver.aspace
    write = aspace.write_attribute_value

    async def checked(nodeid: ua.NodeId, attr: ua.AttributeIds, value: ua.DataValue) -> ua.StatusCode:
        if nodeid in inputs and attr == ua.AttributeIds.Value:
            if value.StatusCode is not None and not value.StatusCode.is_good():
                return _status(ua.StatusCodes.BadWriteNotSupported)
            if value.Value is not None and (value.Value.is_array or isinstance(value.Value.Value, list)):
                return _status(ua.StatusCodes.BadTypeMismatch)
        return await write(nodeid, attr, value)
    aspace.write_attribute_value = checked  # type: ignore[method-assign]


def _leaf(der: bytes | None) -> Any:
    """The first certificate of a DER certificate (chain), or None."""
    if not der:
        return None
    try:
        return uacrypto.x509_from_der(der)
    except (ValueError, TypeError):
        return None


def _status(code: int) -> ua.StatusCode:
    return ua.StatusCode(ua.UInt32(code))


def _service(typeid: ua.NodeId) -> str:
    name = ua.ObjectIdNames.get(typeid.Identifier, str(typeid)) if isinstance(typeid.Identifier, int) else str(typeid)
    return name.removesuffix("_Encoding_DefaultBinary")


def _text(value: Any) -> str:
    return repr(str(value)[:64]) if value is not None else "(none)"
