"""Who may call what: a Bearer token, or loopback when none is set.

`api.auth: writes` (default) guards inference and mutating endpoints (`require_access`); reads are open.
`api.auth: all` guards every request (`guard_reads`, a before-request hook, so a new route is covered
without anyone remembering to) except `OPEN_ENDPOINTS`: health probes and what a browser must load to
ask for the token. The status page cannot put a header on an <img> or an EventSource, so a technician
trades the token once for a session cookie (`POST /api/v1/session`): signed with the token, expiring,
HttpOnly, SameSite=Strict, and good for GET/HEAD only, so it can never authorize a write (no CSRF).

The cookie is `<expires>.<hex HMAC-SHA256>`, parsed strictly (ASCII digits without a leading zero, 64
lower-case hex digits, nothing else). The HMAC key is a random per-process key generation, replaced
whenever the token changes, and the signed text names the device id and a hash of the token: a cookie
of device A never reads device B (even with one token), a rotated token ends every session for good
(rotating back does not revive them), and a restart ends them too (nothing secret is written to disk;
the technician signs in again).

Failed Bearer attempts (a wrong token, on any endpoint) are rate limited per client address (an IPv6
client by its /64): a token bucket of FAILURES_PER_S with a burst of FAILURES_BURST; past it, 429 with
Retry-After before the token is even compared. Loopback is exempt, as in api.connections_per_client.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import math
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, cast

from flask import Response, current_app, request

from edge_runtime.api.errors import ApiError, invalid

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger(__name__)

# Flask endpoint names served without the token under `api.auth: all`.
OPEN_ENDPOINTS = frozenset({"rest.healthz", "rest.readyz", "page.index", "page.static"})
SESSION_COOKIE = "edge_session"
SESSION_S = 12 * 3600  # one shift; a rotated token ends every session at once (it is the signing key)
READ_METHODS = frozenset({"GET", "HEAD"})
_COOKIE = re.compile(r"([1-9][0-9]{0,11})\.([0-9a-f]{64})", re.ASCII)
FAILURES_PER_S = 5.0
FAILURES_BURST = 10
MAX_CLIENTS = 4096  # the failed-attempt table: least recently seen clients are forgotten past this


class FailureLimiter:
    """Token buckets of failed token attempts per client address; bounded (LRU of MAX_CLIENTS)."""

    def __init__(self, rate: float = FAILURES_PER_S, burst: int = FAILURES_BURST,
                 max_clients: int = MAX_CLIENTS) -> None:
        self.rate, self.burst, self.max_clients = rate, burst, max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, at)
        self._lock = threading.Lock()
        self.limited = 0  # attempts answered 429
        self.failures = 0
        self._logged_at = -1e9

    def _tokens(self, client: str, now: float) -> float:
        tokens, at = self._buckets.get(client, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) * self.rate)

    def retry_after(self, client: str, now: float | None = None) -> int | None:
        """Seconds to wait when this client has no attempt left, else None."""
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens = self._tokens(client, now)
            if tokens >= 1:
                return None
            self.limited += 1
            if now - self._logged_at > 60:
                self._logged_at = now
                log.warning("api: %s is over %g failed token attempts a second; answering 429 (%d so far)",
                            client, self.rate, self.limited)
            return max(1, math.ceil((1 - tokens) / self.rate))

    def failed(self, client: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            self.failures += 1
            self._buckets[client] = (self._tokens(client, now) - 1, now)
            self._buckets.move_to_end(client)
            while len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)

    def __len__(self) -> int:
        return len(self._buckets)


def client_key(addr: str | None) -> str | None:
    """What failed attempts are counted by: the address, an IPv6 one by its /64; None for loopback."""
    try:
        ip = ipaddress.ip_address((addr or "").split("%", 1)[0])
    except ValueError:
        return addr or "?"
    if ip.is_loopback:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))
    return str(ip)


def _limiter() -> FailureLimiter:
    return cast(FailureLimiter, current_app.extensions.setdefault("edge_auth_failures", FailureLimiter()))


def _is_loopback(addr: str | None) -> bool:
    try:
        return addr is not None and ipaddress.ip_address(addr.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _unauthorized() -> ApiError:
    return ApiError(401, "unauthorized", "a valid 'Authorization: Bearer <token>' header is required",
                    headers={"WWW-Authenticate": 'Bearer realm="edge-runtime"'}, field="Authorization")


def check_access() -> None:
    """Token configured: require `Authorization: Bearer <token>` (constant-time compare).
    No token: only clients on this device (loopback) are served."""
    token: str | None = current_app.config["EDGE_API_TOKEN"]
    if token:
        header = request.headers.get("Authorization", "")
        if not header:
            raise _unauthorized()
        client = client_key(request.remote_addr)
        if client is not None:
            wait = _limiter().retry_after(client)
            if wait is not None:
                raise ApiError(429, "too_many_attempts", "too many wrong tokens from this address; wait and "
                               "try again", headers={"Retry-After": str(wait)}, field="Authorization")
        scheme, _, given = header.partition(" ")
        # Digests of equal length: the compare takes the same time whatever the token's length.
        if scheme.lower() != "bearer" or not hmac.compare_digest(_digest(given.strip()), _digest(token)):
            if client is not None:
                _limiter().failed(client)
            raise _unauthorized()
    elif not _is_loopback(request.remote_addr):
        raise ApiError(403, "forbidden", "no API token is configured, so this endpoint only answers "
                       "clients on the device itself; set api.token to allow remote callers")


def require_access(view: F) -> F:
    """Inference and mutating endpoints: `check_access` before the view, whatever `api.auth` says."""

    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        check_access()
        return view(*args, **kwargs)

    return cast(F, wrapper)


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


class SessionKeys:
    """The per-process key generation that signs session cookies: new when the token changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._token_digest = b""
        self._key = secrets.token_bytes(32)

    def key(self, token: str) -> bytes:
        digest = _digest(token)
        with self._lock:
            if not hmac.compare_digest(digest, self._token_digest):
                self._token_digest, self._key = digest, secrets.token_bytes(32)
            return self._key


