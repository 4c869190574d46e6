"""The technicians' status page: static files shipped in the package, no CDN, no build step."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from flask import Blueprint, current_app, jsonify, send_from_directory

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


EVALUATIONS_LISTED = 50
MAX_EVALUATION_BYTES = 256 * 1024


@bp.get("/api/v1/evaluations")
@doc("Summaries of the `edge-runtime eval` runs kept on this device, newest first")
def evaluations() -> Any:
    """`<data_dir>/evaluations/*.json` (written by eval, which keeps the newest 50); an unreadable or
    oversized file is skipped."""
    folder = current_app.extensions["edge_runtime"].status.config.data_dir / "evaluations"
    try:
        with os.scandir(folder) as it:
            names = sorted((e.name for e in it if e.name.endswith(".json") and e.is_file(follow_symlinks=False)),
                           reverse=True)[:EVALUATIONS_LISTED]
    except OSError:
        names = []
    found = []
    for name in names:
        try:
            with open(folder / name, "rb") as f:
                raw = f.read(MAX_EVALUATION_BYTES + 1)
            item = json.loads(raw) if len(raw) <= MAX_EVALUATION_BYTES else None
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(item, dict):
            found.append(item)
    return jsonify(evaluations=found)
