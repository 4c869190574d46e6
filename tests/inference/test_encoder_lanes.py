"""model.encoder_lanes on the tiny Qwen2.5-VL pair: closing the inspector (a reload, shutdown) while an
encode is inside libmtmd on one of its lanes waits for that encode before the contexts are freed, and an
encode after the close is refused with an InferenceError rather than run on a freed context."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.config import CameraConfig, Config, ImageLimits, ProgramConfig
from edge_runtime.core.batch import Encoded
from edge_runtime.core.bundle.manifest import Bundle, load_bundle
from edge_runtime.core.errors import InferenceError
from edge_runtime.inference.encoding import CLOSED
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.mtmd import MtmdContext
from tests.support.tiny_pairs import TinyPair, write_pair_bundle

SIDE = 96
PROGRAM = ProgramConfig.model_validate(
    {"regions": [{"name": f"q{i}", "box": [x, y, SIDE, SIDE]}
                 for i, (x, y) in enumerate([(0, 0), (SIDE, 0), (0, SIDE), (SIDE, SIDE)])]})
CAMERAS = [CameraConfig(name="belt", source="x.png", program="quads")]


@pytest.fixture(scope="module")
def bundle(tiny_pairs: Callable[[str], TinyPair], tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return load_bundle(write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp_path_factory.mktemp("lanes") / "pair"))


def two_lanes(bundle: Bundle) -> Inspector:
    settings = Config(device_id="t").model.model_copy(
        update={"threads": 2, "warmup": False, "encoder_lanes": 2, "encoder_cache_mb": 0})
    inspector = Inspector(bundle, settings, "t")
    inspector.use_programs({"quads": PROGRAM}, CAMERAS, ImageLimits())
    return inspector


def frame(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (2 * SIDE, 2 * SIDE, 3), dtype=np.uint8)


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, threading.Event, list[Exception]]]:
    """(inside, go, failed): an encode signals `inside` once it is in libmtmd's half, then waits for `go`;
    what libmtmd's half raised then (a closed context) is kept in `failed`."""
    inside, go = threading.Event(), threading.Event()
    failed: list[Exception] = []
    segments = MtmdContext.image_segments

    def waiting(self: MtmdContext, rgb: np.ndarray) -> Any:
        inside.set()
        assert go.wait(10)
        try:
            return segments(self, rgb)
        except Exception as exc:
            failed.append(exc)
            raise

    monkeypatch.setattr(MtmdContext, "image_segments", waiting)
    yield inside, go, failed
    go.set()


@pytest.mark.parametrize("regions", [False, True], ids=["frame", "regions"])
def test_close_waits_for_the_encodes_on_the_lanes_before_freeing_the_contexts(
        bundle: Bundle, held: tuple[threading.Event, threading.Event, list[Exception]], regions: bool) -> None:
    """An API image (the whole frame, on the caller's thread) or a camera's regions (on the lanes'
    threads) inside libmtmd when a reload closes the inspector: the close returns only after the encodes
    inside, which give their embeddings, not a closed (or freed) context's error. A frame whose crops were
    still being handed to the lanes when the close began is refused whole (stage 1 then hands it to the
    new model: the reload test below)."""
    inside, go, failed = held
    inspector = two_lanes(bundle)
    outcome: list[object] = []

    def encode() -> None:
        try:
            outcome.append(inspector.encode_frame("belt", frame(3)) if regions else inspector.encode(frame(3)))
        except Exception as exc:  # noqa: BLE001 - the assertion below names it
            outcome.append(exc)

    encoder = threading.Thread(target=encode)
    encoder.start()
    assert inside.wait(10)
    closer = threading.Thread(target=inspector.close)
    closer.start()
    closer.join(0.5)
    still_open = closer.is_alive() and not inspector.encoder.mtmd.closed  # type: ignore[union-attr]
    go.set()
    encoder.join(10)
    closer.join(10)
    assert not closer.is_alive() and inspector.mtmd is not None and inspector.mtmd.closed
    assert not failed, failed
    assert still_open, "close() freed the contexts under an encode"
    if regions and isinstance(outcome[0], InferenceError):
        assert str(outcome[0]) == CLOSED
    else:
        assert isinstance(outcome[0], Encoded), outcome[0]


@pytest.mark.parametrize("regions", [False, True], ids=["frame", "regions"])
def test_an_encode_after_close_is_refused_with_an_inference_error(bundle: Bundle, regions: bool) -> None:
    inspector = two_lanes(bundle)
    inspector.close()
    with pytest.raises(InferenceError, match="closed"):
        inspector.encode_frame("belt", frame(4)) if regions else inspector.encode(frame(4))


