"""A frame or chat completion as the inspection worker batches it: encoded, with what its Result records.
In core, not inference/, so the anomaly gate, evaluation and tests take them without loading the engines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_runtime.core.device import ChatJob


@dataclass
class Encoded:
    """The output of the first half: image embeddings plus what the Result needs of the frame."""

    embeds: np.ndarray  # [T*N, D]: N embeddings per tile, T tiles (1 unless the bundle tiles)
    width: int
    height: int
    preprocess_ms: float
    encode_ms: float
    grid: tuple[int, int] = (0, 0)  # tile rows, cols; (0, 0) for one untiled image


@dataclass(frozen=True)
class ClipFrame:
    """One frame of a program's clip (capture/clip.py): its pixels, capture sequence number and
    time.time() of its read."""

    image: np.ndarray
    seq: int
    captured_at: float


@dataclass
class BatchJob:
    """One frame of a batched inspection: already encoded, plus what its Result records."""

    encoded: Encoded
    camera: str
    prompt: str | None = None
    seq: int = 0
    capture_ms: float = 0.0
    governor: dict[str, Any] | None = None
    schema: dict[str, Any] | None = None  # the verdict's own JSON schema (a station's recipe); None: the bundle's
    program: str | None = None  # the inspection program by name (a station's recipe); None: the camera's


@dataclass
class ChatWork:
    """A chat completion in the worker's batch: the job, with its image already encoded (None: not
    encoded ahead, or no image)."""

    job: ChatJob
    encoded: Encoded | None = None
