"""Configs under which a clip program is never asked: a camera whose trigger is on_demand (a REST or MQTT
trigger asks about one frame and is refused naming `clip`), and a line station that names no program on
a camera whose program has a clip (each job takes the camera's program and is refused the same way).
Both used to load and refuse every inspection at run time; each is one line when the config is read."""

from __future__ import annotations

import re

import pytest

from edge_runtime.config import ProgramConfig, parse_config
from edge_runtime.config.programs import ClipConfig, check_clip_pace
from edge_runtime.core.errors import ConfigError

PROGRAMS = "programs:\n  capping:\n    clip: {frames: 4, spacing_s: 0.5}\n  single: {}\n"


@pytest.mark.parametrize("mode", ["on_demand", "interval", "continuous", "on_change"])
def test_a_clip_on_an_on_demand_camera_is_one_line(mode: str) -> None:
    text = PROGRAMS + f"cameras:\n  - {{name: capper, source: x.png, program: capping, trigger: {{mode: {mode}}}}}\n"
    if mode != "on_demand":
        parse_config(text)
        return
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    message = str(caught.value)
    assert "cameras.capper.trigger.mode: on_demand never asks program capping's clip of 4 frames" in message
    assert "\n" not in message


@pytest.mark.parametrize("station_program", [None, "single"])
def test_a_station_inheriting_its_cameras_clip_is_one_line(station_program: str | None) -> None:
    station = ("line_io:\n  stations:\n    - name: st1\n      camera: capper\n"
               "      nok_when: [{field: verdict.defect, equals: true}]\n")
    if station_program is not None:
        station += f"      program: {station_program}\n"
    text = PROGRAMS + "cameras:\n  - {name: capper, source: x.png, program: capping}\n" + station
    if station_program is not None:
        parse_config(text)  # the station's own program: its jobs ask about one frame
        return
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    message = str(caught.value)
    assert "line_io.stations.st1.program: none is named, so its jobs take camera capper's program 'capping'" in message
    assert "\n" not in message


@pytest.mark.parametrize(("fps", "clip", "refused"), [
    (0.15, "{frames: 3, spacing_s: 0.3}", True),  # a frame every 6.7 s, the default gap 1.05 x 5.3 s
    (0.15, "{frames: 3, spacing_s: 0.3, max_gap_s: 10}", False),
    (0.06, "{frames: 3, spacing_s: 10}", False),  # every 16.7 s against a gap of 20 s: each frame kept
    (5, "{frames: 3, spacing_s: 0.3}", False),
])
def test_a_camera_slower_than_its_clips_gap_is_one_line(fps: float, clip: str, refused: bool) -> None:
    """Each frame of a camera slower than the clip's gap limit empties the ring (a stall, as the ring sees
    it): the clip never fills and the camera is never inspected, while its state says streaming and the
    daemon's health says ok (seen on a running daemon: clip_restarts rose with every frame, 0 inspected)."""
    text = (f"programs:\n  capping:\n    clip: {clip}\n"
            f"cameras:\n  - {{name: capper, source: x.avi, fps: {fps}, program: capping}}\n")
    if not refused:
        parse_config(text)
        return
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    message = str(caught.value)
    assert "programs.capping (camera capper): a frame every 6.7 s (fps 0.15)" in message
    assert "max_gap_s" in message and "\n" not in message


def _clip_camera(fps: float, clip: str) -> str:
    return (f"programs:\n  capping:\n    clip: {clip}\n"
            f"cameras:\n  - {{name: capper, source: x.avi, fps: {fps}, program: capping}}\n")


