"""The regions of one frame prefilled together (llm/prefill.py) on the tiny Qwen2.5-VL (M-RoPE) and
Gemma 3 (bidirectional attention over an image) pairs: the images of the four regions go into fewer
decodes than four, and each region's first-token logits equal those of its crop inspected alone (the
main context, one prompt) to 1e-5; a frame asked as four regions gives each region the verdict tokens
of its crop asked alone; one region's positions shifted breaks the equality, so it can fail."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from edge_runtime.config import CameraConfig, Config, ImageLimits, ProgramConfig
from edge_runtime.core.batch import Encoded
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.feed import ImagePart
from edge_runtime.inference.llm.mtmd import MediaEmbeds, MtmdContext
from edge_runtime.inference.llm.sequence import Item
from tests.support.tiny_pairs import TinyPair, write_pair_bundle

TOLERANCE = 1e-5
SIDE = 96  # each region's crop: 96 x 96 of a 192 x 192 frame
QUADRANTS = [(0, 0), (SIDE, 0), (0, SIDE), (SIDE, SIDE)]
PROGRAM = ProgramConfig.model_validate(
    {"regions": [{"name": f"q{i}", "box": [x, y, SIDE, SIDE]} for i, (x, y) in enumerate(QUADRANTS)]})
CAMERAS = [CameraConfig(name="belt", source="x.png", program="quads")]


@pytest.fixture(scope="module", params=["qwen2.5-vl", "gemma3"])
def ins(request: pytest.FixtureRequest, tiny_pairs: Callable[[str], TinyPair],
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inspector]:
    root = tmp_path_factory.mktemp("region-prefill") / request.param
    settings = Config(device_id="t").model.model_copy(update={"threads": 2, "warmup": False})
    inspector = Inspector(load_bundle(write_pair_bundle(tiny_pairs(request.param), root)), settings, "t")
    inspector.use_programs({"quads": PROGRAM}, CAMERAS, ImageLimits())
    yield inspector
    inspector.close()


def frame(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (2 * SIDE, 2 * SIDE, 3), dtype=np.uint8)


def crops(img: np.ndarray) -> list[np.ndarray]:
    return [img[y:y + SIDE, x:x + SIDE] for x, y in QUADRANTS]


def region_items(ins: Inspector, img: np.ndarray) -> list[Item]:
    return [ins.sequence("Is this region OK? Answer in JSON.", ins.encode(c)) for c in crops(img)]


class Shifted(MediaEmbeds):
    """An M-RoPE image decoded one position further than its layout says (the mutation)."""

    def positions(self, pos0: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        return super().positions(pos0 + 1, start, stop)


def shifted(image: ImagePart) -> ImagePart:
    """The mutation of one region's image: M-RoPE positions + 1; with plain positions, where llama.cpp
    refuses a gap, an overlap or a decrease, every embedding moved one position along (the last to
    the first), which is each embedding at its neighbour's position."""
    assert isinstance(image, list)
    out: list[Any] = []
    for s in image:
        if isinstance(s, MediaEmbeds) and s.mrope is not None:
            s = Shifted(**{f.name: getattr(s, f.name) for f in dataclasses.fields(s)})
        elif isinstance(s, MediaEmbeds):
            s = dataclasses.replace(s, embeds=np.roll(s.embeds, 1, axis=0))
        out.append(s)
    return out


def together(ins: Inspector, items: list[Item], monkeypatch: pytest.MonkeyPatch) -> tuple[list[np.ndarray], list[bool]]:
    """Each item's first-token logits with the items prefilled together; whether each decode was of images."""
    lm = ins.language
    feed, kinds = lm.feed, []
    decode = feed.decode

    def counted(ctx: Any, batch: Any) -> None:
        kinds.append(batch is feed.embeds.struct)
        decode(ctx, batch)

    monkeypatch.setattr(feed, "decode", counted)
    logits = lm.parallel.prompt_logits(items, together=True)
    monkeypatch.undo()
    return logits, kinds


def alone(ins: Inspector, item: Item) -> np.ndarray:
    ins.language.forget_prefix(clear=True)
    return ins.language.prompt_logits(*item)


def test_four_regions_images_prefill_in_fewer_decodes_with_each_crops_own_logits(
        ins: Inspector, monkeypatch: pytest.MonkeyPatch) -> None:
    items = region_items(ins, frame(seed=71))
    images = sum(1 for _, image, _ in items for s in image or [] if isinstance(s, MediaEmbeds))
    assert images == 4
    logits, kinds = together(ins, items, monkeypatch)
    assert 1 <= sum(kinds) < 4, kinds  # the four images: fewer decodes than four
    assert len(kinds) <= 4, kinds  # prefix, then the text before the images, the images, the text after
    for i, item in enumerate(items):
        own = alone(ins, item)
        assert own.std() > 0.5  # random weights that spread the logits: the tolerance means something
        assert np.abs(logits[i] - own).max() <= TOLERANCE, i


def test_one_regions_positions_shifted_fails_the_equality(ins: Inspector, monkeypatch: pytest.MonkeyPatch) -> None:
    items = region_items(ins, frame(seed=72))
    prefix, image, suffix = items[2]
    logits, _ = together(ins, [*items[:2], (prefix, shifted(image), suffix), items[3]], monkeypatch)
    assert np.abs(logits[2] - alone(ins, items[2])).max() > 100 * TOLERANCE
    assert np.abs(logits[1] - alone(ins, items[1])).max() <= TOLERANCE  # the others are untouched


