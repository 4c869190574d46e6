"""A program's clip as the inspector asks it: the camera's last N frames (capture/clip.py holds them)
encoded one by one through the encoder cache (a frame in several clips is encoded once while the cache
keeps it) and laid out oldest first at the template's image slot, one libmtmd media marker per frame,
as one multi-image prompt."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from edge_runtime.core.batch import ClipFrame, Encoded
from edge_runtime.core.errors import InputError


@dataclass
class ClipEncoded(Encoded):
    """The frames of a clip, oldest first, each encoded; `stamps` are their (seq, captured_at)."""

    frames: list[Encoded] = field(default_factory=list)
    stamps: list[tuple[int, float]] = field(default_factory=list)


def encode_clip(encode: Callable[[np.ndarray], Encoded], camera: str, program: str, wanted: int,
                clip: Sequence[ClipFrame] | None, n_embd: int) -> ClipEncoded:
    """Each frame of `clip` encoded by `encode`, oldest first. InputError naming `clip` when the request
    does not hold the program's `wanted` frames (an API or line request about one frame of a camera
    whose program asks about a clip)."""
    got = len(clip) if clip is not None else 1
    if clip is None or got != wanted:
        raise InputError(f"clip: camera {camera}'s program {program} asks about a clip of {wanted} frames; this "
                         f"request holds {got} (clips come from the camera's own trigger)", field="clip")
    frames = [encode(f.image) for f in clip]
    newest = frames[-1]
    return ClipEncoded(np.zeros((0, n_embd), np.float32), newest.width, newest.height,
                       sum(f.preprocess_ms for f in frames), sum(f.encode_ms for f in frames),
                       frames=frames, stamps=[(f.seq, f.captured_at) for f in clip])


def clip_stamps(enc: Encoded) -> list[dict[str, Any]] | None:
    """What a Result names of its clip: each frame's seq and capture time (RFC 3339 UTC), oldest first."""
    if not isinstance(enc, ClipEncoded):
        return None
    return [{"seq": seq, "captured_at": datetime.fromtimestamp(at, timezone.utc).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")} for seq, at in enc.stamps]
