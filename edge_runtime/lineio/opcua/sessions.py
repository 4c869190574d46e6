"""OPC UA sessions: authentication tokens nobody can guess, and each session bound to the secure channel
that holds it (OPC 10000-4 §5.7.2, §5.7.3, §7.36).

asyncua 2.1 numbers authentication tokens 1000, 1001, ..., serves each connection's requests as that
connection's session whatever token they carry, and on an ActivateSession over a connection without a
session takes the session the token names, moving its subscriptions there, before it checks the
client's signature or password (a failed check leaves the session moved). A client with a trusted
certificate that guessed another client's token took over that client's session, subscriptions and jobs.
Here:
- a token is 32 random bytes (a ByteString NodeId, as the OPC Foundation's .NET stack and node-opcua
  make them; every client sends back whatever NodeId it got);
- a session belongs to the secure channel that created it. A request that carries its token on another
  channel is refused (BadSecureChannelIdInvalid), save an ActivateSession that moves it there (a client
  back after a lost connection, §5.7.3): only after its first activation, from a channel of the same
  client certificate, naming the same user, whose password and signature asyncua checks again.
  Otherwise BadSessionIdInvalid, asyncua's answer to an unknown token, on which a client opens a new
  session; BadIdentityChangeNotSupported for another user;
- a connection's requests must carry its own session's token (BadSessionIdInvalid for an unknown one),
  and only ActivateSession and CloseSession before the session is activated (BadSessionNotActivated);
- a subscription is its session's: another session's Publish acknowledgement, Republish, Modify-,
  SetPublishingMode-, Delete- or monitored-item request for it is BadSubscriptionIdInvalid, and
  TransferSubscriptions takes it only for the same user on the same client certificate.
"""

from __future__ import annotations

import secrets
import weakref
from dataclasses import dataclass
from typing import Any

from asyncua import ua
from asyncua.common.utils import Buffer
from asyncua.crypto.permission_rules import User, UserRole
from asyncua.server.internal_server import InternalServer
from asyncua.server.internal_session import InternalSession, SessionState
from asyncua.ua.ua_binary import struct_from_binary

TOKEN_BYTES = 32


def _req(name: str) -> ua.NodeId:
    return ua.NodeId(ua.Int32(getattr(ua.ObjectIds, f"{name}Request_Encoding_DefaultBinary")))


ACTIVATE, CLOSE = _req("ActivateSession"), _req("CloseSession")
# Services without a session: discovery, CreateSession, and the channel's own close.
SESSIONLESS = frozenset(_req(n) for n in ("CreateSession", "GetEndpoints", "FindServers", "RegisterServer",
                                          "RegisterServer2", "CloseSecureChannel"))
# Subscription services -> (parameters type, how to read the subscription ids they name).
_BY_SUBSCRIPTION: dict[ua.NodeId, tuple[type, Any]] = {
    _req("Publish"): (ua.PublishParameters, lambda p: [a.SubscriptionId for a in p.SubscriptionAcknowledgements]),
    _req("Republish"): (ua.RepublishParameters, lambda p: [p.SubscriptionId]),
    _req("ModifySubscription"): (ua.ModifySubscriptionParameters, lambda p: [p.SubscriptionId]),
    _req("SetPublishingMode"): (ua.SetPublishingModeParameters, lambda p: list(p.SubscriptionIds)),
    _req("DeleteSubscriptions"): (ua.DeleteSubscriptionsParameters, lambda p: list(p.SubscriptionIds)),
    _req("CreateMonitoredItems"): (ua.CreateMonitoredItemsParameters, lambda p: [p.SubscriptionId]),
    _req("ModifyMonitoredItems"): (ua.ModifyMonitoredItemsParameters, lambda p: [p.SubscriptionId]),
    _req("SetMonitoringMode"): (ua.SetMonitoringModeParameters, lambda p: [p.SubscriptionId]),
    _req("DeleteMonitoredItems"): (ua.DeleteMonitoredItemsParameters, lambda p: [p.SubscriptionId]),
}
TRANSFER = _req("TransferSubscriptions")


