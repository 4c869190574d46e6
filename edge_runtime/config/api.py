"""`api:`: the local HTTP API, OpenAI endpoint, metrics and status page."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, SecretStr, field_validator

from edge_runtime.config.base import Section

# What a client can send after `Bearer ` and the server can match: waitress decodes header values as
# latin-1 (requests/http.client send str values so; curl's UTF-8 `短` reads as mojibake), no header carries
# a control character (C0, DEL, C1), and the HTTP layers strip the value's ends (`check_access` and the
# rails' `bearer()` with str.strip(), which also takes \xa0), so leading/trailing whitespace never
# matches. Inner spaces and latin-1 letters are kept and match.
_SENDABLE_TOKEN = re.compile(r"[\x20-\x7e\xa0-\xff]{1,4096}")


EXPORT_MIN_KIB_S = 4  # api.export_min_kib_s's default (api/guard.py's Limits starts from it too)
EXPORT_MAX_S = 3600  # api.export_max_s's default


class ApiConfig(Section):
    enabled: bool = Field(True, description="Serve the REST API, OpenAI endpoint, metrics and status page.")
    host: str = Field("0.0.0.0", description="Bind address; 127.0.0.1 keeps everything on the device.")
    port: int = Field(8080, ge=0, le=65535, description="TCP port (0 picks a free one).")
    token: SecretStr | None = Field(
        None, description="Bearer token for inference and mutating endpoints (and every read with "
        "auth: all): latin-1 text (inner spaces and letters such as é are fine) without control characters "
        "or leading/trailing whitespace, at most 4096 characters. Without one, those endpoints "
        "answer only clients on loopback.")
    auth: Literal["writes", "all"] = Field(
        "writes", description="What needs the token: writes (inference and changes; reads are open) or "
        "all (every endpoint but /healthz, /readyz and the status page's shell and static files).")
    threads: int = Field(6, ge=2, le=64, description="WSGI worker threads (live event streams hold one each).")
    max_request_mb: float = Field(16, gt=0, le=512, description="Largest accepted request body.")
    allow_remote_image_urls: bool = Field(
        False, description="Let /v1/chat/completions fetch http(s) image URLs (data: URLs always work).")
    allow_local_image_urls: bool = Field(
        False, description="With allow_remote_image_urls: also fetch from addresses of this device or its link "
        "(loopback, link-local such as 169.254.x.x, multicast). Off, such a URL (or a redirect to one) is a "
        "400, so a client cannot reach the device's own services through the image fetcher.")
    request_timeout_s: float = Field(60, gt=0, description="How long an API request waits for its verdict.")
    request_deadline_s: float = Field(
        15, ge=0.5, le=600, description="A request's head and body must arrive within this many seconds "
        "of its first byte, or the connection gets a 408 and is closed (slow-sending clients).")
    connections_per_client: int = Field(
        64, ge=1, le=500, description="Most connections one client address may hold open; more are "
        "refused at once. 127.0.0.1 and ::1 are exempt (local health checks).")
    export_min_kib_s: float = Field(
        EXPORT_MIN_KIB_S, gt=0, le=1_000_000, description="A result export (export.csv / .jsonl, one at a time) "
        "is cut when its client takes less than this many KiB/s over a minute in which it was owed data, so a "
        "client that reads a trickle cannot keep the one export slot (64 KiB/s is 16 times this).")
    export_max_s: float = Field(
        EXPORT_MAX_S, ge=10, le=86_400, description="A result export not taken whole within this many seconds is cut "
        "(100 MB at 64 KiB/s takes ~26 minutes).")
    max_images_per_request: int = Field(
        8, ge=1, le=256, description="Most image_url parts one /v1/chat/completions request may carry (in order, "
        "as llama.cpp's server and vLLM take them); more are a 400 naming the first part over the limit, "
        "before any image is fetched or decoded.")
    max_request_pixels: int = Field(
        64_000_000, ge=1, le=1_000_000_000, description="Most pixels all images of one chat request may "
        "declare together (read from their headers; each image is bounded by images.max_pixels too); more "
        "are a 413 naming the image that crossed it, before any is decoded.")

    @field_validator("token")
    @classmethod
    def _sendable(cls, token: SecretStr | None) -> SecretStr | None:
        # '' is what an unset ${VAR:-} gives: no token (config/reload_guard.py).
        return sendable_token(token)


def sendable_token(token: SecretStr | None) -> SecretStr | None:
    """A Bearer token a client can send (api.token, rails' access.token); None and '' pass. The value is
    never echoed in the error."""
    value = token.get_secret_value() if token is not None else ""
    if value and (not _SENDABLE_TOKEN.fullmatch(value) or value != value.strip()):
        raise ValueError("must be latin-1 text without control characters or leading/trailing whitespace, at "
                         "most 4096 characters: clients send it in an HTTP header (latin-1, ends trimmed), so "
                         "anything else could never match")
    return token
