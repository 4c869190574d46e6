"""Inspection programs' references (inference/programs.py) on the tiny Qwen2.5-VL and Gemma 3 pairs:
the references and their captions go before the frame as one shared `Prefix` whose KV is decoded once;
a frame's logits through that reused prefix equal the uncached path and libmtmd's helper on the whole
prompt; two cameras sharing the program in one batch get their alone tokens with the prefix copied,
not decoded again; a missing, corrupt or oversized reference refuses the config in one line naming
the program, its cameras and the file."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.config import CameraConfig, Config, ImageLimits, ProgramConfig, ReferenceConfig, load_config
from edge_runtime.core.batch import BatchJob
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.core.errors import ConfigError
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.feed import ImagePart, Prefix
from edge_runtime.inference.programs import BETWEEN_TEXT, FRAME_TEXT, REFERENCE_TEXT
from tests.support.images import encode
from tests.support.tiny_pairs import TinyPair, write_pair_bundle

TOLERANCE = 1e-5
CAPTIONS = ("golden OK sample", "known NOK: missing screw")


def frames(n: int, seed: int, size: tuple[int, int] = (128, 96)) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8) for _ in range(n)]


def write_references(folder: Path, seed: int = 41) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, img in enumerate(frames(2, seed)):
        path = folder / f"ref{i}.png"
        path.write_bytes(encode(img, ".png"))
        paths.append(path)
    return paths


def program(paths: list[Path]) -> ProgramConfig:
    return ProgramConfig(references=[ReferenceConfig(image=p, caption=c) for p, c in zip(paths, CAPTIONS, strict=True)])


CAMERAS = [CameraConfig(name=n, source="x.png", program="housing") for n in ("left", "right")]


@pytest.fixture(scope="module", params=["qwen2.5-vl", "gemma3"])
def ins(request: pytest.FixtureRequest, tiny_pairs: Callable[[str], TinyPair],
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inspector]:
    root = tmp_path_factory.mktemp("programs") / request.param
    settings = Config(device_id="t").model.model_copy(update={"threads": 2, "warmup": False})
    inspector = Inspector(load_bundle(write_pair_bundle(tiny_pairs(request.param), root / "bundle")), settings, "t")
    inspector.use_programs({"housing": program(write_references(root / "refs"))}, CAMERAS, ImageLimits())
    yield inspector
    inspector.close()


def flat(prefix: Prefix, image: ImagePart) -> tuple[list[int], list[object]]:
    """The same prompt with nothing fixed: the prefix's first tokens, the rest of it as image segments."""
    first, *rest = prefix.segments
    assert isinstance(first, list) and isinstance(image, list)
    return first, [*rest, *image]


def helper_logits(ins: Inspector, frame: np.ndarray, refs: list[np.ndarray], question: str) -> np.ndarray:
    """libmtmd's own path on the whole prompt, one media marker per image."""
    assert ins.mtmd is not None
    marker = ins.mtmd.marker
    slot = "".join((BETWEEN_TEXT if i else "") + REFERENCE_TEXT.format(caption=c) + marker
                   for i, c in enumerate(CAPTIONS)) + BETWEEN_TEXT + FRAME_TEXT + marker
    p = ins.bundle.manifest.prompt
    text = p.template.format(system=p.system, image=slot, prompt=question)
    lm = ins.language
    lm.forget_prefix(clear=True)
    with ins.mtmd.tokenize(text, [img[:, :, ::-1].copy() for img in [*refs, frame]], add_special=True) as chunks:
        ins.mtmd.eval_chunks(lm.ctx, chunks, 0, 0, lm.n_batch)
    lm.forget_prefix(clear=True)
    return lm.ctx.logits_ith(-1).copy()


def test_reference_and_frame_logits_through_the_kept_prefix_equal_the_uncached_path(ins: Inspector) -> None:
    lm = ins.language
    lm.forget_prefix(clear=True)
    question = ins.default_prompt
    refs = frames(2, seed=41)
    for frame in frames(2, seed=42):
        prefix, image, suffix = ins.frame_sequence("left", question, ins.encode(frame))
        assert isinstance(prefix, Prefix) and prefix is ins.frame_sequence("right", question, ins.encode(frame))[0]
        _, reused = lm.prefill(prefix, image, suffix)
        kept = lm.ctx.logits_ith(-1).copy()
        lm.forget_prefix(clear=True)
        head, rest = flat(prefix, image)
        uncached = lm.prompt_logits(head, rest, suffix)  # type: ignore[arg-type]
        assert np.abs(kept - uncached).max() <= TOLERANCE
        assert np.abs(kept - helper_logits(ins, frame, refs, question)).max() <= TOLERANCE
        assert kept.std() > 0.5
    # The second frame reused the references' KV: prefill it again after the first and see.
    lm.forget_prefix(clear=True)
    for frame in frames(2, seed=43):
        _, reused = lm.prefill(*ins.frame_sequence("left", question, ins.encode(frame)))
    assert reused == len(prefix) > 0