@pytest.mark.parametrize(("fps", "clip"), [
    (0.2, "{frames: 3, spacing_s: 0.3, max_gap_s: 5}"),  # a frame every 5 s against a gap of exactly 5 s
    (0.5, "{frames: 3, spacing_s: 3, max_gap_s: 3.5}"),  # every 2 s: spacing keeps every 2nd, 4 s apart
])
def test_a_clip_gap_that_leaves_no_room_for_a_late_frame_is_one_line(fps: float, clip: str) -> None:
    """2ad8f1b refused a frame interval over max_gap_s but took one equal to it, where any frame a little
    late starts the clip again, and compared the camera's interval where the ring compares its kept frames
    (spacing_s skips the frames between them)."""
    with pytest.raises(ConfigError) as caught:
        parse_config(_clip_camera(fps, clip))
    message = str(caught.value)
    assert "programs.capping (camera capper): a frame every" in message and "\n" not in message
    assert "set clip.max_gap_s to at least " in message


@pytest.mark.parametrize("spacing_s", [0, 0.2, 0.3, 5])
def test_the_default_gap_still_takes_a_camera_of_one_frame_in_5_s(spacing_s: float) -> None:
    """57e7749 added 5% of an interval to what the gap must be, not to its default (5 s at spacing_s 0):
    a camera at fps 0.2 with spacing_s 0 or 0.2, or 5 (one frame in 2 kept, 10 s apart against a default
    of 10 s), no longer loaded, and the daemon did not start after an update (seen refused on main)."""
    parse_config(_clip_camera(0.2, f"{{frames: 3, spacing_s: {spacing_s}}}"))  # docs: the default covers 5 s


def test_the_default_gap_refuses_no_camera_the_rule_before_the_margin_took() -> None:
    """Before 57e7749 a camera of known fps loaded when its frame interval was at most the gap limit; an
    unset max_gap_s must still take every such camera (an explicit one keeps the margin rule)."""
    refused = []
    for spacing_s in (0, 0.05, 0.2, 0.3, 1, 2.5, 4.9, 5, 5.2, 7, 10, 30, 3600):
        base = spacing_s + max(spacing_s, 5.0)
        intervals = {base, base * 0.999, spacing_s, spacing_s * 1.001, spacing_s / 2, spacing_s / 3, 5.0, 1 / 30,
                     *(base * k / 7 for k in range(1, 7))}
        for interval in sorted(i for i in intervals if 0 < i <= base):
            fps = 1 / interval
            if 1.0 / fps > base:  # 1 / (1 / interval) rounded over it: the old rule refused it too
                continue
            program = ProgramConfig(clip=ClipConfig(frames=3, spacing_s=spacing_s))
            try:
                check_clip_pace(program, fps, "capping", "capper")
            except ValueError:
                refused.append((spacing_s, round(interval, 4)))
    assert refused == []


def test_an_explicit_gap_too_small_for_fps_0_2_is_refused_and_its_advice_loads() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_clip_camera(0.2, "{frames: 3, spacing_s: 0, max_gap_s: 5}"))
    found = re.search(r"set clip\.max_gap_s to at least ([0-9.]+)", str(caught.value))
    assert found and found[1] == "5.3", caught.value
    parse_config(_clip_camera(0.2, f"{{frames: 3, spacing_s: 0, max_gap_s: {found[1]}}}"))


@pytest.mark.parametrize("fps", [1 / 6.64, 0.15, 1 / 5.29, 1 / 7.96, 0.5, 1 / 30])
def test_following_the_clip_gap_advice_is_accepted(fps: float) -> None:
    """The advice was the interval rounded to .1f: at a frame every 6.64 s it said "above 6.6" and 6.61
    was refused in its turn."""
    with pytest.raises(ConfigError) as caught:
        parse_config(_clip_camera(fps, "{frames: 3, spacing_s: 0.3, max_gap_s: 0.3}"))
    found = re.search(r"set clip\.max_gap_s (above|to at least) ([0-9.]+)", str(caught.value))
    assert found, caught.value
    advice = float(found[2]) + (0.01 if found[1] == "above" else 0)  # "above 6.6": as a user writes 6.61
    parse_config(_clip_camera(fps, f"{{frames: 3, spacing_s: 0.3, max_gap_s: {advice}}}"))