def session_keys(app: Any = None) -> SessionKeys:
    app = app or current_app
    return cast(SessionKeys, app.extensions.setdefault("edge_session_keys", SessionKeys()))


def _device_id(app: Any) -> str:
    daemon = app.extensions.get("edge_runtime")
    return str(getattr(getattr(daemon, "config", None), "device_id", ""))


def _signature(key: bytes, device: str, token: str, expires: int) -> str:
    text = f"edge-session:2:{device}:{_digest(token).hex()}:{expires}"
    return hmac.new(key, text.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()


def session_value(token: str, now: float | None = None, app: Any = None) -> str:
    """A cookie value for `app` (default: the current one) signed for this token and device."""
    app = app or current_app
    expires = int(now if now is not None else time.time()) + SESSION_S
    return f"{expires}.{_signature(session_keys(app).key(token), _device_id(app), token, expires)}"


def _session_valid(token: str, value: str) -> bool:
    match = _COOKIE.fullmatch(value)
    if match is None or int(match.group(1)) < time.time():
        return False
    expires = int(match.group(1))
    expected = _signature(session_keys().key(token), _device_id(current_app), token, expires)
    return hmac.compare_digest(match.group(2).encode(), expected.encode())


def _raw_cookie(name: str) -> str | None:
    """The value of a cookie exactly as sent (the first of that name): Werkzeug's parser strips spaces
    and unquotes, which would let a padded or quoted value through the strict check."""
    raw = request.headers.get("Cookie", "")
    if len(raw) > 8192:
        return None
    for part in raw.split(";"):
        key, sep, value = part.lstrip(" ").partition("=")
        if sep and key == name:
            return value
    return None


def guard_reads() -> None:
    """Before every request: with `api.auth: all`, everything but OPEN_ENDPOINTS needs the token
    (a read may show a valid session cookie instead)."""
    token: str | None = current_app.config["EDGE_API_TOKEN"]
    if token:  # every request (health probes too) notices a rotated token: old sessions end for good
        session_keys().key(token)
    if current_app.config.get("EDGE_API_AUTH") != "all" or request.endpoint in OPEN_ENDPOINTS:
        return
    cookie = _raw_cookie(SESSION_COOKIE)
    if token and cookie and request.method in READ_METHODS and _session_valid(token, cookie):
        return
    check_access()


def start_session() -> Response:
    """`POST /api/v1/session` with the Bearer token: a read-only session cookie for the status page."""
    token: str | None = current_app.config["EDGE_API_TOKEN"]
    if not token:
        raise invalid("token", "no api.token is configured on the device: there is nothing to sign in with")
    check_access()
    response = Response(status=204)
    response.set_cookie(SESSION_COOKIE, session_value(token), max_age=SESSION_S, httponly=True,
                        samesite="Strict", path="/")
    return response
