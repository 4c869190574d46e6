"""What a config reload can apply in place, and what only a restart applies.

A reload applies every setting it can and names the rest, so "config reloaded" never hides a setting
that silently kept its old value (a rotated API token that still let the old one in).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from pydantic import BaseModel

from edge_runtime.config.schema import Config

# Settings (dotted prefixes) the running daemon picks up on reload. Everything else is built once at
# start (broker connection, HTTP server, queue, governor, journal file) and needs a restart.
LIVE = (
    "cameras", "model", "device_id",  # cameras restart in place; the model reloads (app/reload.py)
    "log_level", "images", "inspection.jpeg_quality",
    "journal.max_rows", "journal.max_age_days", "journal.min_free_mb",
    "api.token",  # rotated by the API server on reload (api/)
    "api.allow_remote_image_urls", "api.allow_local_image_urls", "api.request_timeout_s",
    "api.auth", "api.request_deadline_s", "api.connections_per_client",  # read per request / accept
    "api.export_min_kib_s", "api.export_max_s",  # read when an export starts
    "ota",  # read by the update agent, a separate process
    "rules", "rules_budget",  # re-evaluated from the next verdict on (verdicts/stage.py)
    "rails",  # read per request by the API (api/rails/live.py)
    "api.max_images_per_request", "api.max_request_pixels",  # read per request (api/openai.py)
    "programs",  # references encoded again through the encoder cache (inspector.use_programs)
)


@dataclass
class Changes:
    applied: list[str]
    restart_needed: list[str]


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _is_live(key: str) -> bool:
    return any(key == p or key.startswith(p + ".") for p in LIVE)


def _top(key: str) -> str:
    """Cameras are reported as one setting: the list's items have no stable dotted names."""
    return "cameras" if key.startswith("cameras") else key


def programs_changed(old: Config, new: Config) -> bool:
    """Whether the inspection programs, which camera runs which, or the frame size (width, height, roi)
    or question (prompt) of a camera that runs one differ: a program is checked against its cameras'
    frames and questions (references, frame, question and answer within the context, image_tokens
    within the projector's floor), so a camera grown or asked more under an unchanged program is checked
    again, as `config validate` and a start check it."""

    def asked(cfg: Config) -> dict[str, tuple[object, ...]]:
        return {c.name: (c.program, c.width, c.height, c.roi, c.prompt) for c in cfg.cameras
                if c.program is not None}

    return old.programs != new.programs or asked(old) != asked(new)


def describe_changes(old: Config, new: Config) -> Changes:
    """Changed settings, split into those a reload applies and those that need a restart."""
    a, b = _flatten(old.model_dump()), _flatten(new.model_dump())
    changed = sorted({_top(k) for k in a.keys() | b.keys() if a.get(k) != b.get(k)})
    return Changes([k for k in changed if _is_live(k)], [k for k in changed if not _is_live(k)])


def restart_only(old: Config, new: Config) -> Config:
    """`new`, with every restart-only setting kept at its running value (so status tells the truth).

    Built by copying validated objects, not by dumping and re-validating: a round trip through
    `model_dump()` turns unset options into explicit nulls that some validators (rules) refuse.
    """
    merged: Any = new
    for key in describe_changes(old, new).restart_needed:
        merged = _keep(merged, old, key.split("."))
    return cast(Config, merged)


def _keep(new: Any, old: Any, path: list[str]) -> Any:
    """`new` with the value at `path` taken from `old` (through pydantic models and dicts)."""
    head, *rest = path
    if isinstance(new, BaseModel):
        value = getattr(old, head) if not rest else _keep(getattr(new, head), getattr(old, head), rest)
        return new.model_copy(update={head: value})
    if isinstance(new, dict):
        if head not in old:
            return {k: v for k, v in new.items() if k != head}
        return {**new, head: old[head] if not rest or head not in new else _keep(new[head], old[head], rest)}
    return old  # a list or a leaf: keep the running value whole
