"""What the daemon replaces while it runs, shared by the parts that read it (status, reload)."""

from __future__ import annotations

from dataclasses import dataclass, field

from edge_runtime.capture.rig import CameraRig
from edge_runtime.config import Config
from edge_runtime.inference.inspector import Inspector


@dataclass
class Running:
    """The config in effect, the last accepted file, the loaded model and the camera rigs.

    Each is replaced whole, never mutated (a reload or a camera start publishes a new `rigs` dict), so
    a reader that took one value iterates a snapshot no other thread changes."""

    config: Config
    file_config: Config  # what the next reload is compared with (app/reload.py, config/reload_guard.py)
    inspector: Inspector | None = None
    rigs: dict[str, CameraRig] = field(default_factory=dict)
