"""Who may call what: a Bearer token, or loopback when none is set.

`api.auth: writes` (default) guards inference and mutating endpoints (`require_access`); reads are open.
`api.auth: all` guards every request (`guard_reads`, a before-request hook, so a new route is covered
without anyone remembering to) except `OPEN_ENDPOINTS`: health probes and what a browser must load to
ask for the token. The status page cannot put a header on an <img> or an EventSource, so a technician
trades the token once for a session cookie (`POST /api/v1/session`): signed with the token, expiring,
HttpOnly, SameSite=Strict, and good for GET/HEAD only, so it can never authorize a write (no CSRF).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import time
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, cast

from flask import Response, current_app, request

from .errors import ApiError, invalid

F = TypeVar("F", bound=Callable[..., Any])

# Flask endpoint names served without the token under `api.auth: all`.
OPEN_ENDPOINTS = frozenset({"rest.healthz", "rest.readyz", "page.index", "page.static"})
SESSION_COOKIE = "edge_session"
SESSION_S = 12 * 3600  # one shift; a rotated token ends every session at once (it is the signing key)
READ_METHODS = frozenset({"GET", "HEAD"})


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
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
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


def _signature(token: str, expires: int) -> str:
    return hmac.new(token.encode(), f"edge-session:{expires}".encode(), hashlib.sha256).hexdigest()


def session_value(token: str, now: float | None = None) -> str:
    expires = int(now if now is not None else time.time()) + SESSION_S
    return f"{expires}.{_signature(token, expires)}"


def _session_valid(token: str, value: str) -> bool:
    expires, _, signature = value.partition(".")
    if not (expires.isascii() and expires.isdigit()) or len(expires) > 12 or int(expires) < time.time():
        return False
    return hmac.compare_digest(signature.encode(), _signature(token, int(expires)).encode())


def guard_reads() -> None:
    """Before every request: with `api.auth: all`, everything but OPEN_ENDPOINTS needs the token
    (a read may show a valid session cookie instead)."""
    if current_app.config.get("EDGE_API_AUTH") != "all" or request.endpoint in OPEN_ENDPOINTS:
        return
    token: str | None = current_app.config["EDGE_API_TOKEN"]
    cookie = request.cookies.get(SESSION_COOKIE)
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
