"""Inspection programs in a running daemon (tiny Qwen2.5-VL pair): the references are encoded at start,
a camera's verdict runs under its program, a tiled camera's result holds a verdict per tile, a reload
with a corrupt reference is refused in one line and the running program keeps serving, and a reload
that only changes a caption encodes nothing again (the references come from the encoder cache)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.config import CameraConfig, Config, ProgramConfig, ReferenceConfig, TriggerConfig
from edge_runtime.core.errors import EdgeRuntimeError, InferenceError
from tests.support.file_daemon import daemon_from_file
from tests.support.images import encode
from tests.support.tiny_pairs import TinyPair, write_pair_bundle
from tests.support.waiting import wait_for


def test_a_program_survives_a_refused_reload_and_reloads_from_the_cache(
        tiny_pairs: Callable[[str], TinyPair], tmp_path: Path) -> None:
    rng = np.random.default_rng(51)
    images = [rng.integers(0, 256, (96, 128, 3), dtype=np.uint8) for _ in range(3)]
    paths = []
    for i, img in enumerate(images):
        paths.append(tmp_path / f"img{i}.png")
        paths[-1].write_bytes(encode(img, ".png"))
    cfg = Config(device_id="programs-test", data_dir=tmp_path / "data")
    cfg.model.path = write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp_path / "bundle")
    cfg.model.threads = 2
    cfg.api.enabled = False
    cfg.mqtt.enabled = False
    cfg.cameras = [CameraConfig(name="belt", source=str(paths[2]), program="housing",
                                trigger=TriggerConfig(mode="on_demand")),
                   CameraConfig(name="cover", source=str(paths[2]), program="halves",
                                trigger=TriggerConfig(mode="on_demand"))]
    cfg.programs = {"housing": ProgramConfig(references=[ReferenceConfig(image=paths[0], caption="golden OK sample"),
                                                         ReferenceConfig(image=paths[1], caption="known NOK")]),
                    "halves": ProgramConfig.model_validate({"tiling": {"rows": 1, "cols": 2}})}
    path = tmp_path / "edge.yaml"
    with daemon_from_file(path, cfg) as started:
        daemon = started.daemon
        ins = daemon.inspector
        assert ins is not None
        program = ins.program_of("belt")
        assert program is not None and [r.caption for r in program.references] == ["golden OK sample", "known NOK"]
        wait_for(lambda: daemon.rigs["belt"].camera.slot.peek() is not None, what="the camera's first frame")
        result = daemon.entry.trigger("belt").result(timeout=60)
        assert set(result.verdict) == {"defect", "category"} and result.regions is None
        # A tiled camera through the worker's two stages: a verdict per tile, journaled with the result.
        wait_for(lambda: daemon.rigs["cover"].camera.slot.peek() is not None, what="the cover camera's frame")
        try:
            tiled = daemon.entry.trigger("cover").result(timeout=60)
        except InferenceError as exc:  # random weights: no tile NOK and one without a verdict
            assert "regions without a verdict" in str(exc)
        else:
            assert [r["name"] for r in tiled.regions or []] == ["tile_r1_c1", "tile_r1_c2"]
            stored = daemon.journal.get(tiled.id)
            assert stored is not None and stored["regions"] == tiled.regions

        data = json.loads(path.read_text())
        broken = tmp_path / "broken.png"
        broken.write_bytes(paths[0].read_bytes()[:50])
        data["programs"]["housing"]["references"][1]["image"] = str(broken)
        path.write_text(json.dumps(data))
        with pytest.raises(EdgeRuntimeError, match="reload refused") as caught:
            daemon.reload()
        assert f"references.1.image {broken}" in str(caught.value) and "\n" not in str(caught.value)
        assert ins.program_of("belt") is program  # the old program keeps running
        assert daemon.entry.trigger("belt").result(timeout=60).verdict == result.verdict

        misses = ins.encoder_cache.stats()["misses"]
        data["programs"]["housing"]["references"][1] = {"image": str(paths[1]), "caption": "known NOK: missing screw"}
        path.write_text(json.dumps(data))
        assert any(k.startswith("programs") for k in daemon.reload()["applied"])
        fresh = ins.program_of("belt")
        assert fresh is not None and fresh is not program and fresh.references[1].caption == "known NOK: missing screw"
        assert ins.encoder_cache.stats()["misses"] == misses  # both references were cache hits
        daemon.entry.trigger("belt").result(timeout=60)


def test_a_reference_file_replaced_under_the_same_config_is_encoded_again_on_reload(
        tiny_pairs: Callable[[str], TinyPair], tmp_path: Path) -> None:
    """The config did not change, the golden sample did: a reload used to say `applied: nothing` and
    keep inspecting against the old picture until a restart."""
    rng = np.random.default_rng(52)
    ref, other, frame = (tmp_path / n for n in ("ref.png", "other.png", "frame.png"))
    for path in (ref, other, frame):
        path.write_bytes(encode(rng.integers(0, 256, (96, 128, 3), dtype=np.uint8), ".png"))
    cfg = Config(device_id="programs-test", data_dir=tmp_path / "data")
    cfg.model.path = write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp_path / "bundle")
    cfg.model.threads = 2
    cfg.api.enabled = False
    cfg.mqtt.enabled = False
    cfg.cameras = [CameraConfig(name="belt", source=str(frame), program="housing",
                                trigger=TriggerConfig(mode="on_demand"))]
    cfg.programs = {"housing": ProgramConfig(references=[ReferenceConfig(image=ref, caption="golden OK sample")])}
    path = tmp_path / "edge.yaml"
    with daemon_from_file(path, cfg) as started:
        daemon = started.daemon
        ins = daemon.inspector
        assert ins is not None
        running = ins.program_of("belt")
        assert daemon.reload()["applied"] == []  # nothing changed: nothing encoded again
        assert ins.program_of("belt") is running
        misses = ins.encoder_cache.stats()["misses"]
        ref.write_bytes(other.read_bytes())  # the file replaced, the config untouched
        assert daemon.reload()["applied"] == ["programs.housing.references.0"]
        fresh = ins.program_of("belt")
        assert fresh is not None and running is not None and fresh is not running
        assert ins.encoder_cache.stats()["misses"] == misses + 1  # the new picture was encoded
        assert not np.array_equal(fresh.references[0].encoded.embeds, running.references[0].encoded.embeds)


def _tight_reference_config(tiny_pairs: Callable[[str], TinyPair], tmp_path: Path, seed: int,
                            prompt: str | None = None) -> Config:
    """A config whose camera `belt` runs a one-reference program in a context
    with little room: the reference, a 32x32 frame's few tokens, the text and 140 answer tokens fit;
    a 256x256 frame's 64 tokens, or a much longer question, do not."""
    rng = np.random.default_rng(seed)
    ref, frame = tmp_path / "ref.png", tmp_path / "frame.png"
    ref.write_bytes(encode(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), ".png"))
    frame.write_bytes(encode(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), ".png"))
    cfg = Config(device_id="programs-test", data_dir=tmp_path / "data")
    cfg.model.path = write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp_path / "bundle")
    cfg.model.threads = 2
    cfg.model.context_size = 256
    cfg.model.max_tokens = 140
    cfg.model.warmup = False  # the warm-up's own frame is not the camera's
    cfg.api.enabled = False
    cfg.mqtt.enabled = False
    cfg.cameras = [CameraConfig(name="belt", source=str(frame), program="housing", width=32, height=32,
                                prompt=prompt, trigger=TriggerConfig(mode="on_demand"))]
    cfg.programs = {"housing": ProgramConfig(references=[ReferenceConfig(image=ref, caption="golden")])}
    return cfg


