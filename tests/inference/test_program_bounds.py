"""Boxes a careless config gives a program: a region or a camera's roi of any size is bounded when the
config is read (x, y >= 0, a pixel at least, inside the largest frame side), and a region, tile or frame
larger than libmtmd ever takes is refused by start and `config validate` in one line naming the program,
the camera and the region, not an unnamed `image: ...` line or an internal error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from edge_runtime.config import CameraConfig, Config, ImageLimits, ProgramConfig
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.core.errors import ConfigError
from edge_runtime.inference.inspector import Inspector
from tests.support.tiny_pairs import TinyPair, write_pair_bundle

HUGE = 10**30


@pytest.mark.parametrize("box", [[0, 0, HUGE, 10], [HUGE, 0, 10, 10], [0, 0, 16385, 10], [16000, 0, 385, 10],
                                 [-1, 0, 10, 10], [0, 0, 0, 10], [0, 0, 10, -5]])
def test_a_region_box_is_bounded_when_the_config_is_read(box: list[int]) -> None:
    with pytest.raises(ValidationError, match=r"region a: box .* at most 16384") as caught:
        ProgramConfig.model_validate({"regions": [{"name": "a", "box": box}]})
    assert str(HUGE) not in str(caught.value)  # a 31-digit number is not echoed whole
    ProgramConfig.model_validate({"regions": [{"name": "a", "box": [16000, 0, 384, 16384]}]})


@pytest.mark.parametrize("roi", [[0, 0, -5, -5], [0, 0, HUGE, 10], [-3, 0, 10, 10], [10, 10, 16384, 16]])
def test_a_cameras_roi_is_bounded_when_the_config_is_read(roi: list[int]) -> None:
    """A negative width used to pass and crop the frame by numpy's negative slicing (all but the last
    five columns); a 31-digit one crashed `config validate` with an internal error."""
    with pytest.raises(ValidationError, match=r"roi .* at most 16384"):
        CameraConfig.model_validate({"name": "c", "source": "x.png", "roi": roi})


def _validate(tmp: Path, data: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    path = tmp / "edge.yaml"
    path.write_text(json.dumps(data))
    return subprocess.run([sys.executable, "-m", "edge_runtime", "config", "validate", str(path)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "EDGE_RUNTIME_DATA": str(tmp)})


def test_a_region_or_tile_libmtmd_never_takes_is_one_line_naming_it_at_start_and_validate(
        tiny_pairs: Callable[[str], TinyPair], tmp_path: Path) -> None:
    bundle = write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp_path / "q")
    cams = [CameraConfig(name="belt", source="x.png", program="p", width=16384, height=16384)]
    cases = {"regions": [{"name": "whole", "box": [0, 0, 10000, 10000]}]}, {"tiling": {"rows": 1, "cols": 2}}
    names = ["region whole of 10000x10000", "region tile_r1_c1 of 8192x16384"]
    settings = Config(device_id="t").model.model_copy(update={"threads": 2, "warmup": False})
    with Inspector(load_bundle(bundle), settings, "t") as ins:
        for case, name in zip(cases, names, strict=True):
            with pytest.raises(ConfigError) as start:  # was InputError 'image: 10000x10000 pixels is outside ...'
                ins.use_programs({"p": ProgramConfig.model_validate(case)}, cams, ImageLimits())
            assert str(start.value).startswith(f"programs.p (camera belt): {name} is ")
            assert "more than the 67108864 libmtmd takes" in str(start.value)
            proc = _validate(tmp_path, {"model": {"path": str(bundle)}, "programs": {"p": case},
                                        "cameras": [c.model_dump(mode="json") for c in cams]})
            assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
                f"edge-runtime: error: {start.value}"], proc.stderr
        ins.use_programs({"p": ProgramConfig.model_validate({"tiling": {"rows": 2, "cols": 2}})}, cams, ImageLimits())
