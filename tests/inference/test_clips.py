"""A program's clip (capture/clip.py, inference/clips.py): one question about a camera's last N frames
taken T seconds apart, as one multi-image prompt on the tiny Qwen2.5-VL pair. The prompt holds the N
frames' images oldest first (its logits equal libmtmd's own helper on the same prompt), the ring never
holds more than N frames and keeps only frames T apart, the Result names the clip's frames; a clip of
10,000 frames, one too large for the ring and one on a bundle of one image are one-line refusals."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.capture.camera import Camera
from edge_runtime.capture.clip import ClipRing
from edge_runtime.capture.scheduler import CameraSchedule
from edge_runtime.config import CameraConfig, Config, ImageLimits, ProgramConfig, TriggerConfig, load_config
from edge_runtime.config.programs import ClipConfig, check_clip_pace
from edge_runtime.core.batch import ClipFrame
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.core.errors import ConfigError, EdgeRuntimeError, InputError
from edge_runtime.core.governor_gate import OpenGate
from edge_runtime.core.inspection_queue import InspectionQueue, InspectionRequest
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.mtmd import MediaEmbeds
from edge_runtime.inference.programs import check_bundle_programs
from tests.support.images import encode
from tests.support.mtmd_reference import helper_logits
from tests.support.tiny_pairs import TinyPair, write_pair_bundle

TOLERANCE = 1e-5
CLIP = ClipConfig(frames=3, spacing_s=0.5)
CAMERAS = [CameraConfig(name="capper", source="x.png", program="cap")]


def frames(n: int, seed: int, size: tuple[int, int] = (128, 96)) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8) for _ in range(n)]


def clip_of(images: list[np.ndarray], t0: float = 1_700_000_000.0) -> tuple[ClipFrame, ...]:
    return tuple(ClipFrame(img, 10 + i, t0 + 0.5 * i) for i, img in enumerate(images))


@pytest.fixture(scope="module")
def ins(tiny_pairs: Callable[[str], TinyPair], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inspector]:
    root = tmp_path_factory.mktemp("clips")
    settings = Config(device_id="t").model.model_copy(update={"threads": 2, "warmup": False})
    inspector = Inspector(load_bundle(write_pair_bundle(tiny_pairs("qwen2.5-vl"), root / "bundle")), settings, "t")
    inspector.use_programs({"cap": ProgramConfig(clip=CLIP)}, CAMERAS, ImageLimits())
    yield inspector
    inspector.close()


def test_a_clips_prompt_holds_its_frames_images_oldest_first(ins: Inspector) -> None:
    images = frames(3, seed=51)
    enc = ins.encode_frame("capper", images[-1], clip_of(images))
    prefix, image, suffix = ins.frame_sequence("capper", ins.default_prompt, enc)
    assert isinstance(image, list)
    blocks = [s.embeds for s in image if isinstance(s, MediaEmbeds)]
    alone = [np.concatenate([s.embeds for s in ins.encode(img).parts if isinstance(s, MediaEmbeds)])  # type: ignore[attr-defined]
             for img in images]
    assert len(blocks) == 3  # one block per frame on this projector
    for block, own in zip(blocks, alone, strict=True):
        assert np.array_equal(block, own)
    ins.language.forget_prefix(clear=True)
    ours = ins.language.prompt_logits(prefix, image, suffix)
    assert np.abs(ours - helper_logits(ins, images, ins.default_prompt)).max() <= TOLERANCE
    # Order matters: the frames newest first are another prompt (a mutation that reversed them fails).
    assert np.abs(ours - helper_logits(ins, images[::-1], ins.default_prompt)).max() > 100 * TOLERANCE


def test_the_result_names_the_clips_frames_and_their_times(ins: Inspector) -> None:
    images = frames(3, seed=52)
    clip = clip_of(images)
    result = ins.inspect(images[-1], camera="capper", seq=12, encoded=ins.encode_frame("capper", images[-1], clip))
    assert result.frame.seq == 12
    assert result.clip == [{"seq": 10, "captured_at": "2023-11-14T22:13:20.000Z"},
                           {"seq": 11, "captured_at": "2023-11-14T22:13:20.500Z"},
                           {"seq": 12, "captured_at": "2023-11-14T22:13:21.000Z"}]
    assert result.to_dict()["clip"] == result.clip
    assert "clip" not in ins.inspect(images[0], camera="api").to_dict()


def test_a_request_of_one_frame_for_a_clip_camera_is_refused_naming_clip(ins: Inspector) -> None:
    with pytest.raises(InputError, match=r"^clip: camera capper's program cap asks about a clip of 3 frames; "
                                         "this request holds 1") as caught:
        ins.inspect(frames(1, seed=53)[0], camera="capper")
    assert caught.value.field == "clip"


def test_a_frame_encoded_before_a_switch_to_a_clip_is_dropped_without_an_error(
        ins: Inspector, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A reload that puts a camera on a clip program lands after the worker's stage 1 encoded one of its
    frames under the old programs: that one frame cannot be asked about a clip, and it is the switch, not a
    misconfigured question: dropped at DEBUG, not re-encoded and logged as an ERROR counted against the camera."""
    from edge_runtime.inference.worker import InspectionWorker
    from edge_runtime.verdicts.journal import Journal
    from edge_runtime.verdicts.pipeline import VerdictPipeline

    ins.use_programs({}, [CameraConfig(name="capper", source="x.png")], ImageLimits())
    real = ins.encode_frame

    def encode_then_reload(*args: object, **kwargs: object) -> object:
        encoded = real(*args, **kwargs)  # type: ignore[arg-type]
        ins.use_programs({"cap": ProgramConfig(clip=CLIP)}, CAMERAS, ImageLimits())  # the reload, just after
        return encoded

    monkeypatch.setattr(ins, "encode_frame", encode_then_reload)
    journal = Journal(tmp_path / "j.sqlite3")
    queue = InspectionQueue(4)
    worker = InspectionWorker(queue, lambda: ins, journal, VerdictPipeline(journal, lambda _camera: None).deliver,
                              OpenGate(), lambda _camera: None)
    future = queue.submit(InspectionRequest(frames(1, seed=54)[0], "capper", trigger="interval"))
    caplog.set_level(logging.DEBUG, logger="edge_runtime.inference.worker")
    worker.start()
    try:
        with pytest.raises(EdgeRuntimeError, match="dropped: encoded before a reload switched it to a clip"):
            future.result(timeout=60)
    finally:
        worker.stop()
        journal.close()
        ins.use_programs({"cap": ProgramConfig(clip=CLIP)}, CAMERAS, ImageLimits())
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert worker.errors == 0 and "dropped" in caplog.text


