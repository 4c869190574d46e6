"""An inspection program's regions on the evidence image (verdicts/region_marks.py through the verdict
stage and the real evidence store): each box drawn in its outcome's colour, found again in the decoded
JPEG; shifted by the camera's crop when the whole frame is kept; the camera's frame never drawn on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np

from edge_runtime.config import EvidenceConfig
from edge_runtime.core.result import FrameInfo, Result
from edge_runtime.delivery.mqtt.outbox import MessageOutbox
from edge_runtime.verdicts.region_marks import OUTCOME_BGR, crop_offset
from edge_runtime.verdicts.stage import VerdictServices


class _Webhooks:
    headers_for: Any = None


REGIONS: list[dict[str, Any]] = [
    {"name": "screw", "box": [40, 60, 120, 100], "verdict": {"defect": False}, "text": "", "outcome": "ok",
     "error": None},
    {"name": "label", "box": [300, 200, 200, 150], "verdict": {"defect": True}, "text": "", "outcome": "nok",
     "error": None},
    {"name": "tile_r1_c1", "box": [200, 330, 80, 70], "verdict": None, "text": "", "outcome": "none",
     "error": "the verdict has no 'defect' field"},
]


def services(tmp_path: Path, **evidence: Any) -> VerdictServices:
    cfg = EvidenceConfig(keep_passes=1, **evidence)
    return VerdictServices(cfg, [], tmp_path, tmp_path / "j.sqlite3", set(), lambda: None,
                           webhooks=_Webhooks(), messages=MessageOutbox(tmp_path / "j.sqlite3"))  # type: ignore[arg-type]


def kept_image(svc: VerdictServices, image: np.ndarray, regions: list[dict[str, Any]] | None) -> np.ndarray:
    result = Result(device="d", camera="c", frame=FrameInfo(1, image.shape[1], image.shape[0]),
                    verdict={"defect": True}, text="", model="m", timings_ms={}, prompt="", regions=regions)
    svc.before_journal(image, result)
    assert svc.evidence is not None and result.evidence is not None
    found = svc.evidence.lookup(result.id)
    assert found is not None
    decoded = cv2.imdecode(np.frombuffer(found.path.read_bytes(), np.uint8), cv2.IMREAD_COLOR)
    assert decoded is not None
    return decoded


def edge_points(box: list[int], offset: tuple[int, int] = (0, 0)) -> list[tuple[int, int]]:
    """(x, y) on the middle of the left, right and bottom edges (the name's tab may cover the top)."""
    x, y, w, h = box
    x, y = x + offset[0], y + offset[1]
    return [(x, y + h // 2), (x + w - 1, y + h // 2), (x + w // 2, y + h - 1)]


def near(pixel: np.ndarray, bgr: tuple[int, int, int], tol: int = 60) -> bool:
    return bool(np.all(np.abs(pixel.astype(int) - np.array(bgr)) <= tol))


def background(h: int = 480, w: int = 640) -> np.ndarray:
    frame = np.zeros((h, w, 3), np.uint8)
    frame[:] = (90, 40, 20)  # dark blue: none of the outcome colours
    return frame


def test_each_region_is_drawn_on_the_evidence_jpeg_in_its_outcome_colour(tmp_path: Path) -> None:
    frame = background()
    untouched = frame.copy()
    image = kept_image(services(tmp_path), frame, REGIONS)
    for region in REGIONS:
        colour = OUTCOME_BGR[region["outcome"]]
        for x, y in edge_points(region["box"]):
            assert near(image[y, x], colour), (region["name"], (x, y), image[y, x].tolist())
    # Inside a box, away from its edges and name, the frame is as captured.
    assert near(image[130, 100], (90, 40, 20), 20)
    assert np.array_equal(frame, untouched)  # the camera's frame itself is never drawn on


def test_without_regions_or_with_drawing_off_the_evidence_is_the_frame(tmp_path: Path) -> None:
    frame = background()
    for image in (kept_image(services(tmp_path / "a"), frame, None),
                  kept_image(services(tmp_path / "b", draw_regions=False), frame, REGIONS)):
        for region in REGIONS:
            for x, y in edge_points(region["box"]):
                assert near(image[y, x], (90, 40, 20), 20)


def test_full_frame_evidence_shifts_the_boxes_by_the_cameras_crop(tmp_path: Path) -> None:
    camera = background(720, 1280)
    roi = camera[100:580, 200:840]  # how capture cuts a camera's roi: a view of the frame
    assert crop_offset(roi, camera) == (200, 100) and crop_offset(roi.copy(), camera) == (0, 0)
    image = kept_image(services(tmp_path, full_frame=True), roi, REGIONS)
    assert image.shape == camera.shape
    for region in REGIONS:
        for x, y in edge_points(region["box"], (200, 100)):
            assert near(image[y, x], OUTCOME_BGR[region["outcome"]]), region["name"]
        for x, y in edge_points(region["box"]):  # not where the crop's coordinates would put them
            assert not near(image[y, x], OUTCOME_BGR[region["outcome"]]), region["name"]
