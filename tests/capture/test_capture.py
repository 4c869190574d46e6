"""Camera sources on hostile and unusual input: folders, video files, missing sources, OpenCV's noise."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_runtime.capture.camera import Camera
from edge_runtime.capture.sources import IMAGE_SUFFIXES
from edge_runtime.config import CameraConfig, ImageLimits
from edge_runtime.core.samples import part_image, write_sample_video
from tests.support.hostile import corpus, encode, png_zero_bomb, write_corpus
from tests.support.mjpeg import free_port
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cameras() -> Iterator[list[Camera]]:
    started: list[Camera] = []
    yield started
    for cam in started:
        cam.stop()


def start(cameras: list[Camera], limits: ImageLimits | None = None, **cfg: object) -> Camera:
    cam = Camera(CameraConfig.model_validate({"name": "cam", "reconnect_min_s": 0.05, "reconnect_max_s": 0.2,
                                              **cfg}), limits)
    cameras.append(cam)
    cam.start()
    return cam


def test_folder_camera_refuses_every_hostile_file_once_and_keeps_streaming(
        tmp_path: Path, cameras: list[Camera], caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "watched"
    write_corpus(folder)
    (folder / "zz_good.png").write_bytes(encode(part_image(1, 320, 240), ".png"))
    listed = [name for name, _, _ in corpus() if Path(name).suffix in IMAGE_SUFFIXES]  # a folder skips .gif
    caplog.set_level(logging.WARNING, "edge_runtime.capture.camera")
    cam = start(cameras, source=str(folder), fps=200)
    wait_for(lambda: cam.stats.loops >= 3, 30, "three passes over the folder")
    assert cam._thread.is_alive() and cam.state.value == "streaming"
    assert cam.stats.refused == len(listed)  # each file refused once, skipped on later passes
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == len(listed)
    assert any("jpeg_truncated_eoi.jpg: the JPEG is corrupt or truncated" in m for m in refusals)
    assert any("png_bomb_zeros.png: the image declares 8000x8000 pixels" in m for m in refusals)
    frame = cam.slot.peek()
    assert frame is not None and frame.image.shape == (240, 320, 3)


def test_folder_of_only_refused_files_says_so(tmp_path: Path, cameras: list[Camera]) -> None:
    write_corpus(tmp_path / "junk")
    cam = start(cameras, source=str(tmp_path / "junk"), fps=200)
    wait_for(lambda: "file(s) refused" in (cam.last_error or ""), 30,
             "the folder's error")
    listed = [name for name, _, _ in corpus() if Path(name).suffix in IMAGE_SUFFIXES]
    assert f"no usable image at {tmp_path / 'junk'}: {len(listed)} file(s) refused" in (cam.last_error or "")


def test_folder_bomb_is_refused_without_growing_memory(tmp_path: Path) -> None:
    """A 12000x12000 black PNG (2 MB on disk, 432 MB decoded) in a watched folder: peak RSS stays flat."""
    folder = tmp_path / "drop"
    folder.mkdir()
    (folder / "bomb.png").write_bytes(png_zero_bomb(12000, 12000))
    (folder / "good.jpg").write_bytes(encode(part_image(2), ".jpg"))
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "support" / "folder_rss.py"), str(folder)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    growth_mb = float(proc.stdout.split()[-1])
    assert growth_mb < 100, f"peak RSS grew by {growth_mb:.0f} MB"


def test_image_limits_from_the_config_apply_to_folder_cameras(tmp_path: Path, cameras: list[Camera]) -> None:
    folder = tmp_path / "big"
    folder.mkdir()
    (folder / "a.png").write_bytes(encode(part_image(3, 640, 480), ".png"))
    cam = start(cameras, ImageLimits(max_pixels=100_000), source=str(folder), fps=50)
    wait_for(lambda: cam.stats.refused == 1, 10, "the refusal")
    assert "declares 640x480 pixels, more than the limit of 100000" in (cam.last_error or "")


def test_missing_folder_says_no_such_folder_then_recovers_and_clears_the_error(
        tmp_path: Path, cameras: list[Camera]) -> None:
    folder = tmp_path / "frames"
    cam = start(cameras, source=str(folder), fps=50)
    wait_for(lambda: cam.last_error, 10, "an error")
    assert cam.kind == "folder"
    assert cam.last_error == f"no such folder: {folder}"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(encode(part_image(4), ".jpg"))
    wait_for(lambda: cam.stats.captured > 0, 10, "a frame")
    wait_for(lambda: cam.last_error is None, 5, "the error to clear")
    assert cam.state.value == "streaming"


def test_looping_video_counts_loops_not_reconnects(tmp_path: Path, cameras: list[Camera]) -> None:
    video = write_sample_video(tmp_path / "short.avi", frames=4, fps=10, width=64, height=48)
    cam = start(cameras, source=str(video), fps=200)
    wait_for(lambda: cam.stats.loops >= 3, 20, "three loops")
    assert cam.stats.reconnects == 0
    assert cam.status().stats["loops"] >= 3


def test_video_frames_larger_than_max_pixels_are_refused(tmp_path: Path, cameras: list[Camera]) -> None:
    video = write_sample_video(tmp_path / "v.avi", frames=4, fps=10, width=320, height=240)
    cam = start(cameras, ImageLimits(max_pixels=10_000), source=str(video), fps=50)
    wait_for(lambda: cam.last_error, 10, "an error")
    assert "frames of 320x240 pixels are more than images.max_pixels (10000)" in (cam.last_error or "")
    assert cam.stats.captured == 0


def test_opencv_and_ffmpeg_lines_stay_out_of_stderr() -> None:
    """OpenCV's `[ WARN:0@...]` and FFmpeg's `[tcp @ 0x...]` lines would break the one-line-per-event log."""
    script = textwrap.dedent(f"""
        import logging, time
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        from edge_runtime.capture.camera import Camera
        from edge_runtime.config import CameraConfig
        cams = [Camera(CameraConfig(name="index", source=42, reconnect_min_s=5)),
                Camera(CameraConfig(name="rtsp", source="rtsp://127.0.0.1:{free_port()}/x", reconnect_min_s=5))]
        for c in cams:
            c.start()
        time.sleep(1.5)
        for c in cams:
            c.stop()
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENCV_")}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert any("camera index: reconnecting" in line for line in lines), lines
    assert any("camera rtsp: reconnecting" in line for line in lines), lines
    assert all(line.startswith(("INFO ", "WARNING ")) for line in lines), lines


