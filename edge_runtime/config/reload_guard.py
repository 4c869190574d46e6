"""Which reloads are refused although the file is valid: those that drop a protection or every camera.

A file that lost lines (cut short by a full disk, a half-finished copy, an editor's mistake) is still
valid YAML, and each missing key reads as its default: no API token, reads open, plain-text MQTT, no
cameras. Applied by a SIGHUP that would open the device and stop the line without a word. So a reload
is refused, like a deleted file, when a protection that the last accepted file had is *missing* from
the new one (and when the device's name is: a device that renames itself to its host name leaves its
fleet). An operator who means it writes the key with its new value (`api: {token: null}`,
`api: {auth: writes}`, `mqtt: {tls: {enabled: false}}`, `cameras: []`): a key written in the file is a
decision, a key that vanished is not. Rotating a token (a new value) is always accepted.

Line I/O needs no guard: its defaults are the secure ones (Basic256Sha256 only, no anonymous login,
Modbus from loopback only, no Sparkplug DCMD writes), so a key that vanishes can only tighten it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, SecretStr

from edge_runtime.config import Config


def _secret(value: Any) -> bool:
    """A secret that is set: SecretStr("") (an unset `${VAR:-}`) counts as not set."""
    if isinstance(value, SecretStr):
        return bool(value.get_secret_value())
    return bool(value)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Protection:
    """One setting that a reload may not lose by omission: `lost(old, new)` says whether it went."""

    path: tuple[str, ...]
    lost: Callable[[Any, Any], bool]
    explicit_value: str  # what to write to mean it


PROTECTIONS = (
    # Not a protection but the device's name in every topic, result and fleet table: a file that lost it
    # would rename the device to its host name.
    Protection(("device_id",), lambda old, new: old != new, "<the new name>"),
    Protection(("api", "token"), lambda old, new: _secret(old) and not _secret(new), "null"),
    Protection(("api", "auth"), lambda old, new: old == "all" and new != "all", "writes"),
    Protection(("api", "host"), lambda old, new: _loopback(old) and not _loopback(new), "0.0.0.0"),
    Protection(("mqtt", "username"), lambda old, new: bool(old) and not new, "null"),
    Protection(("mqtt", "password"), lambda old, new: _secret(old) and not _secret(new), "null"),
    Protection(("mqtt", "tls", "enabled"), lambda old, new: bool(old) and not new, "false"),
    Protection(("mqtt", "tls", "cert_file"), lambda old, new: old is not None and new is None, "null"),
    Protection(("mqtt", "tls", "key_file"), lambda old, new: old is not None and new is None, "null"),
)


def _value(config: BaseModel, path: tuple[str, ...]) -> Any:
    value: Any = config
    for key in path:
        value = getattr(value, key)
    return value


def written(config: BaseModel, path: tuple[str, ...]) -> bool:
    """Whether the file that made `config` wrote the key at `path` (pydantic's fields_set, section by
    section), as opposed to taking its default."""
    node: Any = config
    for key in path:
        if not isinstance(node, BaseModel) or key not in node.model_fields_set:
            return False
        node = getattr(node, key)
    return True


def _deliberate(new: Config, p: Protection) -> bool:
    if not written(new, p.path):
        return False
    value = _value(new, p.path)
    # "" is what an unset `${VAR:-}` gives: only a value written as such (e.g. `null`) is a decision.
    return (value.get_secret_value() if isinstance(value, SecretStr) else value) != ""


def refusal(old: Config, new: Config, old_file_cameras: list[str]) -> str | None:
    """Why `new` (as read from the file) may not replace `old` (the last accepted file), or None.

    `old_file_cameras`: the cameras `old`'s file defined (not those the command line added)."""
    lost = [p for p in PROTECTIONS
            if p.lost(_value(old, p.path), _value(new, p.path)) and not _deliberate(new, p)]
    problems = [".".join(p.path) for p in lost]
    hints = [f"{'.'.join(p.path)}: {p.explicit_value}" for p in lost]
    if old_file_cameras and not new.cameras and not written(new, ("cameras",)):
        shown = ", ".join(old_file_cameras[:5]) + (" …" if len(old_file_cameras) > 5 else "")
        problems.append(f"every camera ({shown})")
        hints.append("cameras: []")
    if not problems:
        return None
    return (f"it drops {', '.join(problems)} (missing from the file, not set there); if that is meant, "
            f"write it explicitly ({'; '.join(hints)}) and reload again")
