"""Fixtures shared by the offload tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_runtime.core.samples import write_sample_video


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A looping source for remote cameras: 60 generated 320x240 frames of parts."""
    return write_sample_video(tmp_path_factory.mktemp("video") / "parts.avi", frames=60)
