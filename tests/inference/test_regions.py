"""Regions and tiling of an inspection program (inference/regions.py) on the real demo bundle (ONNX
Runtime + llama.cpp): every region of a frame is a sequence of one batch and its verdict tokens equal
that crop inspected alone; the overall verdict is NOK when any region is NOK and never a default OK
when a region has no verdict; the bounds refuse a config in one line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.config import CameraConfig, Config, ImageLimits, ProgramConfig, load_config
from edge_runtime.core.batch import BatchJob
from edge_runtime.core.bundle.manifest import Bundle
from edge_runtime.core.errors import ConfigError, InferenceError, InputError
from edge_runtime.core.result import Result
from edge_runtime.core.samples import part_image
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.regions import RegionOutcome, RegionSpec, frame_regions, judge, overall

PROGRAM = ProgramConfig.model_validate({
    "regions": [{"name": "screw", "box": [10, 20, 120, 90]},
                {"name": "label", "box": [300, 200, 200, 150], "prompt": "Is the label straight? Answer in JSON."}],
    "tiling": {"rows": 1, "cols": 2, "overlap": 0.1},
})
def synthetic_frames(n: int, seed: int) -> list[np.ndarray]:
    """Parts on a belt, 640x480, every other one defective."""
    return [part_image(seed + i, defect=i % 2 == 0) for i in range(n)]


CAMERAS = [CameraConfig(name=n, source="x.png", program="housing") for n in ("left", "right")]


@pytest.fixture(scope="module")
def ins(demo_bundle: Bundle, config: Config) -> Iterator[Inspector]:
    inspector = Inspector(demo_bundle, config.model.model_copy(update={"warmup": False}), config.device_id)
    inspector.use_programs({"housing": PROGRAM}, CAMERAS, ImageLimits())
    yield inspector
    inspector.close()


def alone(ins: Inspector, frame: np.ndarray, box: list[int], prompt: str | None = None) -> Result:
    x, y, w, h = box
    return ins.inspect(frame[y:y + h, x:x + w], camera="nobody", prompt=prompt)


def test_each_regions_verdict_tokens_equal_that_crop_inspected_alone(ins: Inspector) -> None:
    frame = synthetic_frames(1, seed=61)[0]
    result = ins.inspect(frame, camera="left")
    assert result.regions is not None
    names = [r["name"] for r in result.regions]
    assert names == ["screw", "label", "tile_r1_c1", "tile_r1_c2"]
    assert (result.frame.width, result.frame.height) == (frame.shape[1], frame.shape[0])
    for region in result.regions:
        own = alone(ins, frame, region["box"],
                    "Is the label straight? Answer in JSON." if region["name"] == "label" else None)
        assert region["text"] == own.text and region["verdict"] == own.verdict, region["name"]
        assert region["outcome"] == ("nok" if own.verdict["defect"] else "ok")
    # The tiles cover the frame with their overlap, clipped at its edges.
    tiles = {r["name"]: r["box"] for r in result.regions}
    w = frame.shape[1]
    assert tiles["tile_r1_c1"][:2] == [0, 0] and tiles["tile_r1_c2"][0] + tiles["tile_r1_c2"][2] == w
    assert tiles["tile_r1_c1"][2] > w // 2  # grown into its neighbour
    nok = [r for r in result.regions if r["outcome"] == "nok"]
    assert result.verdict == (nok[0]["verdict"] if nok else result.regions[0]["verdict"])


def test_two_cameras_regions_in_one_batch_equal_one_at_a_time(ins: Inspector) -> None:
    frames = synthetic_frames(2, seed=62)
    one = [ins.inspect(f, camera=c) for f, c in zip(frames, ("left", "right"), strict=True)]
    batched = ins.inspect_batch([BatchJob(ins.encode_frame(c, f), camera=c)
                                 for f, c in zip(frames, ("left", "right"), strict=True)])
    for a, b in zip(one, batched, strict=True):
        assert isinstance(b, Result) and a.regions == b.regions and a.verdict == b.verdict


def test_a_region_without_a_verdict_is_never_a_default_ok(ins: Inspector, demo_bundle: Bundle, config: Config) -> None:
    ok = RegionOutcome(RegionSpec("a", (0, 0, 1, 1)), {"defect": False}, "", False)
    nok = RegionOutcome(RegionSpec("b", (0, 0, 1, 1)), {"defect": True}, "", True)
    none = judge(RegionSpec("c", (0, 0, 1, 1)), None, "", "defect", "outside the frame")
    assert overall([ok, nok, none]) is nok  # any NOK decides
    with pytest.raises(InferenceError, match=r"not OK: c \(outside the frame\)"):
        overall([ok, none])
    # A nok_field no verdict can hold would leave every region without one: refused when the program loads.
    odd = PROGRAM.model_copy(update={"nok_field": "missing_field"})
    with Inspector(demo_bundle, config.model.model_copy(update={"warmup": False}), "t") as other:
        with pytest.raises(ConfigError, match=r"programs\.housing\.nok_field .*'missing_field' is not a boolean"):
            other.use_programs({"housing": odd}, CAMERAS, ImageLimits())


def test_a_region_outside_a_smaller_frame_has_no_verdict(ins: Inspector) -> None:
    small = synthetic_frames(1, seed=64)[0][:120, :200]
    specs = frame_regions(PROGRAM, 200, 120)
    enc = ins.encode_frame("left", small)
    assert [type(e).__name__ for _, e in enc.regions][:2] == ["Encoded", "InputError"]  # type: ignore[attr-defined]
    assert len(specs) == 4
    try:
        result = ins.inspect(small, camera="left", encoded=enc)
    except InferenceError as exc:  # no region NOK: the frame is not OK
        assert "label" in str(exc)
    else:
        label = next(r for r in result.regions or [] if r["name"] == "label")
        assert label["outcome"] == "none" and "not inside" in label["error"] and result.verdict["defect"] is True


@pytest.mark.parametrize(("program", "why"), [
    ("{regions: [" + ", ".join(f"{{name: r{i}, box: [0, 0, 8, 8]}}" for i in range(1000)) + "]}",
     "at most 32 items"),
    ("{tiling: {rows: 50, cols: 50}}", "less than or equal to 8"),
    ("{regions: [{name: far, box: [600, 400, 100, 100]}]}", "region far [600, 400, 100, 100] is outside the "
                                                            "camera's 640x480 frame"),
])
def test_bad_regions_refuse_the_config_in_one_line(tmp_path: Path, program: str, why: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"programs:\n  housing: {program}\n"
                   "cameras:\n  - {name: belt, source: x.png, width: 640, height: 480, program: housing}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(cfg)
    assert why in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_a_region_whose_nok_field_is_not_true_or_false_has_no_verdict() -> None:
    # A schema may let the NOK field be null (type [boolean, null]): null says nothing about the part, so
    # that region has no verdict; it must not count as an OK region (bool(None) is False).
    spec = RegionSpec("screw", (0, 0, 1, 1))
    for value in (None, "false", 0):
        unsure = judge(spec, {"defect": value}, "", "defect")
        assert unsure.nok is None and unsure.to_dict()["outcome"] == "none", value
        assert "defect" in (unsure.error or "")
        with pytest.raises(InferenceError, match="not OK: screw"):
            overall([RegionOutcome(RegionSpec("a", (0, 0, 1, 1)), {"defect": False}, "", False), unsure])
    assert judge(spec, {"defect": False}, "", "defect").nok is False
    assert judge(spec, {"defect": True}, "", "defect").nok is True


def test_a_frame_encoded_before_a_reload_is_inspected_under_one_program(
        demo_bundle: Bundle, config: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reload that changes a camera's program lands after the worker's stage 1 encoded a frame under
    the old one: that frame is encoded again under the new program, never the old regions asked under
    the new program (its references, nok_field, regions)."""
    from edge_runtime.core.governor_gate import OpenGate
    from edge_runtime.core.inspection_queue import InspectionQueue, InspectionRequest
    from edge_runtime.inference.worker import InspectionWorker
    from edge_runtime.verdicts.journal import Journal
    from edge_runtime.verdicts.pipeline import VerdictPipeline

    old = ProgramConfig.model_validate({"regions": [{"name": "whole_left", "box": [0, 0, 320, 480]}]})
    new = ProgramConfig.model_validate({"regions": [{"name": "top", "box": [0, 0, 640, 240]},
                                                    {"name": "bottom", "box": [0, 240, 640, 240]}]})
    with Inspector(demo_bundle, config.model.model_copy(update={"warmup": False}), "t") as inspector:
        inspector.use_programs({"housing": old}, CAMERAS, ImageLimits())
        real = inspector.encode_frame

        def encode_then_reload(*args: object, **kwargs: object) -> object:
            encoded = real(*args, **kwargs)  # type: ignore[arg-type]
            inspector.use_programs({"housing": new}, CAMERAS, ImageLimits())  # the reload, just after
            return encoded

        monkeypatch.setattr(inspector, "encode_frame", encode_then_reload)
        journal = Journal(tmp_path / "j.sqlite3")
        pipeline = VerdictPipeline(journal, lambda _camera: None)
        queue = InspectionQueue(4)
        worker = InspectionWorker(queue, lambda: inspector, journal, pipeline.deliver, OpenGate(),
                                  lambda _camera: None)
        future = queue.submit(InspectionRequest(synthetic_frames(1, seed=65)[0], "left"))
        worker.start()
        try:
            try:
                result = future.result(timeout=60)
            except InferenceError as exc:  # no region NOK and one without a verdict: still the new regions
                assert "top" in str(exc) or "bottom" in str(exc), str(exc)
            else:
                assert [r["name"] for r in result.regions or []] == ["top", "bottom"]
        finally:
            worker.stop()
            journal.close()


