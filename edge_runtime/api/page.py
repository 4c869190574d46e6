"""The technicians' status page: static files shipped in the package, no CDN, no build step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flask import Blueprint, send_from_directory

from edge_runtime.api.openapi import doc

STATIC = Path(__file__).parent / "static"
bp = Blueprint("page", __name__)


@bp.get("/")
@doc("Status page for technicians", response="text/html")
def index() -> Any:
    return send_from_directory(STATIC, "index.html", max_age=0)


@bp.get("/static/<path:name>")
@doc("Status page script, stylesheet", response="application/octet-stream", errors=(404,))
def static(name: str) -> Any:
    return send_from_directory(STATIC, name, max_age=300)