def test_a_frame_asked_as_four_regions_gives_each_the_verdict_tokens_of_its_crop_alone(ins: Inspector) -> None:
    img = frame(seed=73)
    result = ins.inspect(img, camera="belt")
    assert result.regions is not None and [r["name"] for r in result.regions] == ["q0", "q1", "q2", "q3"]
    for region, crop in zip(result.regions, crops(img), strict=True):
        own = ins.inspect(crop, camera="nobody")
        assert region["text"] == own.text, region["name"]


def test_a_regions_frames_prefill_and_decode_times_are_wall_times_not_the_regions_sum(ins: Inspector) -> None:
    """The regions run together: their prefill and decode times overlap, so the frame's are the longest
    region's (the sum counted the shared time once per region, more than the frame took)."""
    t0 = time.perf_counter()
    result = ins.inspect(frame(seed=74), camera="belt")
    wall = (time.perf_counter() - t0) * 1000
    t = result.timings_ms
    assert t["preprocess"] + t["encode"] + t["prefill"] + t["decode"] <= wall


def test_regions_on_two_encoder_lanes_use_both_and_give_the_one_lane_encodings_and_verdicts(ins: Inspector) -> None:
    """model.encoder_lanes 2: the four crops are encoded on the two libmtmd contexts, and each region's
    embeddings and verdict tokens are the one-lane inspector's. How many crops each lane takes is the
    threads' timing (a lane freed first takes the next crop): only the total is fixed here; that two
    crops hold both lanes at once is the next test's."""
    settings = ins.settings.model_copy(update={"encoder_lanes": 2})
    with Inspector(ins.bundle, settings, "t") as two:
        two.use_programs({"quads": PROGRAM}, CAMERAS, ImageLimits())
        img = frame(seed=75)
        n_embd = ins.language.n_embd
        one_lane = ins.encoder.encode_regions(img, PROGRAM, None, n_embd).regions
        two_lanes = two.encoder.encode_regions(img, PROGRAM, None, n_embd).regions
        assert two.encoder.lanes == 2 and sum(two.encoder.lane_encodes) == 4
        for (spec, a), (_, b) in zip(one_lane, two_lanes, strict=True):
            assert isinstance(a, Encoded) and isinstance(b, Encoded)
            assert np.array_equal(a.embeds, b.embeds), spec.name
        mine, theirs = two.inspect(img, camera="belt"), ins.inspect(img, camera="belt")
        assert mine.regions is not None and theirs.regions is not None
        assert [r["text"] for r in mine.regions] == [r["text"] for r in theirs.regions]


def test_two_encoder_lanes_encode_two_crops_at_the_same_time(ins: Inspector, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each crop's encode waits, inside libmtmd's half, for another to arrive: one at a time would never
    get past the first (the barrier breaks after 10 s and the encode raises). Two crops inside libmtmd at
    once hold both lanes, so each lane encoded."""
    met = threading.Barrier(2, timeout=10)
    segments = MtmdContext.image_segments

    def in_pairs(self: MtmdContext, rgb: np.ndarray) -> Any:
        met.wait()
        return segments(self, rgb)

    settings = ins.settings.model_copy(update={"encoder_lanes": 2, "encoder_cache_mb": 0})
    with Inspector(ins.bundle, settings, "t") as two:
        two.use_programs({"quads": PROGRAM}, CAMERAS, ImageLimits())
        monkeypatch.setattr(MtmdContext, "image_segments", in_pairs)
        encoded = two.encoder.encode_regions(frame(seed=76), PROGRAM, None, ins.language.n_embd)
        monkeypatch.undo()
        assert sum(two.encoder.lane_encodes) == 4 and min(two.encoder.lane_encodes) > 0
    assert all(isinstance(enc, Encoded) for _, enc in encoded.regions)


def test_a_regions_frames_prefill_and_decode_are_one_regions_not_two_regions_maxima() -> None:
    """One region prefilled longest, another decoded longest: the frame's prefill and decode are the
    longest region's own (its whole generation lies inside the frame's), not the longest prefill plus the
    longest decode of different regions, whose sum can exceed the frame's wall time (seen under load)."""
    from edge_runtime.core.batch import BatchJob
    from edge_runtime.core.result import Result
    from edge_runtime.inference.llm.feed import Generation
    from edge_runtime.inference.regions import RegionsEncoded, RegionSpec
    from edge_runtime.inference.results import RegionsCollected, regions_result

    crop = Encoded(np.zeros((1, 4), np.float32), SIDE, SIDE, 0.0, 0.0)
    enc = RegionsEncoded(np.zeros((0, 4), np.float32), 2 * SIDE, 2 * SIDE, 1.0, 2.0,
                         regions=[(RegionSpec("a", (0, 0, SIDE, SIDE)), crop),
                                  (RegionSpec("b", (SIDE, 0, SIDE, SIDE)), crop)])
    collected = RegionsCollected(enc, "defect", lambda _g, _r: {"defect": False})
    collected.pending = 2
    collected.add(0, None, Generation('{"defect":false}', 5, 40, prefill_ms=30.0, decode_ms=5.0,
                                      finish_reason="stop", prefix_reused=0))
    collected.add(1, None, Generation('{"defect":false}', 9, 10, prefill_ms=4.0, decode_ms=20.0,
                                      finish_reason="stop", prefix_reused=0))
    result = regions_result("t", "m", BatchJob(enc, "belt"), collected, "?", time.perf_counter())
    assert isinstance(result, Result)
    assert (result.timings_ms["prefill"], result.timings_ms["decode"]) == (30.0, 5.0)
