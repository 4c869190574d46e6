"""The per-patch distances as an image: a heat map in frame pixels, and an overlay for evidence.

Each placed block's grid of distances is stretched over its box in the frame (bilinear, so the map
is smooth between patch centres); where blocks overlap (tiles and the global image) the larger value
wins. The overlay colours only what comes near the threshold: a good part's evidence stays a clean
picture, and a defect shows as a warm patch over it.
"""

from __future__ import annotations

import cv2
import numpy as np

from edge_runtime.inference.anomaly.gate import GateScore

MAX_HEAT_PIXELS = 50_000_000  # a heat map is one float per frame pixel: bounded like images.max_pixels


def heat_map(result: GateScore) -> np.ndarray:
    """[H, W] float32 of the frame: each pixel the distance of the patch over it (0 where none is)."""
    lay = result.layout
    if lay.width * lay.height > MAX_HEAT_PIXELS:
        raise ValueError(f"a {lay.width}x{lay.height} heat map is over {MAX_HEAT_PIXELS} pixels")
    heat = np.zeros((lay.height, lay.width), np.float32)
    start = 0
    for b in lay.blocks:
        grid = result.distances[start:start + b.size].reshape(b.rows, b.cols)
        start += b.size
        if b.box is None:
            continue
        x0, y0, x1, y1 = b.box
        w, h = max(1, round(x1 - x0)), max(1, round(y1 - y0))
        block = cv2.resize(grid, (w, h), interpolation=cv2.INTER_LINEAR)
        # Paste the part of the block that lies inside the frame (a letterbox reaches past it).
        fx0, fy0 = max(0, round(x0)), max(0, round(y0))
        fx1, fy1 = min(lay.width, round(x0) + w), min(lay.height, round(y0) + h)
        if fx1 <= fx0 or fy1 <= fy0:
            continue
        bx0, by0 = fx0 - round(x0), fy0 - round(y0)
        region = heat[fy0:fy1, fx0:fx1]
        np.maximum(region, block[by0:by0 + (fy1 - fy0), bx0:bx0 + (fx1 - fx0)], out=region)
    return heat


def overlay_heat(image: np.ndarray, heat: np.ndarray, threshold: float, alpha: float = 0.6) -> np.ndarray:
    """`image` (BGR uint8, the frame the heat map is of) with the heat map laid over it.

    Colour starts at 3/4 of the threshold (transparent) and is full at 1.5x the threshold (red, at
    `alpha` opacity); below 3/4 of the threshold, where good parts' patches lie, the image is untouched."""
    if image.shape[:2] != heat.shape:
        heat = cv2.resize(heat, (image.shape[1], image.shape[0]), interpolation=cv2.INTER_LINEAR)
    level = np.clip((heat / max(threshold, 1e-9) - 0.75) / 0.75, 0.0, 1.0)
    colour = cv2.applyColorMap((level * 255).astype(np.uint8), cv2.COLORMAP_JET)
    weight = (alpha * level)[..., None]
    base = image if image.ndim == 3 else cv2.cvtColor(image, cv2.COLOR_GRAY2BGR)
    out = base.astype(np.float32) * (1 - weight) + colour.astype(np.float32) * weight
    return np.clip(out, 0, 255).astype(np.uint8)