def test_the_references_change_the_answer(ins: Inspector) -> None:
    """A mutation that dropped the references (or put them after the frame) would leave the logits
    of the plain prompt: they must differ."""
    enc = ins.encode(frames(1, seed=44)[0])
    ins.language.forget_prefix(clear=True)
    with_refs = ins.language.prompt_logits(*ins.frame_sequence("left", ins.default_prompt, enc))
    ins.language.forget_prefix(clear=True)
    plain = ins.language.prompt_logits(*ins.frame_sequence("nobody", ins.default_prompt, enc))
    assert np.abs(with_refs - plain).max() > 100 * TOLERANCE


def test_two_cameras_sharing_the_prefix_in_one_batch_get_their_alone_tokens(ins: Inspector) -> None:
    encs = [ins.encode(f) for f in frames(2, seed=45)]
    alone = []
    for cam, enc in zip(("left", "right"), encs, strict=True):
        ins.language.forget_prefix(clear=True)
        alone.append(ins.generate(*ins.frame_sequence(cam, ins.default_prompt, enc), ins.grammar, ins.max_tokens))
    copies = ins.language.parallel.prefix_copies
    results = ins.inspect_batch([BatchJob(enc, camera=cam) for cam, enc in zip(("left", "right"), encs, strict=True)])
    assert [r.text for r in results] == [g.text for g in alone]  # type: ignore[union-attr]
    # The references were decoded into one slot and copied to the other, not decoded twice.
    assert ins.language.parallel.prefix_copies == copies + 1


def test_a_bad_reference_refuses_the_config_in_one_line(tmp_path: Path) -> None:
    refs = write_references(tmp_path / "refs")
    corrupt = tmp_path / "refs" / "corrupt.png"
    corrupt.write_bytes(refs[0].read_bytes()[:60])
    huge = tmp_path / "refs" / "huge.png"
    huge.write_bytes(encode(np.zeros((64, 640, 3), np.uint8), ".png"))
    for path, why in ((tmp_path / "missing.png", "no such file"), (corrupt, "corrupt or truncated"),
                      (huge, "pixels")):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"images: {{max_pixels: 20000}}\nprograms:\n  housing:\n    references:\n"
                       f"      - {{image: {refs[0]}, caption: golden}}\n      - {{image: {path}, caption: bad}}\n"
                       "cameras:\n  - {name: belt, source: x.png, program: housing}\n")
        with pytest.raises(ConfigError) as caught:
            load_config(cfg)
        message = str(caught.value)
        assert "\n" not in message and "programs.housing (cameras: belt): references.1.image" in message
        assert str(path) in message and why in message, message


def test_a_reference_over_16_megapixels_is_refused_whatever_images_max_pixels_allows(tmp_path: Path) -> None:
    """Review D20: a reference is shrunk to the projector's budget anyway; 8 of 49 MP each took 72 s and
    +740 MB at a reload. One of 4,100 x 4,000 (16.4 MP, within images.max_pixels' 50 MP) is refused."""
    refs = write_references(tmp_path / "refs")
    big = tmp_path / "big.png"
    big.write_bytes(encode(np.zeros((4000, 4100, 3), np.uint8), ".png"))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"programs:\n  housing:\n    references:\n      - {{image: {refs[0]}, caption: golden}}\n"
                   f"      - {{image: {big}, caption: big}}\n"
                   "cameras:\n  - {name: belt, source: x.png, program: housing}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(cfg)
    message = str(caught.value)
    assert "\n" not in message and "references.1.image" in message and "16000000 pixels" in message, message
    assert "downscale the file" in message


def test_a_camera_naming_no_program_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("cameras:\n  - {name: belt, source: x.png, program: nope}\n")
    with pytest.raises(ConfigError, match=r"cameras\.belt\.program: no program 'nope'"):
        load_config(cfg)


def test_an_onnx_bundle_refuses_references_in_one_line(inspector: Inspector, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^programs.housing \(cameras: left, right\): references need a bundle "
                                          "that takes several images"):
        inspector.use_programs({"housing": program(write_references(tmp_path))}, CAMERAS, ImageLimits())
    assert inspector.program_of("left") is None


def test_the_references_are_decoded_once_across_interleaved_cameras(ins: Inspector,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A camera without references (or an API request) between two frames of the program's camera does
    not make the references' KV be decoded again: the parallel slots keep both prefixes."""
    feed = ins.language.feed
    decoded: list[object] = []
    real = feed.head

    def counting(ctx: object, head: object, seq: int = 0) -> int:
        if isinstance(head, Prefix):
            decoded.append(head)
        return real(ctx, head, seq)  # type: ignore[arg-type]

    monkeypatch.setattr(feed, "head", counting)
    for i, frame in enumerate(frames(3, seed=46)):
        ins.inspect(frame, camera="left")
        ins.inspect(frame, camera="nobody")
        assert len(decoded) <= 1, i