class SessionRefused(Exception):
    """A request the session rules refuse: the OPC UA status code and why (for the log)."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code, self.why = code, why


def random_token() -> ua.NodeId:
    return ua.NodeId(ua.ByteString(secrets.token_bytes(TOKEN_BYTES)), ua.Int16(0), ua.NodeIdType.ByteString)


class KeyedInternalServer(InternalServer):
    """asyncua's InternalServer whose client sessions get a random authentication token (asyncua's are
    1000, 1001, ...): the token is re-keyed before CreateSession's answer carries it."""

    def create_session(self, name: str, user: User = User(role=UserRole.Anonymous),  # noqa: B008 - asyncua's default
                       external: bool = False) -> InternalSession:
        session = super().create_session(name, user=user, external=external)
        if external:
            self.unregister_external_session(session)
            session.auth_token = random_token()
            self.register_external_session(session)
        return session


def identity(token: Any) -> str:
    """Who an ActivateSession's UserIdentityToken names: 'user NAME', 'anonymous', or its type."""
    if isinstance(token, ua.UserNameIdentityToken):
        return f"user {token.UserName!r}"
    if token is None or isinstance(token, ua.AnonymousIdentityToken) or (
            isinstance(token, ua.ExtensionObject) and token.TypeId.is_null()):
        return "anonymous"  # a null token is anonymous (§5.7.3)
    return type(token).__name__


@dataclass
class _Binding:
    channel: weakref.ref[Any]  # the connection's processor (one secure channel each) that holds the session
    certificate: str | None  # SHA-256 of the client certificate of the channel that created it (None: no security)
    user: str | None = None  # identity() of its last activation


