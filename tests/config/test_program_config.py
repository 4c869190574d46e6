"""What a program needs is refused alike by `config validate`, start and reload (one line, exit 2 for
validate): a region's verdict schema that is not a usable JSON schema, a nok_field that is not a boolean
property of the schema the regions' rule reads, references or an image_tokens.max the bundle cannot take.
Each used to pass validate (and some start and reload) and then fail every frame."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edge_runtime.config import CameraConfig, Config, ImageLimits, ProgramConfig, parse_config
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.core.errors import ConfigError
from edge_runtime.inference.inspector import Inspector
from tests.support.tiny_pairs import TinyPair, write_pair_bundle

REGION = {"name": "left", "box": [0, 0, 100, 100]}
SCHEMA = {"type": "object", "properties": {"defect": {"type": "boolean"}, "note": {"type": "string"}},
          "required": ["defect"]}


def program_yaml(program: dict[str, Any]) -> str:
    return json.dumps({"programs": {"p1": program},
                       "cameras": [{"name": "belt", "source": "x.avi", "width": 320, "height": 240,
                                    "program": "p1"}]})


@pytest.mark.parametrize("schema", [{"type": "wat"}, {"type": "string"}, {"properties": 5}])
def test_an_unusable_region_verdict_schema_is_refused_in_one_line_naming_it(schema: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(program_yaml({"regions": [{**REGION, "verdict_schema": schema}]}))
    message = str(caught.value)
    assert message.startswith("<config>: programs.p1.regions.left.verdict_schema (cameras: belt): not a valid")
    assert "\n" not in message


def test_a_nok_field_missing_from_a_regions_own_schema_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"programs\.p1\.nok_field \(cameras: belt\): 'broken' is not a boolean "
                                          r"property of region left's verdict schema"):
        parse_config(program_yaml({"nok_field": "broken", "regions": [{**REGION, "verdict_schema": SCHEMA}]}))
    with pytest.raises(ConfigError, match=r"'note' is not a boolean property"):  # a string: always truthy
        parse_config(program_yaml({"nok_field": "note", "regions": [{**REGION, "verdict_schema": SCHEMA}]}))
    parse_config(program_yaml({"regions": [{**REGION, "verdict_schema": SCHEMA}]}))  # defect: accepted


@pytest.fixture(scope="module")
def pair_dir(tiny_pairs: Callable[[str], TinyPair], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp_path_factory.mktemp("pair") / "q", image_max_tokens=64)


def validate(tmp: Path, bundle: Path, program: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    data = json.loads(program_yaml(program))
    data["model"] = {"path": str(bundle)}
    path = tmp / "edge.yaml"
    path.write_text(json.dumps(data))
    return subprocess.run([sys.executable, "-m", "edge_runtime", "config", "validate", str(path)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "EDGE_RUNTIME_DATA": str(tmp)})


def refused(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_config_validate_refuses_what_start_refuses_of_a_program(pair_dir: Path, demo_dir: Path,
                                                                 tmp_path: Path) -> None:
    line = refused(validate(tmp_path, pair_dir, {"image_tokens": {"max": 100}}))
    assert "programs.p1 (cameras: belt): image_tokens.max 100 is more than" in line
    assert "image_max_tokens 64" in line
    line = refused(validate(tmp_path, pair_dir, {"nok_field": "nonexistent", "regions": [REGION]}))
    assert "programs.p1.nok_field (cameras: belt): 'nonexistent' is not a boolean property of" in line
    ref = tmp_path / "ref.png"
    ref.write_bytes(_png())
    line = refused(validate(tmp_path, demo_dir, {"references": [{"image": str(ref), "caption": "golden OK"}]}))
    assert "programs.p1 (cameras: belt): references need a bundle that takes several images" in line
    ok = validate(tmp_path, pair_dir, {"image_tokens": {"max": 64}, "regions": [REGION]})
    assert ok.returncode == 0, ok.stderr


def _png() -> bytes:
    import numpy as np

    from tests.support.images import encode
    return encode(np.random.default_rng(3).integers(0, 256, (96, 128, 3), dtype=np.uint8), ".png")


def test_a_bad_nok_field_is_refused_at_load_and_a_refused_reload_keeps_the_program(pair_dir: Path) -> None:
    settings = Config(device_id="t").model.model_copy(update={"threads": 2, "warmup": False})
    ins = Inspector(load_bundle(pair_dir), settings, "t")
    try:
        cams = [CameraConfig(name="belt", source="x.png", program="p1")]
        ins.use_programs({"p1": ProgramConfig.model_validate({"regions": [REGION]})}, cams, ImageLimits())
        running = ins.program_of("belt")
        bad = {"p1": ProgramConfig.model_validate({"nok_field": "nonexistent", "tiling": {"rows": 1, "cols": 2}})}
        with pytest.raises(ConfigError, match=r"^programs\.p1\.nok_field \(cameras: belt\): 'nonexistent' is not a "
                                              r"boolean property of tiny-qwen2.5-vl.*'s verdict schema$"):
            ins.use_programs(bad, cams, ImageLimits())
        assert ins.program_of("belt") is running
    finally:
        ins.close()


def test_an_image_token_max_under_what_a_cameras_frames_can_have_is_refused_at_load(pair_dir: Path) -> None:
    """Its frames would each be refused (logged at INFO, no result ever): refused when the program loads."""
    settings = Config(device_id="t").model.model_copy(update={"threads": 2, "warmup": False})
    ins = Inspector(load_bundle(pair_dir), settings, "t")
    try:
        cams = [CameraConfig(name="belt", source="x.png", program="p1", width=320, height=240)]
        ins.use_programs({"p1": ProgramConfig.model_validate({"image_tokens": {"max": 32}})}, cams, ImageLimits())
        running = ins.program_of("belt")
        tight = {"p1": ProgramConfig.model_validate({"image_tokens": {"max": 2}})}
        with pytest.raises(ConfigError, match=r"^programs\.p1 \(camera belt\): image_tokens\.max 2 is below what the "
                                              r"camera's frames can have: the projector makes at least \d+ image "
                                              r"tokens of its 320x240 frame"):
            ins.use_programs(tight, cams, ImageLimits())
        assert ins.program_of("belt") is running
    finally:
        ins.close()


def test_references_that_cannot_fit_the_context_with_a_frame_are_refused_at_load(
        tiny_pairs: Callable[[str], TinyPair], tmp_path: Path) -> None:
    """Every frame would be refused (`messages: the prompt is N tokens`, at INFO): refused when it loads."""
    import numpy as np

    from edge_runtime.config import ReferenceConfig
    from tests.support.images import encode
    bundle = write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp_path / "q", image_max_tokens=256)
    settings = Config(device_id="t").model.model_copy(update={"threads": 2, "warmup": False, "context_size": 256})
    ins = Inspector(load_bundle(bundle), settings, "t")
    try:
        rng = np.random.default_rng(9)
        refs = []
        for i in range(4):
            refs.append(ReferenceConfig(image=tmp_path / f"r{i}.png", caption=f"reference {i}"))
            refs[-1].image.write_bytes(encode(rng.integers(0, 256, (448, 448, 3), dtype=np.uint8), ".png"))
        cams = [CameraConfig(name="belt", source="x.png", program="p1", width=320, height=240)]
        with pytest.raises(ConfigError, match=r"^programs\.p1 \(camera belt\): the references take \d+ tokens, "
                                              r"a frame \d+, the prompt's text \d+ and the answer up to \d+: \d+, more "
                                              r"than the context "
                                              r"of 256"):
            ins.use_programs({"p1": ProgramConfig(references=refs)}, cams, ImageLimits())
        ins.use_programs({"p1": ProgramConfig(references=refs[:1], image_tokens={"max": 16})}, cams, ImageLimits())
    finally:
        ins.close()


def test_config_validate_refuses_an_image_token_max_below_the_projectors_floor_with_starts_line(
        pair_dir: Path, tmp_path: Path) -> None:
    """Start and reload refused it (every frame would be refused); validate passed it."""
    settings = Config(device_id="t").model.model_copy(update={"threads": 2, "warmup": False})
    cams = [CameraConfig(name="belt", source="x.png", program="p1", width=320, height=240)]
    with Inspector(load_bundle(pair_dir), settings, "t") as ins, pytest.raises(ConfigError) as start:
        ins.use_programs({"p1": ProgramConfig.model_validate({"image_tokens": {"max": 2}})}, cams, ImageLimits())
    assert str(start.value).startswith("programs.p1 (camera belt): image_tokens.max 2 is below what the camera's "
                                       "frames can have: the projector makes at least ")
    line = refused(validate(tmp_path, pair_dir, {"image_tokens": {"max": 2}}))
    assert line.endswith(str(start.value)), (line, str(start.value))


def _recipe_config(tmp: Path, bundle: Path) -> Path:
    """A program named only by a line recipe: one small reference (fits the context with the answer)
    and a region of the whole 448 x 448 frame, whose image tokens do not fit beside them."""
    import numpy as np

    from tests.support.images import encode
    ref = tmp / "ref.png"
    ref.write_bytes(encode(np.random.default_rng(5).integers(0, 256, (112, 112, 3), dtype=np.uint8), ".png"))
    path = tmp / "edge.yaml"
    path.write_text(json.dumps({
        "model": {"path": str(bundle), "context_size": 256, "max_tokens": 64},
        "programs": {"big": {"references": [{"image": str(ref), "caption": "golden OK sample"}],
                             "regions": [{"name": "whole", "box": [0, 0, 448, 448]}]}},
        "cameras": [{"name": "cam1", "source": "x.png", "width": 448, "height": 448, "trigger": {"mode": "on_demand"}}],
        "line_io": {"stations": [{"name": "weld3", "camera": "cam1",
                                  "nok_when": [{"field": "verdict.defect", "equals": True}],
                                  "recipes": {"std": {}, "bolt": {"program": "big"}}}]}}))
    return path


def test_a_recipes_program_that_overflows_the_context_is_refused_at_start_and_validate_naming_the_recipe(
        tiny_pairs: Callable[[str], TinyPair], tmp_path: Path) -> None:
    """Only camera programs were checked against the context: a recipe's references + regions passed,
    and every job of that recipe was refused at run time."""
    from edge_runtime.config import load_config

    bundle = write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp_path / "q", image_max_tokens=256)
    config = load_config(_recipe_config(tmp_path, bundle))
    with Inspector(load_bundle(bundle), config.model.model_copy(update={"threads": 2, "warmup": False}), "t") as ins:
        with pytest.raises(ConfigError) as start:
            ins.use_programs(config.programs, config.cameras, config.images, config.line_io.stations)
        message = str(start.value)
        assert message.startswith("programs.big (recipe line_io.stations.weld3.recipes.bolt): the references take ")
        assert "its largest region" in message and "more than the context of 256 tokens" in message
        assert "\n" not in message
        corner = ProgramConfig.model_validate({**config.programs["big"].model_dump(),
                                               "regions": [{"name": "corner", "box": [0, 0, 112, 112]}]})
        ins.use_programs({"big": corner}, config.cameras, config.images, config.line_io.stations)  # it fits
    proc = subprocess.run([sys.executable, "-m", "edge_runtime", "config", "validate",
                           str(_recipe_config(tmp_path, bundle))], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "EDGE_RUNTIME_DATA": str(tmp_path)})
    assert refused(proc).endswith(message)
