"""The release a DDI server hands out: our signed manifest, as it is, or wrapped in an SWUpdate `.swu`
file (a cpio "newc" archive whose first member is `sw-description`) for servers that only store
`.swu`/RAUC bundles (goosebit). The wrapper carries no trust: the manifest inside is verified with the
fleet keys like any other, so whatever the server (or a man in the middle) changes is refused.
"""

from __future__ import annotations

import json

SWU_MANIFEST = "manifest.signed.json"
_NEWC = (b"070701", b"070702")
_HEADER = 110
_MAX_MEMBERS = 16


class ArtifactRefused(Exception):
    """The artifact holds no manifest of ours; the message says why (reported as a refusal)."""


def manifest_from_artifact(data: bytes) -> bytes:
    """The signed manifest's bytes: the artifact itself when it is JSON, else the `.swu` member."""
    if data[:6] in _NEWC:
        return _from_swu(data)
    if data.lstrip()[:1] == b"{":
        return data
    raise ArtifactRefused("the artifact is neither a signed manifest (JSON) nor a .swu holding one")


def _from_swu(data: bytes) -> bytes:
    offset = 0
    for _ in range(_MAX_MEMBERS):
        header = data[offset:offset + _HEADER]
        if len(header) < _HEADER or header[:6] not in _NEWC:
            raise ArtifactRefused("the .swu artifact is truncated or not a cpio newc archive")
        try:
            size = int(header[54:62], 16)
            name_size = int(header[94:102], 16)
        except ValueError:
            raise ArtifactRefused("the .swu artifact has a malformed cpio header") from None
        name_end = offset + _HEADER + name_size
        name = data[offset + _HEADER:name_end].rstrip(b"\0").decode("utf-8", "replace")
        start = _align(name_end)
        end = start + size
        if name_size == 0 or end > len(data):
            raise ArtifactRefused("the .swu artifact is truncated")
        if name == "TRAILER!!!":
            break
        if name == SWU_MANIFEST:
            return data[start:end]
        offset = _align(end)
    raise ArtifactRefused(f"the .swu artifact has no {SWU_MANIFEST}")


def _align(n: int) -> int:
    return (n + 3) & ~3


def _member(name: str, body: bytes, ino: int) -> bytes:
    encoded = name.encode() + b"\0"
    fields = [ino, 0o100644, 0, 0, 1, 0, len(body), 0, 0, 0, 0, len(encoded), 0]
    header = b"070701" + b"".join(b"%08X" % f for f in fields)
    out = header + encoded
    out += b"\0" * (_align(len(out)) - len(out))
    out += body
    return out + b"\0" * (_align(len(out)) - len(out))


def build_swu(manifest: bytes, version: str) -> bytes:
    """A `.swu` whose `sw-description` names the release version (what a server sorts and shows) and
    whose second member is the signed manifest."""
    description = ("software =\n{\n\tversion = " + json.dumps(version) + ";\n"
                   "\tdescription = \"edge-runtime release (signed OTA manifest)\";\n};\n").encode()
    return _member("sw-description", description, 1) + _member(SWU_MANIFEST, manifest, 2) + _member(
        "TRAILER!!!", b"", 0)
