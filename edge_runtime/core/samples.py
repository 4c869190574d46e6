"""Generated sample inputs: a part on a conveyor (image) and moving parts (video), no downloads."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np


def part_image(seed: int = 0, width: int = 640, height: int = 480, defect: bool = False) -> np.ndarray:
    """A metal part on a belt; with `defect` a dark scratch crosses it. BGR uint8."""
    rng = np.random.default_rng(seed)
    img = np.full((height, width, 3), (60, 60, 64), np.uint8)
    img[:] += rng.integers(0, 12, (height, width, 1), dtype=np.uint8)  # belt texture
    cx, cy = width // 2 + int(rng.integers(-40, 40)), height // 2 + int(rng.integers(-30, 30))
    r = min(width, height) // 4
    cv2.circle(img, (cx, cy), r, (180, 182, 190), -1, cv2.LINE_AA)
    cv2.circle(img, (cx, cy), r // 3, (40, 40, 40), -1, cv2.LINE_AA)  # bore
    for k in range(6):  # bolt holes
        a = k * np.pi / 3
        cv2.circle(img, (int(cx + 0.66 * r * np.cos(a)), int(cy + 0.66 * r * np.sin(a))), r // 10,
                   (70, 70, 75), -1, cv2.LINE_AA)
    if defect:
        cv2.line(img, (cx - r // 2, cy - r // 2), (cx + r // 3, cy + r // 2), (30, 30, 35), 3, cv2.LINE_AA)
    return img


def write_sample_video(path: Path, frames: int = 120, fps: int = 10, width: int = 320,
                       height: int = 240) -> Path:
    """Parts sliding across the frame, every third one scratched: visible change for on_change."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), fps, (width, height))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write {path}")
    try:
        for i in range(frames):
            img = np.full((height, width, 3), (60, 60, 64), np.uint8)
            part, x = divmod(i, 30)
            cx = int(-40 + x * (width + 80) / 30)
            cv2.circle(img, (cx, height // 2), 45, (180, 182, 190), -1, cv2.LINE_AA)
            cv2.circle(img, (cx, height // 2), 15, (40, 40, 40), -1, cv2.LINE_AA)
            if part % 3 == 2:
                cv2.line(img, (cx - 25, height // 2 - 25), (cx + 20, height // 2 + 28), (30, 30, 35), 3)
            cv2.putText(img, f"part {part + 1}", (8, 20), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (220, 220, 220), 1)
            writer.write(img)
    finally:
        writer.release()
    return path
