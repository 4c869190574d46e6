"""A generated labelled set (parts on a belt, every third one scratched) and a second demo bundle."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import pytest
from edge_runtime_models.demo import build_demo_bundle

from edge_runtime.core.samples import part_image


def write_labelled_set(folder: Path, n: int, size: tuple[int, int] = (160, 120)) -> Path:
    """`folder/labels.jsonl` + n JPEGs; part i is bad when i % 3 == 2."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        bad = i % 3 == 2
        cv2.imwrite(str(folder / f"part{i:03d}.jpg"), part_image(i, *size, defect=bad))
        lines.append(json.dumps({"id": f"part{i:03d}", "image": f"part{i:03d}.jpg", "defect": bad,
                                 "category": "scratch" if bad else "none"}))
    (folder / "labels.jsonl").write_text("\n".join(lines) + "\n")
    return folder / "labels.jsonl"


@pytest.fixture(scope="session")
def labelled_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_labelled_set(tmp_path_factory.mktemp("labelled"), 24)


@pytest.fixture(scope="session")
def other_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo architecture quantized Q4_0: other weights, so other verdicts on some images."""
    return build_demo_bundle(tmp_path_factory.mktemp("bundle-q4") / "demo-q4", quant="Q4_0")
