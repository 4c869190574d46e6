"""The technicians' status page: static files shipped in the package, no CDN, no build step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flask import Blueprint, send_from_directory

STATIC = Path(__file__).parent / "static"
bp = Blueprint("page", __name__)


@bp.get("/")
def index() -> Any:
    return send_from_directory(STATIC, "index.html", max_age=0)


@bp.get("/static/<path:name>")
def static(name: str) -> Any:
    return send_from_directory(STATIC, name, max_age=300)
