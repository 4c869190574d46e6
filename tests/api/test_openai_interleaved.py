"""Several images among a chat's text (/v1/chat/completions): each image goes where its part is among
the text parts, as llama.cpp's server places a media marker, not all at the template's image slot with
the text after them ("Golden sample: <img> Part: <img> Same?" used to reach the model as
"<img><img>Golden sample:\\nPart:\\nSame?", so it could not tell which image was which). Our prompt's
first-token logits equal libmtmd's `mtmd_helper_eval_chunks` on the interleaved prompt (<= 1e-5) on every
tiny pair, and differ from the slot layout's; the API hands the worker the
offsets of a request's parts (one image, or images that all come before the text, keep the slot)."""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import Config
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.core.device import ChatJob
from edge_runtime.inference.inspector import Inspector
from tests.support.images import encode
from tests.support.mtmd_reference import text_logits
from tests.support.tiny_pairs import FAMILIES, TinyPair, write_pair_bundle

TOLERANCE = 1e-5
TEXTS = ("Golden sample:", "Part to inspect:", "Are they the same? Answer in JSON.")


def frames(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (96, 128, 3), dtype=np.uint8) for _ in range(n)]


def interleaved() -> tuple[str, tuple[int, int]]:
    """The conversation text of [text, image, text, image, text] (its parts joined by newlines) and
    where the two images go: after the first text, after the second."""
    prompt = "\n".join(TEXTS)
    return prompt, (len(TEXTS[0]), len(TEXTS[0]) + 1 + len(TEXTS[1]))


def helper_logits(ins: Inspector, images: list[np.ndarray], prompt: str, at: tuple[int, ...]) -> np.ndarray:
    """libmtmd's own path on the prompt with one media marker at each offset of `prompt`."""
    assert ins.mtmd is not None
    marked = prompt
    for offset in reversed(at):
        marked = marked[:offset] + ins.mtmd.marker + marked[offset:]
    p = ins.bundle.manifest.prompt
    return text_logits(ins, images, p.template.format(system=p.system, image="", prompt=marked))


def our_logits(ins: Inspector, images: list[np.ndarray], prompt: str, at: tuple[int, ...]) -> np.ndarray:
    prefix, image, suffix = ins.sequence(prompt, [ins.encode(img) for img in images], image_at=at)
    ins.language.forget_prefix(clear=True)
    return ins.language.prompt_logits(prefix, image, suffix)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_images_among_the_text_equal_libmtmds_interleaved_prompt(
        family: str, tiny_pairs: Callable[[str], TinyPair], tmp_path: Path) -> None:
    settings = Config(device_id="t").model.model_copy(update={"threads": 2, "warmup": False})
    with Inspector(load_bundle(write_pair_bundle(tiny_pairs(family), tmp_path / family)), settings, "t") as ins:
        images = frames(2, seed=71)
        prompt, at = interleaved()
        ref = helper_logits(ins, images, prompt, at)
        assert ref.std() > 0.5
        assert np.abs(our_logits(ins, images, prompt, at) - ref).max() <= TOLERANCE
        slot = our_logits(ins, images, prompt, ())  # all at the slot: another prompt
        assert np.abs(slot - ref).max() > 100 * TOLERANCE
        # The images at offset 0 are the slot layout (this template has {image}{prompt}).
        assert np.abs(our_logits(ins, images, prompt, (0, 0)) - slot).max() <= TOLERANCE
        # A third image after the last text: the text after it is the template's own.
        three = [*images, frames(1, seed=72)[0]]
        at3 = (*at, len(prompt))
        assert np.abs(our_logits(ins, three, prompt, at3) - helper_logits(ins, three, prompt, at3)).max() <= TOLERANCE


@pytest.fixture(scope="module")
def daemon(tiny_pairs: Callable[[str], TinyPair], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("interleaved")
    cfg = Config(device_id="interleaved-test", data_dir=tmp / "data")
    cfg.model.path = write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp / "bundle")
    cfg.model.threads = 2
    cfg.mqtt.enabled = False
    cfg.api.port = 0
    cfg.api.host = "127.0.0.1"
    cfg.cameras = []
    d = Daemon(cfg)
    d.start()
    yield d
    d.stop()


def image_part(img: np.ndarray) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(encode(img, ".png"))
                                               .decode()}}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def chat(d: Daemon, messages: list[dict[str, Any]]) -> dict[str, Any]:
    assert d.api is not None
    req = urllib.request.Request(f"http://127.0.0.1:{d.api.port}/v1/chat/completions", headers={
        "Content-Type": "application/json"}, data=json.dumps({"messages": messages, "max_tokens": 4}).encode())
    with urllib.request.urlopen(req, timeout=120) as resp:
        body: dict[str, Any] = json.loads(resp.read())
    return body


def test_the_api_hands_the_worker_where_each_image_was(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs: list[ChatJob] = []
    original = daemon.entry.chat

    def record(job: ChatJob) -> Any:
        jobs.append(job)
        return original(job)

    monkeypatch.setattr(daemon.entry, "chat", record)
    a, b, c = frames(3, seed=73)
    prompt, at = interleaved()
    chat(daemon, [{"role": "user", "content": [text_part(TEXTS[0]), image_part(a), text_part(TEXTS[1]),
                                               image_part(b), text_part(TEXTS[2])]}])
    assert (jobs[-1].prompt, jobs[-1].image_at) == (prompt, at)
    # Two turns and a system message: offsets into the whole conversation text, "User: " included.
    chat(daemon, [{"role": "system", "content": "You compare parts."},
                  {"role": "user", "content": [text_part("First:"), image_part(a)]},
                  {"role": "assistant", "content": "Noted."},
                  {"role": "user", "content": [image_part(b), text_part("Second, the same?"), image_part(c)]}])
    job = jobs[-1]
    assert job.prompt == "User: First:\nAssistant: Noted.\nUser: Second, the same?"
    assert job.image_at == (len("User: First:"), len("User: First:\nAssistant: Noted.\nUser: "), len(job.prompt))
    # One image, images that all come before the text, or one in a system message: the slot.
    for messages in ([{"role": "user", "content": [text_part("Is it OK?"), image_part(a)]}],
                     [{"role": "user", "content": [image_part(a), image_part(b), text_part("Same?")]}],
                     [{"role": "system", "content": [text_part("Golden:"), image_part(a)]},
                      {"role": "user", "content": [text_part("Part:"), image_part(b)]}]):
        chat(daemon, messages)
        assert jobs[-1].image_at == ()
