"""`ota:`: the over-the-air update agent."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from edge_runtime.config.base import Section


class OtaConfig(Section):
    container: str = Field("edge-runtime", description="Name of the daemon's container the agent updates.")
    public_keys: list[str] = Field(default_factory=list, description="Trusted fleet keys (base64 Ed25519 "
                                   "public keys); manifests signed by any other key are refused.")
    groups: list[str] = Field(default_factory=list, description="Fleet groups: manifests published to "
                              "edge/group/<name>/cmd/ota also reach this device.")
    manifest_url: str | None = Field(None, pattern=r"^https?://[^\s/]+(/\S*)?$", max_length=2048,
                                     description="HTTP(S) URL polled for a manifest (besides MQTT).")
    poll_interval_s: float = Field(300, ge=10, description="Seconds between polls of manifest_url.")
    health_timeout_s: float = Field(120, gt=0, description="How long a candidate has to turn healthy.")
    allow_downgrade: bool = Field(False, description="Accept manifests whose version is not newer.")
    state_dir: Path | None = Field(None, description="Where the agent keeps its state (default <data_dir>/ota).")