def test_a_file_whose_decoder_raises_does_not_stop_the_folder(tmp_path: Path, cameras: list[Camera],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection: a decoder crash on the first file (any exception, not only ImageError)."""
    import edge_runtime.capture.sources as sources

    real = sources.read_image_file

    def crashing(path: Path, *args: object) -> object:
        if path.name == "a_crash.png":
            raise RuntimeError("decoder blew up")
        return real(path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(sources, "read_image_file", crashing)
    folder = tmp_path / "f"
    folder.mkdir()
    for name in ("a_crash.png", "b_good.png"):
        (folder / name).write_bytes(encode(part_image(5, 320, 240), ".png"))
    cam = start(cameras, source=str(folder), fps=50)
    wait_for(lambda: cam.stats.captured >= 2, 10, "frames from the good file")
    assert cam.stats.refused == 1 and cam._thread.is_alive()


def test_roi_crops_every_frame_before_it_reaches_the_slot(tmp_path: Path, cameras: list[Camera]) -> None:
    import cv2
    import numpy as np

    folder = tmp_path / "frames"
    folder.mkdir()
    image = np.zeros((120, 160, 3), np.uint8)
    image[:, :, 1] = np.arange(160, dtype=np.uint8)[None, :]  # green = x, red = y: a crop shows where it came from
    image[:, :, 2] = np.arange(120, dtype=np.uint8)[:, None]
    cv2.imwrite(str(folder / "a.png"), image)
    cam = start(cameras, source=str(folder), fps=20, roi=(30, 10, 50, 40))  # x, y, width, height
    wait_for(lambda: cam.slot.peek() is not None, what="a frame")
    frame = cam.slot.peek().image  # type: ignore[union-attr]
    assert frame.shape == (40, 50, 3)
    assert (frame == image[10:50, 30:80]).all()


@pytest.mark.parametrize(("roi", "shape"), [((140, 100, 50, 40), (20, 20, 3)),  # past the edge: clipped
                                            ((500, 500, 10, 10), (120, 160, 3))])  # outside: the whole frame
def test_roi_past_the_frame_edge_is_clipped_and_one_outside_it_keeps_the_frame(
        tmp_path: Path, cameras: list[Camera], roi: tuple[int, int, int, int], shape: tuple[int, int, int]) -> None:
    import cv2

    folder = tmp_path / "frames"
    folder.mkdir()
    cv2.imwrite(str(folder / "a.png"), part_image(0, 160, 120))
    cam = start(cameras, source=str(folder), fps=20, roi=roi)
    wait_for(lambda: cam.slot.peek() is not None, what="a frame")
    assert cam.slot.peek().image.shape == shape  # type: ignore[union-attr]


def test_credentials_in_a_camera_url_never_reach_status_or_logs(
        cameras: list[Camera], caplog: pytest.LogCaptureFixture) -> None:
    url = f"http://operator:s3cret-pw@127.0.0.1:{free_port()}/stream.mjpg"
    with caplog.at_level(logging.DEBUG):
        cam = start(cameras, source=url, open_timeout_s=1)
        wait_for(lambda: cam.status().last_error is not None, what="the open to fail")
    status = cam.status()
    assert status.source == url.replace("s3cret-pw", "***")
    assert "could not open" in (status.last_error or "") and "s3cret-pw" not in (status.last_error or "")
    assert caplog.records and not any("s3cret-pw" in r.getMessage() for r in caplog.records)
