"""What every config section shares: strict keys, and the names that end up in topics, URLs and files."""

from __future__ import annotations

import re

import regex
from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


# Names end up in MQTT topics, URLs and file names: anchored, so `#`, `+`, `/`, markup and
# 100-character names are refused (an unanchored pattern let `line#1` through and wedged the outbox).
NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,47}$"
DEVICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # host names carry dots
TOPIC_PIECE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")



def check_topic(value: str, what: str) -> str:
    """A topic prefix: 1-8 `/`-separated pieces, each safe in topics, URLs and file names."""
    pieces = value.rstrip("/").split("/")
    if len(pieces) > 8 or not all(TOPIC_PIECE.fullmatch(p) for p in pieces):
        raise ValueError(f"{what}: use up to 8 '/'-separated pieces of 1-64 letters, digits, '_', '.' "
                         "or '-' (no MQTT wildcards '#' or '+', no empty piece)")
    return value


def check_regex(pattern: str | None) -> str | None:
    """A user's regular expression, compiled once at load so a bad one is a config error naming its key
    (the `regex` package: what the rules engine and the rails run it with)."""
    if pattern is not None:
        try:
            regex.compile(pattern)
        except regex.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
    return pattern