def test_a_question_too_long_for_the_context_fails_its_own_frame_alone_naming_the_field(ins: Inspector) -> None:
    """A client's question (a trigger's `prompt`) that cannot fit the context once laid around a frame is
    that request's InputError, not the batch's and not a daemon fault: in a batch with other cameras'
    frames, the whole batch used to fail with it (a camera's scheduled frame lost, counted as its error),
    and on a regions camera, or beside one, it came back as an InferenceError (a 500 on REST)."""
    long = "Is the screw seated? " * 300  # under the byte bound, over the context in tokens
    frames = synthetic_frames(3, seed=64)
    plain = [BatchJob(ins.encode(f), camera=c, prompt=p)
             for f, c, p in zip(frames, ("a", "b", "c"), (None, long, None), strict=True)]
    outcomes = ins.inspect_batch(plain)
    assert isinstance(outcomes[0], Result) and isinstance(outcomes[2], Result), outcomes
    assert isinstance(outcomes[1], InputError) and "the context holds" in str(outcomes[1])
    # A regions camera's frame with the long question, batched with a plain frame that fits.
    mixed = ins.inspect_batch([BatchJob(ins.encode_frame("left", frames[0]), camera="left", prompt=long),
                               BatchJob(ins.encode(frames[1]), camera="b")])
    assert isinstance(mixed[0], InputError) and "the context holds" in str(mixed[0]), mixed
    assert isinstance(mixed[1], Result)
    # Alone: the same InputError (the worker answers a client's request with a 4xx naming the field).
    with pytest.raises(InputError, match="the context holds") as caught:
        ins.inspect(frames[0], camera="left", prompt=long)
    assert caught.value.field is not None