def test_a_reload_that_grows_a_camera_past_its_programs_context_is_refused_whole(
        tiny_pairs: Callable[[str], TinyPair], tmp_path: Path) -> None:
    """The program is unchanged; the camera's frame grows so that its reference, the frame's image tokens
    and the answer no longer fit the context (`config validate` refuses this file). The reload used to
    apply it (`applied: cameras`): the program was not checked again, so every frame of the camera
    would be refused. It is refused in one line and the running camera and program stay."""
    with daemon_from_file(tmp_path / "edge.yaml", _tight_reference_config(tiny_pairs, tmp_path, seed=53)) as started:
        daemon, path = started.daemon, started.path
        ins = daemon.inspector
        assert ins is not None
        running = ins.program_of("belt")
        data = json.loads(path.read_text())
        data["cameras"][0].update(width=256, height=256)
        path.write_text(json.dumps(data))
        for _ in range(2):  # and again: the refused file is not what the next reload compares with
            with pytest.raises(EdgeRuntimeError, match="reload refused") as caught:
                daemon.reload()
            message = str(caught.value)
            assert "programs.housing (camera belt)" in message and "context of 256 tokens" in message
            assert "\n" not in message
            cam = daemon.running.config.cameras[0]
            assert (cam.width, cam.height) == (32, 32)
            assert ins.program_of("belt") is running
        data["cameras"][0].update(width=48, height=48)  # a size that fits: applied
        path.write_text(json.dumps(data))
        assert daemon.reload()["applied"] == ["cameras"]
        assert daemon.running.config.cameras[0].width == 48