def test_two_lanes_are_both_built_and_freed_with_the_inspector(bundle: Bundle) -> None:
    inspector = two_lanes(bundle)
    contexts = list(inspector.encoder._contexts)
    assert len(contexts) == 2 and contexts[0] is inspector.mtmd
    inspector.close()
    assert all(c.closed for c in contexts)


def test_a_frame_whose_model_a_reload_closed_during_stage_1_is_encoded_again_with_the_new_one(
        bundle: Bundle, tmp_path: Path) -> None:
    """Stage 1 took the running inspector, then a reload replaced and closed it before the frame's regions
    were encoded: the closed encoder refuses, and stage 2 encodes the frame with the new inspector
    instead of failing it with the old one's refusal."""
    from edge_runtime.core.governor_gate import OpenGate
    from edge_runtime.core.inspection_queue import InspectionQueue, InspectionRequest
    from edge_runtime.inference.worker import InspectionWorker
    from edge_runtime.verdicts.journal import Journal
    from edge_runtime.verdicts.pipeline import VerdictPipeline

    old, new = two_lanes(bundle), two_lanes(bundle)
    running = [old]
    real = old.encode_frame

    def reloaded_first(*args: Any, **kwargs: Any) -> Encoded:
        running[0] = new  # the reload: the new model in, the old one closed
        old.close()
        return real(*args, **kwargs)

    old.encode_frame = reloaded_first  # type: ignore[method-assign]
    journal = Journal(tmp_path / "j.sqlite3")
    pipeline = VerdictPipeline(journal, lambda _camera: None)
    queue = InspectionQueue(4)
    worker = InspectionWorker(queue, lambda: running[0], journal, pipeline.deliver, OpenGate(), lambda _camera: None)
    future = queue.submit(InspectionRequest(frame(5), "belt"))
    worker.start()
    try:
        try:
            result = future.result(timeout=60)
        except InferenceError as exc:  # a region without a verdict of the random model: still the new encode
            assert CLOSED not in str(exc), str(exc)
        else:
            assert [r["name"] for r in result.regions or []] == ["q0", "q1", "q2", "q3"]
        assert sum(new.encoder.lane_encodes) == 4
    finally:
        worker.stop()
        journal.close()
        new.close()


@pytest.mark.parametrize("cache_mb", [0, 64])
def test_regions_of_one_box_are_encoded_once_on_the_lanes(bundle: Bundle, cache_mb: int) -> None:
    """Two regions with the same box (two questions about one part): one encode, whose embeddings both
    regions get. On two lanes the two crops would run at once, each missing the encoder cache."""
    twice = ProgramConfig.model_validate({"regions": [
        {"name": "screws", "box": [0, 0, SIDE, SIDE], "prompt": "Are the screws there?"},
        {"name": "label", "box": [0, 0, SIDE, SIDE], "prompt": "Is the label straight?"},
        {"name": "rest", "box": [SIDE, SIDE, SIDE, SIDE]}]})
    settings = Config(device_id="t").model.model_copy(
        update={"threads": 2, "warmup": False, "encoder_lanes": 2, "encoder_cache_mb": cache_mb})
    with Inspector(bundle, settings, "t") as inspector:
        inspector.use_programs({"twice": twice}, [CameraConfig(name="belt", source="x.png", program="twice")],
                               ImageLimits())
        enc = inspector.encode_frame("belt", frame(6))
        assert sum(inspector.encoder.lane_encodes) == 2
    (_, a), (_, b), (_, c) = enc.regions  # type: ignore[attr-defined]
    assert isinstance(a, Encoded) and isinstance(b, Encoded) and isinstance(c, Encoded)
    assert np.array_equal(a.embeds, b.embeds) and not np.array_equal(a.embeds, c.embeds)


def test_an_onnx_bundle_is_one_lane_whatever_encoder_lanes_says_and_counts_its_encodes(
        demo_bundle: Bundle, config: Config) -> None:
    """model.encoder_lanes 3 on an ONNX-encoder bundle: one session, one lane, whose encodes the status's
    `inspection.encoder_lanes` counts (not an empty list, as if nothing encoded)."""
    settings = config.model.model_copy(update={"warmup": False, "encoder_lanes": 3, "encoder_cache_mb": 0})
    with Inspector(demo_bundle, settings, "t") as inspector:
        inspector.encode(frame(7))
        inspector.encode(frame(8))
        assert inspector.encoder.lanes == 1 and inspector.encoder.lane_encodes == [2]
