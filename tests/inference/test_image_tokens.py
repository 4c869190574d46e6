"""A program's image token budget (`programs.<name>.image_tokens`) on the tiny Qwen2.5-VL pair (dynamic
resolution): a camera's frames are resized until libmtmd makes min..max tokens of them, the bundle's
image_max_tokens is the ceiling, the budget is part of the encoder cache's key, and a budget on an
ONNX bundle or over the ceiling refuses the program in one line."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

from edge_runtime.config import CameraConfig, Config, ImageLimits, ProgramConfig
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.core.errors import ConfigError, InputError
from edge_runtime.inference.inspector import Inspector
from tests.support.tiny_pairs import TinyPair, write_pair_bundle

CAMERAS = [CameraConfig(name="few", source="x.png", program="few"), CameraConfig(name="many", source="x.png",
                                                                                  program="many"),
           CameraConfig(name="plain", source="x.png")]


def frame(width: int, height: int, seed: int = 71) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def ins(tiny_pairs: Callable[[str], TinyPair], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inspector]:
    settings = Config(device_id="t").model.model_copy(update={"threads": 2, "warmup": False})
    bundle = write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp_path_factory.mktemp("tokens") / "q", image_max_tokens=256)
    inspector = Inspector(load_bundle(bundle), settings, "t")
    inspector.use_programs({"few": ProgramConfig.model_validate({"image_tokens": {"max": 16}}),
                            "many": ProgramConfig.model_validate({"image_tokens": {"min": 100}})},
                           CAMERAS, ImageLimits())
    yield inspector
    inspector.close()


def test_a_cameras_budget_bounds_its_frames_image_tokens(ins: Inspector) -> None:
    big, small = frame(256, 192), frame(64, 48)
    plain_big, plain_small = len(ins.encode_frame("plain", big).embeds), len(ins.encode_frame("plain", small).embeds)
    few = ins.encode_frame("few", big)
    many = ins.encode_frame("many", small)
    assert len(few.embeds) <= 16 < plain_big
    assert plain_small < 100 <= len(many.embeds) <= 256
    assert (few.width, few.height) == (256, 192)  # the result still reports the frame's size


def test_a_budget_under_the_projectors_floor_is_one_clear_error(ins: Inspector) -> None:
    """Qwen2.5-VL's libmtmd preprocessing has a smallest image; no resize goes under its token count."""
    ins.use_programs({"few": ProgramConfig.model_validate({"image_tokens": {"max": 2}})}, CAMERAS[:1], ImageLimits())
    try:
        with pytest.raises(InputError, match=r"^image_tokens: the projector makes at least \d+ image tokens of this "
                                             "image, more than the budget's max of 2$"):
            ins.encode_frame("few", frame(256, 192, seed=73))
    finally:
        ins.use_programs({"few": ProgramConfig.model_validate({"image_tokens": {"max": 16}}),
                          "many": ProgramConfig.model_validate({"image_tokens": {"min": 100}})}, CAMERAS, ImageLimits())


def test_the_budget_is_part_of_the_cache_key(ins: Inspector) -> None:
    img = frame(256, 192, seed=72)
    before = ins.encoder_cache.stats()
    a, b = ins.encode_frame("few", img), ins.encode_frame("plain", img)
    again = ins.encode_frame("few", img)
    after = ins.encoder_cache.stats()
    assert (after["misses"] - before["misses"], after["hits"] - before["hits"]) == (2, 1)
    assert len(a.embeds) < len(b.embeds) and again.embeds is a.embeds


def test_a_budget_over_the_ceiling_or_on_an_onnx_bundle_is_refused(ins: Inspector, inspector: Inspector) -> None:
    over = {"p": ProgramConfig.model_validate({"image_tokens": {"max": 300}})}
    cams = [CameraConfig(name="c", source="x.png", program="p")]
    with pytest.raises(ConfigError, match=r"^programs.p \(cameras: c\): image_tokens.max 300 is more than .* "
                                          "image_max_tokens 256$"):
        ins.use_programs(over, cams, ImageLimits())
    with pytest.raises(ConfigError, match="ONNX encoder makes a fixed number of image tokens"):
        inspector.use_programs({"p": ProgramConfig.model_validate({"image_tokens": {"max": 8}})}, cams, ImageLimits())
    with pytest.raises(ValueError, match="min 9 is more than max 8"):
        ProgramConfig.model_validate({"image_tokens": {"min": 9, "max": 8}})
    assert ins.program_of("few") is not None  # the refused programs replaced nothing


def test_a_budget_min_over_the_ceiling_is_refused_not_chased_frame_by_frame() -> None:
    """min over the bundle's image_max_tokens (max unset: the ceiling) can never be met: each frame would be
    resized up and down six times and end wherever the last try left it. Refused in one line instead."""
    from edge_runtime.inference.programs import check_programs

    cams = [CameraConfig(name="c", source="x.png", program="p")]
    schema = {"type": "object", "properties": {"defect": {"type": "boolean"}}}
    with pytest.raises(ConfigError, match=r"^programs.p \(cameras: c\): image_tokens.min 300 is more than .* "
                                          "image_max_tokens 256$"):
        check_programs({"p": ProgramConfig.model_validate({"image_tokens": {"min": 300}})}, cams, True, "b", 256,
                       schema)
    assert check_programs({"p": ProgramConfig.model_validate({"image_tokens": {"min": 256}})}, cams, True, "b", 256,
                          schema) == {"p": (256, 256)}
