"""Update manifests: an image pinned by digest, a version, and an Ed25519 signature by the fleet key.

The signature covers the canonical JSON of every field but `signature` (sorted keys, no spaces), so
any change to the manifest after signing is detected. Keys are raw 32-byte Ed25519 keys, base64.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import semver
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from edge_runtime.core import strict_json

DIGEST_REF = re.compile(r"^[a-z0-9][a-z0-9._:/-]*@sha256:[0-9a-f]{64}$")

MAX_EVALUATION_BYTES = 16 * 1024  # an eval summary is a few KB; the manifest travels over MQTT
# A whole manifest: the summary and the few short fields around it. Anyone who may publish on the
# agent's topic can send one, so it is bounded before it is parsed (and its depth while it is).
MAX_MANIFEST_BYTES = MAX_EVALUATION_BYTES + 48 * 1024
MAX_MANIFEST_DEPTH = 32
MAX_MANIFEST_VALUES = 20_000  # commas, [ and { (counted in C before parsing)


class ManifestRefused(Exception):
    """The manifest must not be applied; the message is the reason reported on MQTT."""


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Bounded: a refusal's reason names the image, and the reason is published (retained) and logged.
    image: str = Field(max_length=512, description="Image reference pinned by digest: repo@sha256:<64 hex>.")
    version: str = Field(max_length=64, description="Semantic version (SemVer 2.0.0).")
    min_agent_version: str | None = Field(None, max_length=64,
                                          description="Oldest agent allowed to apply it (a semantic version).")
    notes: str = Field("", max_length=2000, description="Release notes for the fleet log.")
    evaluation: dict[str, Any] | None = Field(
        None, description="summary.json of `edge-runtime eval` for this release (escape and false-reject "
        "rates as measured); signed with the rest, shown in the agent's status during the rollout.")
    signature: str | None = Field(None, max_length=256, description="base64 Ed25519 signature of the canonical JSON.")

    @field_validator("version", "min_agent_version")
    @classmethod
    def _semver(cls, v: str | None) -> str | None:
        if v is not None:
            version_key(v)  # what is accepted here is what verify() can compare
        return v

    @field_validator("evaluation")
    @classmethod
    def _bounded(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and len(json.dumps(v, ensure_ascii=False)) > MAX_EVALUATION_BYTES:
            raise ValueError(f"at most {MAX_EVALUATION_BYTES // 1024} KiB of JSON")
        return v

    def canonical(self) -> bytes:
        body = self.model_dump(exclude={"signature"}, exclude_none=True)
        return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def version_key(v: str) -> semver.Version:
    """`v` as a key that orders by Semantic Versioning 2.0.0 precedence (semver.org, item 11): a pre-release
    below its release (1.2.0-rc.1 < 1.2.0), its dot-separated identifiers numerically when numeric
    (rc.2 < rc.10), lexically otherwise, numeric below alphanumeric, more of them higher when all before are
    equal; build metadata ignored (1.2.0+a == 1.2.0+b). ValueError when `v` is not a semantic version."""
    try:
        return semver.Version.parse(v)
    except (ValueError, TypeError):
        raise ValueError("not a semantic version (MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD], semver.org)") from None


def generate_keypair() -> tuple[str, str]:
    """(private, public) raw keys, base64."""
    private = Ed25519PrivateKey.generate()
    raw_private = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    raw_public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw_private).decode(), base64.b64encode(raw_public).decode()


def sign(manifest: Manifest, private_key_b64: str) -> Manifest:
    key = Ed25519PrivateKey.from_private_bytes(base64.b64decode(private_key_b64))
    signature = base64.b64encode(key.sign(manifest.canonical())).decode()
    return manifest.model_copy(update={"signature": signature})


def parse(payload: bytes | str | dict[str, Any]) -> Manifest:
    try:
        if isinstance(payload, (bytes, str)):
            if len(payload) > MAX_MANIFEST_BYTES:
                raise ManifestRefused(f"the manifest is larger than {MAX_MANIFEST_BYTES // 1024} KiB")
            data = strict_json.loads(payload, MAX_MANIFEST_DEPTH, MAX_MANIFEST_VALUES)
        else:
            data = payload
        return Manifest.model_validate(data)
    except strict_json.StrictJsonError as exc:  # syntax, nesting (was a RecursionError), a key twice, NaN
        where = f"{exc.field}: " if exc.field else ""
        raise ManifestRefused(f"the manifest is not valid JSON: {where}{exc}") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ManifestRefused(f"invalid manifest: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None


def verify(manifest: Manifest, public_keys_b64: list[str], current_version: str | None, agent_version: str,
           allow_downgrade: bool = False) -> None:
    """Raise ManifestRefused with the reason unless the manifest may be applied."""
    if not manifest.signature:
        raise ManifestRefused("the manifest is not signed")
    if not DIGEST_REF.match(manifest.image):
        raise ManifestRefused(f"image {manifest.image!r} is not pinned by digest (repo@sha256:…)")
    try:
        signature = base64.b64decode(manifest.signature, validate=True)
    except ValueError:
        raise ManifestRefused("the signature is not valid base64") from None
    for key_b64 in public_keys_b64:
        try:
            Ed25519PublicKey.from_public_bytes(base64.b64decode(key_b64)).verify(signature, manifest.canonical())
            break
        except InvalidSignature:
            continue
    else:
        raise ManifestRefused("the signature does not match any trusted fleet key (tampered or wrong key)")
    if manifest.min_agent_version and version_key(agent_version) < version_key(manifest.min_agent_version):
        raise ManifestRefused(f"needs agent {manifest.min_agent_version} or newer; this agent is {agent_version}")
    if current_version and not allow_downgrade:
        try:  # the running container's version label, or the state file's: not checked when it was set
            running = version_key(current_version)
        except ValueError:
            raise ManifestRefused(f"the running version {current_version[:64]!r} is not a semantic version, so "
                                  f"{manifest.version} cannot be checked to be newer (ota.allow_downgrade "
                                  "skips the check)") from None
        if version_key(manifest.version) <= running:
            raise ManifestRefused(f"version {manifest.version} is not newer than the running {current_version} "
                                  "(downgrades need ota.allow_downgrade)")


def load_keys(paths: list[Path]) -> list[str]:
    return [p.read_text().strip() for p in paths]
