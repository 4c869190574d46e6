"""Who may call inference and mutating endpoints: a Bearer token, or loopback when none is set."""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, cast

from flask import current_app, request

from .errors import ApiError

F = TypeVar("F", bound=Callable[..., Any])


def _is_loopback(addr: str | None) -> bool:
    try:
        return addr is not None and ipaddress.ip_address(addr.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def require_access(view: F) -> F:
    """Token configured: require `Authorization: Bearer <token>` (constant-time compare).
    No token: only clients on this device (loopback) are served."""

    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        token: str | None = current_app.config["EDGE_API_TOKEN"]
        if token:
            header = request.headers.get("Authorization", "")
            scheme, _, given = header.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
                raise ApiError(401, "unauthorized", "a valid 'Authorization: Bearer <token>' header is required",
                               headers={"WWW-Authenticate": 'Bearer realm="edge-runtime"'})
        elif not _is_loopback(request.remote_addr):
            raise ApiError(403, "forbidden", "no API token is configured, so this endpoint only answers "
                           "clients on the device itself; set api.token to allow remote callers")
        return view(*args, **kwargs)

    return cast(F, wrapper)