def test_the_ring_never_holds_more_than_its_frames_and_keeps_only_frames_spacing_apart() -> None:
    ring = ClipRing(ClipConfig(frames=4, spacing_s=0.5))
    image = np.zeros((8, 8, 3), np.uint8)
    kept = []
    for seq in range(1, 201):  # 20 frames a second for 10 s
        if ring.offer(image, seq, 100.0 + seq * 0.05):
            kept.append(seq)
        assert len(ring) <= 4
    assert len(kept) == 20 and len(ring) == 4
    clip = ring.take()
    assert clip is not None and [f.seq for f in clip] == kept[-4:]
    gaps = np.diff([f.captured_at for f in clip])
    assert (gaps >= 0.5 - 1e-9).all()
    assert ring.take() is None  # no new frame since that clip: nothing to ask
    assert not ring.offer(image, 195, 100.0 + 195 * 0.05)  # 0.2 s after the newest: not kept
    assert ring.take() is None
    assert ring.offer(image, 201, 100.0 + 201 * 0.05)
    again = ring.take()
    assert again is not None and [f.seq for f in again] == [*kept[-3:], 201]


def test_a_camera_stall_longer_than_the_gap_limit_starts_the_clip_again() -> None:
    ring = ClipRing(ClipConfig(frames=3, spacing_s=0.5))  # default gap limit: 1.05 x (0.5 + 5 s) = 5.775 s
    image = np.zeros((8, 8, 3), np.uint8)
    for seq, at in ((1, 10.0), (2, 10.5), (3, 11.0)):
        assert ring.offer(image, seq, at)
    assert [f.seq for f in ring.take() or ()] == [1, 2, 3]
    assert ring.offer(image, 4, 11.0 + 5.8)  # the camera stalled 5.8 s: frames 1-3 are let go
    assert ring.restarts == 1 and len(ring) == 1
    assert ring.take() is None  # one frame after the stall is no clip yet
    assert ring.offer(image, 5, 17.3) and ring.offer(image, 6, 17.8)
    clip = ring.take()
    assert clip is not None and [f.seq for f in clip] == [4, 5, 6]  # only frames after the stall
    assert ring.offer(image, 7, 17.8 + 5.7)  # within the limit (5.7 s): kept beside the others
    assert ring.restarts == 1 and [f.seq for f in ring.take() or ()] == [5, 6, 7]


