"""An inspection program's regions drawn on the evidence image: each box in its outcome's colour
(ok green, nok red, none grey) with its name, so a technician sees which screw failed.

The boxes are in the frame the model saw (after the camera's `roi`); when the evidence is the whole
camera frame (`evidence.full_frame`) they are shifted by where that crop lies in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np

# BGR, as OpenCV draws. Distinct in hue so a JPEG's ringing cannot turn one into another.
OUTCOME_BGR: dict[str, tuple[int, int, int]] = {"ok": (0, 200, 0), "nok": (0, 0, 255), "none": (160, 160, 160)}
_MAX_DRAWN = 64  # config allows 32 regions and tiles; a result from elsewhere is bounded here too
_ORDER = {"none": 0, "ok": 1, "nok": 2}  # failures drawn last, on top where boxes overlap


def crop_offset(view: np.ndarray, base: np.ndarray) -> tuple[int, int]:
    """(x, y) of `view` inside `base` when `view` is a slice of it (capture crops by slicing), else (0, 0)."""
    if view is base or view.base is not base or base.ndim < 2 or base.strides[0] <= 0 or base.strides[1] <= 0:
        return 0, 0
    delta = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    y, rest = divmod(delta, base.strides[0])
    x = rest // base.strides[1]
    return (int(x), int(y)) if 0 <= y < base.shape[0] and 0 <= x < base.shape[1] else (0, 0)


def line_width(image: np.ndarray) -> int:
    """Thick enough to survive the thumbnail's downscale on a large frame, thin on a small one."""
    return max(2, round(int(min(image.shape[:2])) / 160))


def draw_regions(image: np.ndarray, regions: Sequence[dict[str, Any]], offset: tuple[int, int] = (0, 0)) -> np.ndarray:
    """A copy of `image` (BGR or grey uint8) with each region's box and name in its outcome's colour;
    the camera's frame itself is never drawn on. A region without a usable box is skipped."""
    out = cv2.cvtColor(image, cv2.COLOR_GRAY2BGR) if image.ndim == 2 else image.copy()
    h, w = out.shape[:2]
    thick = line_width(out)
    scale = max(0.4, min(h, w) / 800)
    drawable = [r for r in regions[:_MAX_DRAWN] if isinstance(r, dict)]
    tabs: list[tuple[str, tuple[int, int], tuple[int, int, int]]] = []
    for region in sorted(drawable, key=lambda r: _ORDER.get(str(r.get("outcome")), 0)):
        box = region.get("box")
        if not (isinstance(box, (list, tuple)) and len(box) == 4 and all(isinstance(v, int) for v in box)):
            continue
        x0, y0 = box[0] + offset[0], box[1] + offset[1]
        x1, y1 = x0 + box[2] - 1, y0 + box[3] - 1
        if x1 < 0 or y1 < 0 or x0 >= w or y0 >= h:
            continue  # outside this image (a region the frame was too small for)
        colour = OUTCOME_BGR.get(str(region.get("outcome")), OUTCOME_BGR["none"])
        cv2.rectangle(out, (x0, y0), (x1, y1), colour, thick)
        tabs.append((str(region.get("name", ""))[:40], (max(0, x0) + thick, max(0, y0) + thick), colour))
    # The names after every box (no line crosses a name), each on a tab of its box's colour inside the
    # box's top-left corner: tiles and named regions that share a corner do not cover each other's names.
    for label, (x, y), colour in tabs:
        (tw, th), base = cv2.getTextSize(label, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)
        x = min(x, max(0, w - tw - 4))
        cv2.rectangle(out, (x, y), (x + tw + 4, y + th + base + 2), colour, cv2.FILLED)
        cv2.putText(out, label, (x + 2, y + th + 1), cv2.FONT_HERSHEY_SIMPLEX, scale, (255, 255, 255), 1,
                    cv2.LINE_AA)
    return out
