"""What the device tells a DDI server when it asks for configuration data (hawkBit's "controller
attributes"): who it is, which agent and release run, and which model bundle (the sha256 of its
bundle.yaml, which pins every model file by its own sha256, so hashing gigabytes is not needed)."""

from __future__ import annotations

from edge_runtime import __version__
from edge_runtime.config import Config
from edge_runtime.core.bundle.manifest import demo_bundle_dir, read_manifest, sha256_file
from edge_runtime.core.errors import BundleError


def bundle_identity(config: Config) -> tuple[str, str]:
    """(name@version, sha256 of bundle.yaml) of the configured bundle, or 'unavailable' twice."""
    root = config.model.path or demo_bundle_dir(config.data_dir)
    try:
        manifest_path, manifest = read_manifest(root)
        return f"{manifest.name}@{manifest.version}", sha256_file(manifest_path)
    except (BundleError, OSError):
        return "unavailable", "unavailable"


def device_attributes(config: Config, running_version: str | None) -> dict[str, str]:
    bundle, digest = bundle_identity(config)
    running = running_version or "unknown"
    return {"device_id": config.device_id, "agent_version": __version__, "running_version": running,
            "sw_version": running,  # the key SWUpdate-style servers (goosebit) read the version from
            "model_bundle": bundle, "model_bundle_sha256": digest}
