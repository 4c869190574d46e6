"""A program's fit to the context (inference/program_fit.py) is the model's own check, to the token: the
largest max_tokens that start, reload and `config validate` take is the one with which the model takes
the frame's prompt, and one more is refused by both. The prompt's text (the template, the system text,
the camera's or region's question, `Image to inspect:`) and libmtmd's markers around each image are
counted, on the tiny Qwen2.5-VL pair and on Gemma 3's (whose GGUF asks for a BOS token)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.config import CameraConfig, Config, ImageLimits, ProgramConfig, ReferenceConfig
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.core.errors import ConfigError
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.feed import head_cells, image_segments
from edge_runtime.inference.program_fit import check_programs_offline
from edge_runtime.inference.regions import RegionsEncoded
from tests.support.images import encode
from tests.support.tiny_pairs import FAMILIES, TinyPair, write_pair_bundle

N_CTX = 1024
QUESTION = "Is every screw seated? Answer in JSON."
LONG = "Is the label present, straight and readable? JSON."  # longer than the bundle's default question


@pytest.fixture(scope="module", params=list(FAMILIES))
def setup(request: pytest.FixtureRequest, tiny_pairs: Callable[[str], TinyPair],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Inspector, Path, Path]]:
    root = tmp_path_factory.mktemp("fit") / request.param
    bundle = write_pair_bundle(tiny_pairs(request.param), root / "bundle")
    ref = root / "ref.png"
    ref.write_bytes(encode(np.random.default_rng(3).integers(0, 256, (64, 64, 3), dtype=np.uint8), ".png"))
    settings = Config(device_id="t").model.model_copy(
        update={"threads": 2, "warmup": False, "context_size": N_CTX, "max_tokens": 8})
    ins = Inspector(load_bundle(bundle), settings, "t")
    yield ins, bundle, ref
    ins.close()


def prompt_tokens(ins: Inspector, camera: str, question: str, enc: object) -> int:
    prefix, image, suffix = ins.frame_sequence(camera, question, enc)  # type: ignore[arg-type]
    return head_cells(prefix) + sum(len(s) for s in image_segments(image)) + len(suffix)


def fits(ins: Inspector, bundle: Path, programs: dict[str, ProgramConfig], cams: list[CameraConfig],
         max_tokens: int) -> bool:
    """Whether start (use_programs) takes the programs with this max_tokens; `config validate`'s check
    (check_programs_offline) must say the same."""
    ins.max_tokens = max_tokens
    try:
        ins.use_programs(programs, cams, ImageLimits())
        started = True
    except ConfigError as exc:
        assert "the prompt's text" in str(exc) and "\n" not in str(exc)
        started = False
    config = Config.model_validate({"device_id": "t", "model": {"path": str(bundle), "context_size": N_CTX,
                                                                "max_tokens": max_tokens},
                                    "programs": {k: v.model_dump() for k, v in programs.items()},
                                    "cameras": [c.model_dump() for c in cams]})
    try:
        check_programs_offline(load_bundle(bundle), config)
        validated = True
    except ConfigError:
        validated = False
    assert validated == started
    return started


@pytest.mark.parametrize("size", [(64, 48), (512, 384)])  # the larger: MiniCPM-V's slices and their markers
def test_a_references_program_fits_exactly_as_the_model_takes_its_prompt(
        setup: tuple[Inspector, Path, Path], size: tuple[int, int]) -> None:
    ins, bundle, ref = setup
    cams = [CameraConfig(name="belt", source="x.png", program="p", width=size[0], height=size[1], prompt=QUESTION)]
    programs = {"p": ProgramConfig(references=[ReferenceConfig(image=ref, caption="golden OK sample")])}
    ins.max_tokens = 8
    ins.use_programs(programs, cams, ImageLimits())
    frame = np.random.default_rng(4).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    need = prompt_tokens(ins, "belt", QUESTION, ins.encode_frame("belt", frame))
    assert fits(ins, bundle, programs, cams, N_CTX - need)
    assert not fits(ins, bundle, programs, cams, N_CTX - need + 1)  # used to pass: every frame refused


def test_a_regions_longest_question_is_counted(setup: tuple[Inspector, Path, Path]) -> None:
    ins, bundle, _ = setup
    cams = [CameraConfig(name="cover", source="x.png", program="r", width=64, height=48)]
    programs = {"r": ProgramConfig.model_validate({"regions": [
        {"name": "screw", "box": [0, 0, 32, 32]}, {"name": "label", "box": [0, 0, 32, 32], "prompt": LONG}]})}
    ins.max_tokens = 8
    ins.use_programs(programs, cams, ImageLimits())
    frame = np.random.default_rng(5).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    enc = ins.encode_frame("cover", frame)
    assert isinstance(enc, RegionsEncoded)
    label = enc.regions[1][1]
    need = prompt_tokens(ins, "cover", LONG, label)
    assert fits(ins, bundle, programs, cams, N_CTX - need)
    assert not fits(ins, bundle, programs, cams, N_CTX - need + 1)


def test_a_question_longer_than_the_context_holds_is_one_line_naming_the_camera(
        setup: tuple[Inspector, Path, Path]) -> None:
    """It was an InputError naming `messages` (the tokenizer's bound), not the program or the camera."""
    ins, _, ref = setup
    ins.max_tokens = 8
    cams = [CameraConfig(name="belt", source="x.png", program="p", width=64, height=48, prompt="Is it OK? " * 30000)]
    with pytest.raises(ConfigError, match=r"^programs\.p \(camera belt\): its question cannot be asked \(the prompt "
                                          r"is 300\d+ bytes"):
        ins.use_programs({"p": ProgramConfig(references=[ReferenceConfig(image=ref, caption="golden")])}, cams,
                         ImageLimits())


def test_an_image_token_min_the_context_cannot_hold_is_refused_whatever_the_frames_size(
        tiny_pairs: Callable[[str], TinyPair], tmp_path: Path) -> None:
    """Every frame is enlarged to at least image_tokens.min tokens; a min that leaves no room in the
    context was taken (a program with only a budget was not checked at all, nor a camera of unknown
    size), and every frame was enlarged and encoded before the model refused its prompt."""
    bundle = write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp_path / "q", image_max_tokens=2048)
    settings = Config(device_id="t").model.model_copy(
        update={"threads": 2, "warmup": False, "context_size": N_CTX, "max_tokens": 8})
    with Inspector(load_bundle(bundle), settings, "t") as ins:
        for cams in ([CameraConfig(name="belt", source="x.png", program="p")],
                     [CameraConfig(name="belt", source="x.png", program="p", width=64, height=48)]):
            for program in ({"image_tokens": {"min": 1000}},
                            {"image_tokens": {"min": 1000}, "tiling": {"rows": 1, "cols": 2}},
                            {"image_tokens": {"min": 520}, "clip": {"frames": 2, "spacing_s": 0}}):
                with pytest.raises(ConfigError, match=r"^programs\.p \(camera belt\): .*more than the context of 1024"):
                    ins.use_programs({"p": ProgramConfig.model_validate(program)}, cams, ImageLimits())
            ins.use_programs({"p": ProgramConfig.model_validate({"image_tokens": {"min": 100}})}, cams, ImageLimits())


def test_an_onnx_bundles_regions_count_its_fixed_image_tokens_at_start_and_validate(demo_dir: Path) -> None:
    """The demo ONNX bundle makes 49 tokens of any image: they were counted as 0, and `config validate`
    made no context check at all for an ONNX bundle."""
    settings = Config(device_id="t").model.model_copy(
        update={"threads": 2, "warmup": False, "context_size": N_CTX, "max_tokens": 8})
    cams = [CameraConfig(name="cover", source="x.png", program="r", width=64, height=48)]
    programs = {"r": ProgramConfig.model_validate({"regions": [{"name": "label", "box": [0, 0, 32, 32],
                                                                 "prompt": LONG}]})}
    with Inspector(load_bundle(demo_dir), settings, "t") as ins:
        ins.use_programs(programs, cams, ImageLimits())
        enc = ins.encode_frame("cover", np.random.default_rng(6).integers(0, 256, (48, 64, 3), dtype=np.uint8))
        assert isinstance(enc, RegionsEncoded)
        need = prompt_tokens(ins, "cover", LONG, enc.regions[0][1])
        assert fits(ins, demo_dir, programs, cams, N_CTX - need)
        assert not fits(ins, demo_dir, programs, cams, N_CTX - need + 1)
