"""Test images: every supported format, plus the broken inputs users really send."""

from __future__ import annotations

import struct
import zlib

import cv2
import numpy as np


def encode(frame: np.ndarray, ext: str) -> bytes:
    ok, buf = cv2.imencode(ext, frame)
    assert ok, ext
    return buf.tobytes()


def synthetic_frames(count: int, seed: int = 0) -> list[np.ndarray]:
    """Noise, gradients and shapes of varied sizes."""
    rng = np.random.default_rng(seed)
    frames = []
    for i in range(count):
        h, w = int(rng.integers(32, 400)), int(rng.integers(32, 400))
        kind = i % 3
        if kind == 0:
            img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        elif kind == 1:
            ramp = np.linspace(0, 255, w, dtype=np.float32)[None, :, None]
            img = np.broadcast_to(ramp * rng.random(3), (h, w, 3)).astype(np.uint8)
        else:
            img = np.full((h, w, 3), rng.integers(0, 256, 3), np.uint8)
            cv2.circle(img, (w // 2, h // 2), min(h, w) // 3, tuple(int(c) for c in rng.integers(0, 256, 3)), -1)
            cv2.rectangle(img, (2, 2), (w // 3, h // 3), (255, 255, 255), 2)
        frames.append(np.ascontiguousarray(img))
    return frames


def png_bomb(width: int = 60000, height: int = 60000) -> bytes:
    """A tiny, well-formed PNG header declaring a huge image (a decompression bomb)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\0" * 1024)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
