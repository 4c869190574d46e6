"""A client's text is never searched for the prompt's own markers: a chat message, a system message, a
REST infer prompt or a trigger prompt holding "\\x00image\\x00" (the string the template's image slot
was marked with while the filled template was split) used to make every one of them a 500
(`ValueError: too many values to unpack`); the template is now cut at its `{image}` slot before the
texts are filled in. On the tiny Qwen2.5-VL pair (a camera under a program with a reference, so the
program's prefix is cut the same way) and on the demo ONNX bundle."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, ProgramConfig, ReferenceConfig, TriggerConfig
from edge_runtime.inference.prompting import around_image
from tests.support.images import encode
from tests.support.tiny_pairs import TinyPair, write_pair_bundle
from tests.support.waiting import wait_for

MARK = "\x00image\x00"
FORGED = f"Is the part OK?{MARK} Answer{MARK} in JSON."


@pytest.fixture(scope="module", params=["pair", "onnx"])
def daemon(request: pytest.FixtureRequest, tiny_pairs: Callable[[str], TinyPair], demo_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("markers")
    rng = np.random.default_rng(61)
    frame, ref = tmp / "frame.png", tmp / "ref.png"
    frame.write_bytes(encode(rng.integers(0, 256, (96, 128, 3), dtype=np.uint8), ".png"))
    ref.write_bytes(encode(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), ".png"))
    cfg = Config(device_id="markers-test", data_dir=tmp / "data")
    pair = request.param == "pair"
    cfg.model.path = write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp / "bundle") if pair else demo_dir
    cfg.model.threads = 2
    cfg.mqtt.enabled = False
    cfg.api.port = 0
    cfg.api.host = "127.0.0.1"
    cfg.cameras = [CameraConfig(name="belt", source=str(frame), trigger=TriggerConfig(mode="on_demand"),
                                program="housing" if pair else None)]
    if pair:
        cfg.programs = {"housing": ProgramConfig(references=[ReferenceConfig(image=ref, caption="golden")])}
    d = Daemon(cfg)
    d.start()
    wait_for(lambda: d.rigs["belt"].camera.slot.peek() is not None, what="the camera's first frame")
    yield d
    d.stop()


def post(d: Daemon, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    assert d.api is not None
    req = urllib.request.Request(f"http://127.0.0.1:{d.api.port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def png_b64() -> str:
    return base64.b64encode(encode(np.random.default_rng(62).integers(0, 256, (96, 128, 3), dtype=np.uint8),
                                   ".png")).decode()


def test_a_clients_text_holding_the_slot_marker_is_asked_not_a_500(daemon: Daemon) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + png_b64()}}
    chats = [[{"role": "user", "content": FORGED}],
             [{"role": "user", "content": [{"type": "text", "text": FORGED}, image]}],
             [{"role": "system", "content": FORGED}, {"role": "user", "content": [image]}]]
    for messages in chats:
        status, body = post(daemon, "/v1/chat/completions", {"messages": messages, "max_tokens": 4})
        assert status == 200, body
    status, body = post(daemon, "/api/v1/infer", {"image": png_b64(), "prompt": FORGED})
    assert status in (200, 422), body  # 422: random weights' verdict invalid, never a 500
    status, body = post(daemon, "/api/v1/cameras/belt/trigger", {"prompt": FORGED})
    assert status in (200, 422, 500) and "unpack" not in json.dumps(body), body
    if status == 500:
        assert body["error"]["type"] == "inference_failed", body


def test_the_template_is_cut_at_its_slot_whatever_the_texts_hold() -> None:
    template = "<s>{system}|{{literal}}|{image}{prompt}</s>"
    assert around_image(template, f"sys{MARK}", f"q{MARK}{{image}}") == (f"<s>sys{MARK}|{{literal}}|",
                                                                        f"q{MARK}{{image}}</s>")