class SessionBindings:
    """Which secure channel holds each session, and the checks of every request against that."""

    def __init__(self) -> None:
        # Weak keys: a binding goes with its session (asyncua drops a session once it is closed).
        self._bound: weakref.WeakKeyDictionary[InternalSession, _Binding] = weakref.WeakKeyDictionary()

    def created(self, session: InternalSession, channel: Any, certificate: str | None) -> None:
        self._bound[session] = _Binding(weakref.ref(channel), certificate)

    def activated(self, session: InternalSession, channel: Any, user: str) -> Any | None:
        """Record an accepted ActivateSession on `channel`; returns the channel the session left, if any."""
        bound = self._bound.get(session)
        if bound is None:
            return None
        left = bound.channel()
        bound.channel, bound.user = weakref.ref(channel), user
        return left if left is not channel else None

    def check(self, channel: Any, own: InternalSession | None, found: InternalSession | None, typeid: ua.NodeId,
              token: ua.NodeId, certificate: str | None, user: str | None) -> None:
        """Raise SessionRefused unless a request with `token` may go on: `own` is the connection's session,
        `found` the live session the token names; for an ActivateSession, `certificate` is the channel's
        client certificate (SHA-256) and `user` the identity() it names."""
        if typeid == ACTIVATE and own is None and found is not None:
            self._check_move(channel, found, certificate, user)
            return
        if own is None or own.auth_token != token:
            if found is not None and found is not own:
                if typeid == ACTIVATE:
                    raise SessionRefused(ua.StatusCodes.BadSessionIdInvalid,
                                         "ActivateSession: the token names a session of another secure channel")
                raise SessionRefused(ua.StatusCodes.BadSecureChannelIdInvalid,
                                     f"{_service(typeid)}: the token names a session of another secure channel")
            if own is not None:
                raise SessionRefused(ua.StatusCodes.BadSessionIdInvalid,
                                     f"{_service(typeid)}: the token is not this connection's session's")
            return  # no session here and an unknown token: asyncua refuses it (BadSessionIdInvalid / access)
        bound = self._bound.get(own)
        if bound is not None and bound.channel() is not channel:
            raise SessionRefused(ua.StatusCodes.BadSecureChannelIdInvalid,
                                 f"{_service(typeid)}: the session moved to another secure channel")
        if not own.is_activated() and typeid not in (ACTIVATE, CLOSE):
            if own.state == SessionState.Closed:
                raise SessionRefused(ua.StatusCodes.BadSessionIdInvalid, f"{_service(typeid)}: the session is closed")
            raise SessionRefused(ua.StatusCodes.BadSessionNotActivated,
                                 f"{_service(typeid)}: the session is not activated")

    def _check_move(self, channel: Any, session: InternalSession, certificate: str | None, user: str | None) -> None:
        bound = self._bound.get(session)
        why = None
        if bound is None or not session.is_activated():
            why = "a session is first activated on the secure channel that created it"
        elif bound.certificate is None:
            why = "a session made without a client certificate stays on its secure channel"
        elif certificate != bound.certificate:
            why = "the session was created with another client certificate"
        elif bound.channel() is channel:
            why = "the session is already on this secure channel"
        if bound is None or why is not None:
            raise SessionRefused(ua.StatusCodes.BadSessionIdInvalid,
                                 f"ActivateSession from another secure channel: {why}")
        if user != bound.user:
            raise SessionRefused(ua.StatusCodes.BadIdentityChangeNotSupported,
                                 f"ActivateSession from another secure channel: {user} for a session of {bound.user}")

    def check_subscriptions(self, iserver: InternalServer, own: InternalSession, typeid: ua.NodeId,
                            body: Buffer) -> None:
        """Subscription services touch only the session's own subscriptions (asyncua keeps one table for
        all sessions, with ids 1, 2, ...); TransferSubscriptions takes another's only for the same user on the
        same client certificate."""
        subscriptions = iserver.subscription_service.subscriptions
        if typeid == TRANSFER:
            params = struct_from_binary(ua.TransferSubscriptionsParameters, body.copy())
            mine = self._bound.get(own)
            for sub_id in params.SubscriptionIds:
                sub = subscriptions.get(int(sub_id))
                if sub is None or sub.session_id == own.session_id:
                    continue
                owner = next((s for s in self._bound if s.session_id == sub.session_id), None)
                theirs = self._bound.get(owner) if owner is not None else None
                if mine is None or theirs is None or mine.certificate is None or \
                        (mine.certificate, mine.user) != (theirs.certificate, theirs.user):
                    raise SessionRefused(ua.StatusCodes.BadUserAccessDenied,
                                         f"TransferSubscriptions: subscription {int(sub_id)} is another client's")
            return
        shape = _BY_SUBSCRIPTION.get(typeid)
        if shape is None:
            return
        params = struct_from_binary(shape[0], body.copy())
        for sub_id in shape[1](params):
            sub = subscriptions.get(int(sub_id))
            if sub is not None and sub.session_id != own.session_id:
                raise SessionRefused(ua.StatusCodes.BadSubscriptionIdInvalid,
                                     f"{_service(typeid)}: subscription {int(sub_id)} is another session's")


def _service(typeid: ua.NodeId) -> str:
    name = ua.ObjectIdNames.get(typeid.Identifier, str(typeid)) if isinstance(typeid.Identifier, int) else str(typeid)
    return name.removesuffix("Request_Encoding_DefaultBinary")


class MoveUndo:
    """What asyncua changes on a connection when an ActivateSession moves a session to it, before it
    checks the signature and the password: kept to put back when that check fails."""

    def __init__(self, processor: Any, session: InternalSession) -> None:
        self.processor = processor
        self.watchdog, self.closing = processor._session_watchdog_task, processor._closing
        subs = processor.iserver.subscription_service.subscriptions.values()
        self.callbacks = [(sub, sub.pub_result_callback, sub.pub_request_callback)
                          for sub in subs if sub.session_id == session.session_id]

    def apply(self) -> None:
        p = self.processor
        if p._session_watchdog_task is not None and p._session_watchdog_task is not self.watchdog:
            p._session_watchdog_task.cancel()
        p._session_watchdog_task, p._closing, p.session = self.watchdog, self.closing, None
        for sub, on_result, on_request in self.callbacks:  # its notifications go to its own channel again
            sub.pub_result_callback, sub.pub_request_callback = on_result, on_request