def test_an_explicit_gap_limit_lets_a_slow_camera_fill_its_clip() -> None:
    ring = ClipRing(ClipConfig(frames=2, spacing_s=0, max_gap_s=30))
    image = np.zeros((8, 8, 3), np.uint8)
    assert ring.offer(image, 1, 0.0) and ring.offer(image, 2, 20.0)  # one frame in 20 s
    assert ring.restarts == 0 and ring.take() is not None


@pytest.mark.parametrize(("spacing_s", "interval", "stall"), [(0, 2.0, 60.0), (0, 2.0, 0), (3, 2.0, 0),
                                                            (0.3, 6.64, 0), (5, 5.2, 0)])
def test_a_stuck_rings_advice_is_the_configs_rule_and_following_it_fills_the_clip(
        spacing_s: float, interval: float, stall: float) -> None:
    """The advice was "set max_gap_s above the camera's frame interval", which check_clip_pace refuses (it
    wants 5% of an interval more): now it is that rule (clip_gap_need) at the shortest gap the ring saw
    (a stall before a slow camera does not inflate it); a config and a ring with it are accepted and fill."""
    image = np.zeros((8, 8, 3), np.uint8)
    ring = ClipRing(ClipConfig(frames=2, spacing_s=spacing_s, max_gap_s=max(spacing_s, 1.0)))
    times = [0.0, *(stall + k * interval for k in range(1 if stall else 0, 8))]
    for seq, at in enumerate(times):
        ring.offer(image, seq, at)
    reason = ring.stuck()
    assert reason is not None, ring.streak
    found = re.search(r"set the program's clip\.max_gap_s to at least ([0-9.]+)$", reason)
    assert found, reason
    config = ClipConfig(frames=2, spacing_s=spacing_s, max_gap_s=float(found[1]))
    check_clip_pace(ProgramConfig(clip=config), 1 / interval, "cap", "capper")
    if spacing_s <= interval:  # every frame restarted the ring: it saw the interval, and says what the config does
        with pytest.raises(ValueError, match=re.escape(f"clip.max_gap_s to at least {found[1]} ")):
            check_clip_pace(ProgramConfig(clip=ring.config), 1 / interval, "cap", "capper")
    followed = ClipRing(config)
    for seq in range(12):  # a frame every `interval`, one in 3 read 1% of an interval late
        followed.offer(image, seq, seq * interval + (0.01 * interval if seq % 3 == 0 else 0))
    assert followed.restarts == 0 and followed.take() is not None and followed.stuck() is None


def test_a_gap_limit_below_the_spacing_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"max_gap_s 0\.2 is less than spacing_s 0\.5"):
        ClipConfig(frames=2, spacing_s=0.5, max_gap_s=0.2)


def test_the_ring_refuses_a_frame_over_its_share_of_the_bound() -> None:
    ring = ClipRing(ClipConfig(frames=4, spacing_s=0), max_bytes=4 * 8 * 8 * 3)
    assert not ring.offer(np.zeros((9, 8, 3), np.uint8), 1, 1.0)
    assert ring.too_large == 1 and len(ring) == 0
    assert ring.offer(np.zeros((8, 8, 3), np.uint8), 2, 2.0)


def test_a_camera_asks_about_its_last_frames_spacing_apart(tmp_path: Path) -> None:
    """Capture feeds the ring; the trigger loop queues one request per new clip, oldest first, spaced."""
    folder = tmp_path / "frames"
    folder.mkdir()
    for i, img in enumerate(frames(4, seed=54, size=(64, 48))):
        (folder / f"{i}.png").write_bytes(encode(img, ".png"))
    camera = Camera(CameraConfig(name="capper", source=str(folder), fps=20))
    queue = InspectionQueue(8)
    schedule = CameraSchedule(camera, TriggerConfig(mode="continuous"), None, queue, OpenGate())
    schedule.use_clip(ClipConfig(frames=3, spacing_s=0.2))
    camera.start()
    schedule.start()
    try:
        requests: list[InspectionRequest] = []
        deadline = time.monotonic() + 10
        while len(requests) < 3 and time.monotonic() < deadline:
            request = queue.get(timeout=0.5)
            if request is None:
                continue
            request.encoded.set()
            request.future.set_result(None)
            requests.append(request)
    finally:
        schedule.stop()
        camera.stop()
    assert len(requests) == 3
    assert schedule.clip is not None and len(schedule.clip) <= 3
    newest = []
    for request in requests:
        assert request.clip is not None and len(request.clip) == 3
        seqs = [f.seq for f in request.clip]
        assert seqs == sorted(seqs) and request.seq == seqs[-1] and request.image is request.clip[-1].image
        assert (np.diff([f.captured_at for f in request.clip]) >= 0.2).all()
        newest.append(seqs[-1])
    assert newest == sorted(set(newest))  # each request is a new clip
    assert schedule.stats.waiting_for_clip > 0


