"""`ota:`: the over-the-air update agent, its sources (MQTT manifests or a hawkBit DDI server) and
the update lock that keeps a swap away from a busy line."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, SecretStr, field_validator, model_validator

from edge_runtime.config.base import DEVICE_ID, TOPIC_PIECE, ConfigPath, Section

_WINDOW = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)$")


def _topic_piece(v: str) -> str:
    # One level of edge/group/<name>/cmd/ota: a "+" there subscribed to every group's releases
    # (signed by the same fleet key, so applied), a "#" made paho raise in on_connect.
    if not TOPIC_PIECE.fullmatch(v):
        raise ValueError("use 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit "
                         "(it is one level of an MQTT topic)")
    return v


GroupName = Annotated[str, AfterValidator(_topic_piece)]


class HawkbitAuthConfig(Section):
    target_token: SecretStr | None = Field(None, description="This device's security token (sent as "
                                           "`Authorization: TargetToken …`); use ${ENV} or a systemd credential.")
    gateway_token: SecretStr | None = Field(None, description="The tenant's gateway token (sent as "
                                            "`Authorization: GatewayToken …`), for servers that authenticate "
                                            "devices by one shared token; ${ENV} or a credential.")

    @model_validator(mode="after")
    def _one_token(self) -> HawkbitAuthConfig:
        if self.target_token is not None and self.gateway_token is not None:
            raise ValueError("give target_token or gateway_token, not both")
        return self


class HawkbitConfig(Section):
    url: str = Field(pattern=r"^https?://[^\s/]+(/\S*)?$", max_length=2048,
                     description="Base URL of the DDI server (Eclipse hawkBit or another DDI server), "
                     "e.g. https://hawkbit.plant.local:8443.")
    tenant: str = Field("DEFAULT", description="The tenant in the DDI path /<tenant>/controller/v1/….")
    controller_id: str | None = Field(None, description="This device's controller id (default: device_id).")
    auth: HawkbitAuthConfig = Field(default_factory=HawkbitAuthConfig,
                                    description="How the device authenticates (none: anonymous DDI).")
    poll_interval_s: float | None = Field(None, ge=1, le=86400, description="Seconds between polls; "
                                          "overrides the server's polling sleep (default: the server's).")
    request_timeout_s: float = Field(30, gt=0, le=600, description="One DDI request or artifact download, "
                                     "in all (every phase, redirects included).")

    @field_validator("tenant")
    @classmethod
    def _path_safe_tenant(cls, v: str) -> str:
        if not TOPIC_PIECE.fullmatch(v):
            raise ValueError("use 1-64 letters, digits, '_', '.' or '-' (it is a URL path segment)")
        return v

    @field_validator("controller_id")
    @classmethod
    def _path_safe_id(cls, v: str | None) -> str | None:
        if v is not None and not DEVICE_ID.fullmatch(v):
            raise ValueError("use 1-64 letters, digits, '_', '.' or '-' (it is a URL path segment)")
        return v


class OtaConfig(Section):
    container: str = Field("edge-runtime", description="Name of the daemon's container the agent updates.")
    public_keys: list[str] = Field(default_factory=list, description="Trusted fleet keys (base64 Ed25519 "
                                   "public keys); manifests signed by any other key are refused.")
    groups: list[GroupName] = Field(default_factory=list, max_length=32, description="Fleet groups: manifests "
                                    "published to edge/group/<name>/cmd/ota also reach this device.")
    manifest_url: str | None = Field(None, pattern=r"^https?://[^\s/]+(/\S*)?$", max_length=2048,
                                     description="HTTP(S) URL polled for a manifest (besides MQTT).")
    poll_interval_s: float = Field(300, ge=10, description="Seconds between polls of manifest_url.")
    health_timeout_s: float = Field(120, gt=0, description="How long a candidate has to turn healthy.")
    allow_downgrade: bool = Field(False, description="Accept manifests whose version is not newer.")
    state_dir: ConfigPath | None = Field(None, description="Where the agent keeps its state (default <data_dir>/ota).")
    hawkbit: HawkbitConfig | None = Field(None, description="Take releases from a hawkBit DDI server instead "
                                          "of MQTT manifests (docs/ota.md); one source at a time.")
    lock_file: ConfigPath | None = Field(None, description="Update lock: the daemon holds a shared lock on this file "
                                   "while a line station has a job in flight, and the agent's swap waits for "
                                   "it (a path both see, e.g. on the data volume).")
    maintenance_window: list[str] = Field(default_factory=list, max_length=24, description="Quiet windows "
                                          "'HH:MM-HH:MM' (local time; may cross midnight) in which a swap may "
                                          "start; empty: any time.")
    lock_max_wait_s: float = Field(3600, ge=0, le=7 * 86400, description="Longest a swap waits for the "
                                   "line or the window, after the image was pulled.")
    on_lock_timeout: Literal["fail", "proceed"] = Field("fail", description="After lock_max_wait_s: fail "
                                                        "the update (the line wins) or swap anyway.")

    @field_validator("maintenance_window")
    @classmethod
    def _windows(cls, v: list[str]) -> list[str]:
        for i, window in enumerate(v):
            if not _WINDOW.match(window):
                raise ValueError(f"item {i}: {window[:40]!r} is not 'HH:MM-HH:MM' (24-hour clock)")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> OtaConfig:
        if self.hawkbit is not None and (self.manifest_url or self.groups):
            raise ValueError("ota.hawkbit takes releases from the DDI server: leave manifest_url and groups "
                             "empty (a device uses one source at a time)")
        return self
