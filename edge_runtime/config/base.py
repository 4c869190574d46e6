"""What every config section shares: strict keys, and the names that end up in topics, URLs and files."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, TypeVar

import regex
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo


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


# Validation context keys (schema.parse_config passes them): the folder the config file was read from, and
# a list that collects each relative path with what it was read as (what `config validate` shows).
CONFIG_DIR = "config_dir"
RESOLVED = "resolved"
_P = TypeVar("_P", str, Path)


def config_dir(info: ValidationInfo) -> Path | None:
    """The folder of the config file being validated; None for a config not read from a file."""
    context: Any = info.context
    base = context.get(CONFIG_DIR) if isinstance(context, dict) else None
    return Path(base) if base is not None else None


def beside_config(value: _P, info: ValidationInfo) -> _P:
    """A path written in the config file, read from the file's folder: a relative `models/x` in
    /etc/edge-runtime/config.yaml is /etc/edge-runtime/models/x whatever the daemon's working directory
    (`/` under systemd). Absolute and `~` paths are kept as written, and so is every path of a config
    not read from a file (no folder in the validation context: it stays relative to the working directory)."""
    base = config_dir(info)
    text = str(value)
    if base is None or not text or text.startswith("~") or Path(text).is_absolute():
        return value
    joined = base / text
    resolved = info.context.get(RESOLVED) if isinstance(info.context, dict) else None
    if isinstance(resolved, list):
        resolved.append((text, str(joined)))
    return joined if isinstance(value, Path) else str(joined)


# Every path-valued field of the configuration is one of these two (tests/config/test_config_paths.py
# checks that no plain Path field is left): the only place relative paths are resolved.
ConfigPath = Annotated[Path, AfterValidator(beside_config)]
ConfigPathText = Annotated[str, AfterValidator(beside_config)]  # a path kept as text (gate banks)