def test_a_reload_that_lengthens_a_program_cameras_question_past_the_context_is_refused_whole(
        tiny_pairs: Callable[[str], TinyPair], tmp_path: Path) -> None:
    """The program and the frame are unchanged; the camera's question grows so that it, the reference, the
    frame and the answer no longer fit the context (`config validate` and a start refuse this file). The
    reload used to apply it (`applied: cameras`) without checking the program again, so every frame of
    the camera would fail. It is refused in one line and the running question stays."""
    cfg = _tight_reference_config(tiny_pairs, tmp_path, seed=59, prompt="Is the housing whole?")
    with daemon_from_file(tmp_path / "edge.yaml", cfg) as started:
        daemon, path = started.daemon, started.path
        data = json.loads(path.read_text())
        data["cameras"][0]["prompt"] = "Is the housing whole? " * 40
        path.write_text(json.dumps(data))
        with pytest.raises(EdgeRuntimeError, match="reload refused") as caught:
            daemon.reload()
        message = str(caught.value)
        assert "programs.housing (camera belt)" in message and "\n" not in message
        assert daemon.running.config.cameras[0].prompt == "Is the housing whole?"
        data["cameras"][0]["prompt"] = "Is the housing whole and clean?"  # a question that fits: applied
        path.write_text(json.dumps(data))
        assert daemon.reload()["applied"] == ["cameras"]
        assert daemon.running.config.cameras[0].prompt == "Is the housing whole and clean?"


def test_programs_changed_with_a_model_that_fails_to_load_are_loaded_on_the_running_model(
        tiny_pairs: Callable[[str], TinyPair], tmp_path: Path) -> None:
    """A reload changes the model's settings and a program; the new model fails to load (its max_tokens
    leaves no room for the program's prompt), so the running model stays. The program change was
    then applied to the config but never loaded: the camera kept its old program, and as the running
    config already named the new one, no later reload of the same file loaded it either."""
    rng = np.random.default_rng(54)
    ref, other, frame = (tmp_path / n for n in ("ref.png", "other.png", "frame.png"))
    for path in (ref, other, frame):
        path.write_bytes(encode(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), ".png"))
    cfg = Config(device_id="programs-test", data_dir=tmp_path / "data")
    cfg.model.path = write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp_path / "bundle")
    cfg.model.threads = 2
    cfg.model.context_size = 512
    cfg.model.warmup = False
    cfg.api.enabled = False
    cfg.mqtt.enabled = False
    cfg.cameras = [CameraConfig(name="belt", source=str(frame), program="housing", width=64, height=64,
                                trigger=TriggerConfig(mode="on_demand"))]
    cfg.programs = {"housing": ProgramConfig(references=[ReferenceConfig(image=ref, caption="golden")])}
    path = tmp_path / "edge.yaml"
    with daemon_from_file(path, cfg) as started:
        daemon = started.daemon
        ins = daemon.inspector
        assert ins is not None
        data = json.loads(path.read_text())
        data["model"]["max_tokens"] = 500  # no room for the program's prompt: the new model is refused
        data["programs"]["housing"]["references"].append({"image": str(other), "caption": "known NOK"})
        path.write_text(json.dumps(data))
        daemon.reload()
        assert daemon.inspector is ins and daemon.running.config.model.max_tokens != 500  # the model stayed
        program = ins.program_of("belt")
        assert program is not None and [r.caption for r in program.references] == ["golden", "known NOK"]