def test_a_clip_of_ten_thousand_frames_is_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("programs:\n  cap:\n    clip: {frames: 10000, spacing_s: 0.5}\n"
                   "cameras:\n  - {name: capper, source: x.png, program: cap}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(cfg)
    message = str(caught.value)
    assert "\n" not in message and "programs.cap.clip.frames" in message and "16" in message, message


def test_a_clip_larger_than_the_ring_bound_is_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("programs:\n  cap:\n    clip: {frames: 16, spacing_s: 0.5}\n"
                   "cameras:\n  - {name: capper, source: /dev/video0, width: 4096, height: 3072, program: cap}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(cfg)
    message = str(caught.value)
    assert "\n" not in message and "programs.cap (camera capper): clip of 16 frames of 4096x3072" in message
    cfg.write_text("programs:\n  cap:\n    clip: {frames: 4, spacing_s: 0.5}\n    tiling: {rows: 2, cols: 2}\n")
    with pytest.raises(ConfigError, match="a clip is one question about whole frames"):
        load_config(cfg)


def test_a_bundle_of_one_image_refuses_a_clip_in_one_line(inspector: Inspector) -> None:
    with pytest.raises(ConfigError, match=r"^programs.cap \(cameras: capper\): a clip needs a bundle that takes "
                                          "several images"):
        check_bundle_programs(inspector.bundle, {"cap": ProgramConfig(clip=CLIP)}, CAMERAS)
    with pytest.raises(ConfigError, match="a clip needs"):
        inspector.use_programs({"cap": ProgramConfig(clip=CLIP)}, CAMERAS, ImageLimits())
    assert inspector.program_of("capper") is None


def test_a_camera_slower_than_its_clips_gap_shows_degraded_until_the_gap_fits(
        tiny_pairs: Callable[[str], TinyPair], tmp_path: Path) -> None:
    """Seen on a running daemon: a clip camera whose frames came further apart than the clip's max_gap_s
    emptied its ring at every frame, so nothing was ever inspected, while the camera said streaming and
    health said ok. A camera of unknown fps (a stream, a file at its own pace) cannot be refused by the
    config: health is degraded naming the camera, and heals when a reload gives the clip a gap that fits."""
    from edge_runtime.core.samples import write_sample_video
    from tests.support.file_daemon import daemon_from_file
    from tests.support.waiting import wait_for

    video = write_sample_video(tmp_path / "slow.avi", frames=40, fps=4, width=64, height=48)  # a frame every 0.25 s
    cfg = Config(device_id="clip-health", data_dir=tmp_path / "data")
    cfg.model.path = write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp_path / "bundle")
    cfg.model.threads = 2
    cfg.api.enabled = False
    cfg.mqtt.enabled = False
    cfg.cameras = [CameraConfig(name="capper", source=str(video), program="cap",
                                trigger=TriggerConfig(mode="continuous"))]
    cfg.programs = {"cap": ProgramConfig(clip=ClipConfig(frames=2, spacing_s=0.05, max_gap_s=0.1))}
    path = tmp_path / "edge.yaml"
    with daemon_from_file(path, cfg) as running:
        daemon = running.daemon
        wait_for(lambda: bool(running.reasons("capper")), timeout=20, what="the stuck clip as a health reason")
        assert "its clip never fills" in running.reasons("capper")[0]
        assert "max_gap_s (0.1 s)" in running.reasons("capper")[0]
        assert daemon.health()["state"] == "degraded" and daemon.health()["ready"]
        assert daemon.rigs["capper"].schedule.stats.inspected == 0
        cfg.programs["cap"] = ProgramConfig(clip=ClipConfig(frames=2, spacing_s=0.05, max_gap_s=2))
        path.write_text(cfg.model_dump_json())
        daemon.reload()
        wait_for(lambda: daemon.rigs["capper"].schedule.stats.inspected > 0, timeout=30, what="a clip asked")
        assert running.reasons("capper") == []
