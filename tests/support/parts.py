"""Synthetic parts for the anomaly gate's tests and benchmarks: a machined plate in its fixture, and
defects drawn on it (scratch, missing hole, stain) at a chosen size. Deterministic by seed.

A good part varies the way a real station's parts do: a few pixels of placement in the fixture, a
fraction of a degree of rotation, a few percent of light, sensor noise and the brushed texture of the
metal. A defect is drawn on the same clean part and comes back with its bounding box in frame pixels,
so a test can check that the heat map points at it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import cv2
import numpy as np

DefectKind = Literal["scratch", "missing_hole", "stain"]
DEFECT_KINDS: tuple[DefectKind, ...] = ("scratch", "missing_hole", "stain")
_PLATE = (176, 180, 186)  # BGR: bare aluminium
_BELT = (58, 60, 64)


@dataclass(frozen=True)
class Defect:
    """What was drawn: its kind, its size in frame pixels and its bounding box (x, y, w, h)."""

    kind: DefectKind
    size: int
    box: tuple[int, int, int, int]


@dataclass(frozen=True)
class _Layout:
    """Where the plate and its features sit in one part's frame (after the part's own jitter)."""

    plate: tuple[int, int, int, int]  # x0, y0, x1, y1
    holes: tuple[tuple[int, int, int], ...]  # (cx, cy, radius): four corner holes, a row of small ones
    bore: tuple[int, int, int]
    label: tuple[int, int, int, int]  # x0, y0, x1, y1


# The row of small holes along the bottom edge, diameters as a share of the frame's width: missing
# holes come in these sizes (and in the corner holes' size).
_ROW_HOLES = (0.025, 0.04, 0.06)


def _layout(rng: np.random.Generator, width: int, height: int) -> _Layout:
    x0, y0 = int(width * 0.12), int(height * 0.12)
    x1, y1 = int(width * 0.88), int(height * 0.88)
    pw, ph = x1 - x0, y1 - y0
    r = max(2, round(min(pw, ph) * 0.06))
    corners = [(x0 + int(pw * fx), y0 + int(ph * fy), r) for fx, fy in ((0.12, 0.14), (0.88, 0.14),
                                                                       (0.12, 0.86), (0.88, 0.86))]
    row = [(x0 + int(pw * fx), y0 + int(ph * 0.88), max(1, round(width * d / 2)))
           for fx, d in zip((0.40, 0.52, 0.66), _ROW_HOLES, strict=True)]
    bore = (x0 + int(pw * 0.30), y0 + int(ph * 0.52), max(3, round(min(pw, ph) * 0.13)))
    label = (x0 + int(pw * 0.56), y0 + int(ph * 0.36), x0 + int(pw * 0.86), y0 + int(ph * 0.60))
    return _Layout((x0, y0, x1, y1), (*corners, *row), bore, label)


def _draw_part(rng: np.random.Generator, width: int, height: int) -> tuple[np.ndarray, _Layout]:
    lay = _layout(rng, width, height)
    base = np.empty((height, width, 3), np.float32)
    base[:] = _BELT
    base += rng.normal(0, 3, (height, width, 1)).astype(np.float32)  # belt texture
    x0, y0, x1, y1 = lay.plate
    plate = np.empty((y1 - y0, x1 - x0, 3), np.float32)
    plate[:] = _PLATE
    # Brushed metal: fine horizontal streaks that differ from part to part.
    streaks = rng.normal(0, 4, (y1 - y0, 1, 1)).astype(np.float32)
    plate += cv2.GaussianBlur(streaks, (1, 3), 0).reshape(-1, 1, 1)
    base[y0:y1, x0:x1] = plate
    img = np.clip(base, 0, 255).astype(np.uint8)  # OpenCV draws text on 8-bit images only
    cv2.rectangle(img, (x0, y0), (x1 - 1, y1 - 1), (120, 122, 128), max(1, width // 160))  # chamfer edge
    for cx, cy, r in (*lay.holes, lay.bore):
        cv2.circle(img, (cx, cy), r + max(1, r // 4), (140, 142, 148), -1, cv2.LINE_AA)  # countersink
        cv2.circle(img, (cx, cy), r, (34, 34, 38), -1, cv2.LINE_AA)
    lx0, ly0, lx1, ly1 = lay.label
    cv2.rectangle(img, (lx0, ly0), (lx1, ly1), (236, 238, 240), -1)
    bar_w = max(1, (lx1 - lx0) // 40)
    for i in range(0, int((lx1 - lx0) * 0.8), 2 * bar_w):  # a barcode: the same code on every part
        if (i // (2 * bar_w)) % 3 != 1:
            cv2.rectangle(img, (lx0 + 4 + i, ly0 + (ly1 - ly0) // 2), (lx0 + 4 + i + bar_w - 1, ly1 - 4),
                          (20, 20, 20), -1)
    scale = max(0.25, (lx1 - lx0) / 160)
    cv2.putText(img, "LOT 42", (lx0 + 4, ly0 + (ly1 - ly0) // 3), cv2.FONT_HERSHEY_SIMPLEX, scale,
                (20, 20, 20), 1, cv2.LINE_AA)
    return img.astype(np.float32), lay


def _finish(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The station's variation on top of the part: its placement in the fixture (a pixel or so) and a
    small rotation, the light, sensor noise."""
    h, w = img.shape[:2]
    angle = float(rng.uniform(-0.6, 0.6))
    m = cv2.getRotationMatrix2D((w / 2, h / 2), angle, 1.0)
    m[:, 2] += rng.uniform(-1.5, 1.5, 2) * w / 224
    img = cv2.warpAffine(img, m, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    img = img * float(rng.uniform(0.96, 1.04)) + rng.normal(0, 2.0, img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def clean_part(seed: int, width: int = 224, height: int = 224) -> np.ndarray:
    """A good part (BGR uint8); the same seed gives the same image."""
    rng = np.random.default_rng([seed, 1])
    img, _ = _draw_part(rng, width, height)
    return _finish(img, rng)


def defective_part(seed: int, kind: DefectKind, size: int, width: int = 224, height: int = 224
                   ) -> tuple[np.ndarray, Defect]:
    """The part of `seed` with one defect of about `size` frame pixels: a scratch's length, a stain's
    diameter, or the diameter of the hole left undrilled (the part's hole nearest that size; the
    returned `Defect.size` is the hole's real diameter)."""
    if kind not in DEFECT_KINDS:
        raise ValueError(f"unknown defect kind {kind!r}")
    rng = np.random.default_rng([seed, 1])
    img, lay = _draw_part(rng, width, height)
    place = np.random.default_rng([seed, 2, DEFECT_KINDS.index(kind), size])
    x0, y0, x1, y1 = lay.plate
    if kind == "missing_hole":
        # The hole nearest this size was not drilled: the plate is whole where it should be.
        nearest = min(abs(2 * h[2] - size) for h in lay.holes)
        options = [h for h in lay.holes if abs(2 * h[2] - size) == nearest]
        cx, cy, r = options[int(place.integers(0, len(options)))]
        cv2.circle(img, (cx, cy), r + max(1, r // 4) + 1, _PLATE, -1, cv2.LINE_AA)
        size = 2 * r
        box = (cx - r, cy - r, 2 * r + 1, 2 * r + 1)
    elif kind == "scratch":
        # On the open metal above the bore and left of the label, away from the holes.
        cx = int(place.integers(x0 + (x1 - x0) * 3 // 10, x0 + (x1 - x0) * 5 // 10))
        cy = int(place.integers(y0 + (y1 - y0) * 16 // 100, y0 + (y1 - y0) * 28 // 100))
        a = float(place.uniform(0.2, 1.2))
        ddx, ddy = round(float(np.cos(a)) * size / 2), round(float(np.sin(a)) * size / 2)
        thick = max(2, size // 12)
        cv2.line(img, (cx - ddx, cy - ddy), (cx + ddx, cy + ddy), (64, 64, 70), thick, cv2.LINE_AA)
        cv2.line(img, (cx - ddx, cy - ddy + thick), (cx + ddx, cy + ddy + thick), (230, 232, 236), 1, cv2.LINE_AA)
        xs, ys = sorted((cx - ddx, cx + ddx)), sorted((cy - ddy, cy + ddy + thick))
        box = (xs[0] - thick, ys[0] - thick, xs[1] - xs[0] + 2 * thick + 1, ys[1] - ys[0] + 2 * thick + 1)
    else:  # stain: an oily, soft-edged blotch
        cx = int(place.integers(x0 + (x1 - x0) * 3 // 10, x0 + (x1 - x0) * 5 // 10))
        cy = int(place.integers(y0 + (y1 - y0) * 16 // 100, y0 + (y1 - y0) * 28 // 100))
        r = max(1, size // 2)
        mask = np.zeros(img.shape[:2], np.float32)
        cv2.ellipse(mask, (cx, cy), (r, max(1, r * 3 // 4)), float(place.uniform(0, 180)), 0, 360, 1.0, -1,
                    cv2.LINE_AA)
        soft = cv2.GaussianBlur(mask, (0, 0), max(0.5, r / 4))[..., None]
        img = img * (1 - 0.75 * soft) + np.array((40, 62, 92), np.float32) * 0.75 * soft
        box = (cx - r, cy - r, 2 * r + 1, 2 * r + 1)
    return _finish(img, rng), Defect(kind, size, box)