def test_a_camera_whose_every_frame_fails_degrades_health_until_it_delivers(
        demo_dir: Path, tmp_path: Path) -> None:
    """Seen on a running daemon: a camera of unknown size whose region lies outside its frames failed every
    frame (frames.errors rising, one ERROR line a minute) while its state said streaming and health said
    ok, so its results stopped with nothing showing it. Now five failures in a row make health degraded,
    naming the camera; the next delivered verdict heals it."""
    from edge_runtime.config import TriggerConfig
    from tests.support.file_daemon import daemon_from_file
    from tests.support.images import encode
    from tests.support.waiting import wait_for

    folder = tmp_path / "frames"
    folder.mkdir()
    (folder / "a.png").write_bytes(encode(synthetic_frames(1, seed=65)[0], ".png"))  # 640 x 480
    cfg = Config(device_id="failing", data_dir=tmp_path / "data")
    cfg.model.path = demo_dir
    cfg.model.threads = 2
    cfg.api.enabled = False
    cfg.mqtt.enabled = False
    cfg.cameras = [CameraConfig(name="belt", source=str(folder), fps=20, program="off",
                                trigger=TriggerConfig(mode="interval", interval_s=0.1))]
    cfg.programs = {"off": ProgramConfig.model_validate({"regions": [{"name": "r", "box": [600, 400, 100, 100]}]})}
    path = tmp_path / "edge.yaml"
    with daemon_from_file(path, cfg) as running:
        daemon = running.daemon
        wait_for(lambda: bool(running.reasons("belt")), timeout=30, what="the failing camera as a health reason")
        assert running.reasons("belt") == [
            "camera belt: its inspections keep failing (frames.errors in status; the log says why)"]
        assert daemon.health()["state"] == "degraded" and daemon.health()["ready"]
        cfg.programs["off"] = ProgramConfig.model_validate({"regions": [{"name": "r", "box": [500, 300, 100, 100]}]})
        path.write_text(cfg.model_dump_json())
        daemon.reload()
        wait_for(lambda: not running.reasons("belt"), timeout=30, what="the camera delivering again")
