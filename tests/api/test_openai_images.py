"""Several `image_url` parts in one /v1/chat/completions request, through the official `openai` client
against a real daemon on the tiny Qwen2.5-VL pair (libmtmd); the bounds (api.max_images_per_request,
api.max_request_pixels) refuse before any image is decoded; an ONNX-encoder bundle refuses a second
image in one line."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import jsonschema
import numpy as np
import pytest

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import Config
from tests.support.images import encode
from tests.support.tiny_pairs import TinyPair, write_pair_bundle

SCHEMA = {"type": "object", "properties": {"same": {"type": "boolean"}}, "required": ["same"],
          "additionalProperties": False}
MAX_PIXELS = 3 * 128 * 96 - 1  # two 128x96 images fit, a third does not


def start(tmp: Path, bundle: Path, context_size: int | None = None, max_pixels: int = MAX_PIXELS) -> Daemon:
    cfg = Config(device_id="images-test", data_dir=tmp / "data")
    cfg.model.path = bundle
    cfg.model.threads = 2
    if context_size is not None:
        cfg.model.context_size = context_size
    cfg.mqtt.enabled = False
    cfg.api.port = 0
    cfg.api.host = "127.0.0.1"
    cfg.api.max_request_pixels = max_pixels
    cfg.cameras = []
    d = Daemon(cfg)
    d.start()
    return d


@pytest.fixture(scope="module")
def pair_daemon(tiny_pairs: Callable[[str], TinyPair], tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("images")
    d = start(tmp, write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp / "bundle"))
    yield d
    d.stop()


@pytest.fixture(scope="module")
def openai_client(pair_daemon: Daemon) -> Iterator[Any]:
    from openai import OpenAI
    assert pair_daemon.api is not None
    with OpenAI(base_url=f"http://127.0.0.1:{pair_daemon.api.port}/v1", api_key="unused", max_retries=0) as client:
        yield client


def data_url(image: np.ndarray) -> str:
    return "data:image/png;base64," + base64.b64encode(encode(image, ".png")).decode()


def png_header_only(width: int, height: int) -> str:
    """A PNG whose header declares width x height and whose pixels are missing: decoding it fails,
    reading its header does not."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    idat = struct.pack(">I", 4096) + b"IDAT" + b"\x78\x9c" + b"\x00" * 14  # cut short: no pixels follow
    return "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + chunk + idat).decode()


def images(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (96, 128, 3), dtype=np.uint8) for _ in range(n)]


def body(caught: pytest.ExceptionInfo[Any]) -> dict[str, Any]:
    """The OpenAI error object of a refused request."""
    return cast(dict[str, Any], caught.value.body)


def ask(parts: list[dict[str, Any]]) -> Any:
    return [{"role": "user", "content": [{"type": "text", "text": "Are the two parts the same?"}, *parts]}]


def test_the_openai_client_sends_two_images_and_gets_a_schema_valid_answer(openai_client: Any,
                                                                           pair_daemon: Daemon) -> None:
    a, b = images(2, seed=31)
    parts = [{"type": "image_url", "image_url": {"url": data_url(img)}} for img in (a, b)]
    answer = openai_client.chat.completions.create(
        model="default", messages=ask(parts), max_tokens=64,
        response_format={"type": "json_schema", "json_schema": {"name": "same", "schema": SCHEMA}})
    choice = answer.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    # Both images are in the prompt: the prompt is longer than with one of them.
    one = openai_client.chat.completions.create(model="default", messages=ask(parts[:1]), max_tokens=4)
    assert answer.usage.prompt_tokens > one.usage.prompt_tokens


def test_64_images_are_a_400_naming_the_first_part_over_the_limit(openai_client: Any) -> None:
    """Garbage data URLs: were any decoded first, the error would be about an unreadable image."""
    import openai
    parts = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}} for _ in range(64)]
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.chat.completions.create(model="default", messages=ask(parts), max_tokens=4)
    error = body(caught)
    assert error["param"] == "messages.0.content.9.image_url.url"  # the ninth image (part 0 is the text)
    assert "api.max_images_per_request" in error["message"] and "64 images" in error["message"]


def test_images_over_the_request_pixel_bound_are_a_413_before_decoding(openai_client: Any) -> None:
    import openai
    a, b = images(2, seed=32)
    parts = [{"type": "image_url", "image_url": {"url": url}}
             for url in (data_url(a), data_url(b), png_header_only(128, 96))]
    with pytest.raises(openai.APIStatusError) as caught:
        openai_client.chat.completions.create(model="default", messages=ask(parts), max_tokens=4)
    assert caught.value.status_code == 413
    assert body(caught)["param"] == "messages.0.content.3.image_url.url"
    assert "api.max_request_pixels" in body(caught)["message"]


@pytest.fixture(scope="module")
def demo_daemon(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start(tmp_path_factory.mktemp("demo"), demo_dir)
    yield d
    d.stop()


def test_an_onnx_bundle_refuses_a_second_image_in_one_line(demo_daemon: Daemon) -> None:
    from openai import BadRequestError, OpenAI
    assert demo_daemon.api is not None
    parts = [{"type": "image_url", "image_url": {"url": data_url(img)}} for img in images(2, seed=33)]
    with OpenAI(base_url=f"http://127.0.0.1:{demo_daemon.api.port}/v1", api_key="unused", max_retries=0) as client, \
            pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(model="default", messages=ask(parts), max_tokens=4)
    assert body(caught)["param"] == "messages.0.content.2.image_url.url"
    assert "one image per request" in body(caught)["message"]
    assert "\n" not in body(caught)["message"]


@pytest.mark.parametrize(("part", "field"), [
    ({"type": "image_url"}, "messages.0.content.1.image_url"),
    ({"type": "text"}, "messages.0.content.1.text"),
    ({"type": "image_url", "image_url": {"url": 5}}, "messages.0.content.1.image_url.url"),
    ({"type": "image_url", "image_url": {"url": None}}, "messages.0.content.1.image_url.url"),
    ({"type": "image_url", "image_url": {"url": ""}}, "messages.0.content.1.image_url.url"),
    ({"type": "image_url", "image_url": {}}, "messages.0.content.1.image_url.url"),
    ({"type": "image_url", "image_url": "data:image/png;base64,AAAA"}, "messages.0.content.1.image_url"),
    ({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}, "messages.0.content.1.type"),
])
def test_a_missing_or_malformed_part_is_a_400_naming_that_part(openai_client: Any, part: dict[str, Any],
                                                               field: str) -> None:
    """Never dropped (a 200 would tell the client the model saw an image it never got) and never
    reported as the str|list fallback `messages.0.content: Input should be a valid string`."""
    import openai
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.chat.completions.create(model="default", messages=ask([part]), max_tokens=2)
    assert body(caught)["param"] == field
    assert body(caught)["message"].startswith(f"{field}: ")
    assert "valid string" not in body(caught)["message"] or field.endswith(".url")


@pytest.mark.parametrize(("content", "field"), [
    ([], "messages.0.content"),
    ([[{"type": "text", "text": "hi"}]], "messages.0.content.0"),
    (5, "messages.0.content"),
])
def test_an_empty_nested_or_scalar_content_is_a_400_naming_it(openai_client: Any, content: Any,
                                                              field: str) -> None:
    import openai
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.chat.completions.create(model="default", messages=[{"role": "user", "content": content}],
                                              max_tokens=2)
    assert body(caught)["param"] == field
    assert "valid string" not in body(caught)["message"]


@pytest.fixture(scope="module")
def small_context_daemon(tiny_pairs: Callable[[str], TinyPair], tmp_path_factory: pytest.TempPathFactory
                         ) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("small-ctx")
    cfg_bundle = write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp / "bundle")
    d = start(tmp, cfg_bundle, context_size=256, max_pixels=64 * 1024 * 1024)
    yield d
    d.stop()


def test_images_that_cannot_fit_the_context_are_refused_before_any_is_encoded(small_context_daemon: Daemon
                                                                                ) -> None:
    """Refused after every image went through the projector, a request cost all its encodes for a 400."""
    from openai import BadRequestError, OpenAI
    assert small_context_daemon.api is not None and small_context_daemon.inspector is not None
    cache = small_context_daemon.inspector.encoder_cache
    rng = np.random.default_rng(35)
    big = [rng.integers(0, 256, (448, 448, 3), dtype=np.uint8) for _ in range(8)]
    parts = [{"type": "image_url", "image_url": {"url": data_url(img)}} for img in big]
    misses = cache.stats()["misses"]
    with OpenAI(base_url=f"http://127.0.0.1:{small_context_daemon.api.port}/v1", api_key="x", max_retries=0) as c:
        with pytest.raises(BadRequestError) as caught:
            c.chat.completions.create(model="default", messages=ask(parts), max_tokens=2)
    assert body(caught)["param"] == "messages"
    assert "image tokens" in body(caught)["message"] and "the context holds 256" in body(caught)["message"]
    assert cache.stats()["misses"] - misses <= 1  # at most the first, encoded ahead by the worker


@pytest.mark.parametrize("at", [0, 1])
def test_an_image_over_the_token_budget_is_a_400_naming_its_own_part(openai_client: Any, at: int) -> None:
    """A 16 px high strip cannot be shrunk under the bundle's image_max_tokens: the refusal named `image`,
    not the part, so a client that sent several images could not tell which one (seen on a running daemon
    with a 60000x16 PNG)."""
    import openai
    rng = np.random.default_rng(33)
    strip = rng.integers(0, 256, (16, 2200, 3), dtype=np.uint8)
    good = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    urls = [data_url(good), data_url(good)]
    urls[at] = data_url(strip)
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.chat.completions.create(model="default", messages=ask(parts), max_tokens=4)
    error = body(caught)
    assert error["param"] == f"messages.0.content.{at + 1}.image_url.url", error  # part 0 is the text
    assert "image tokens, more than the bundle's budget" in error["message"]
    assert error["message"].startswith(f"messages.0.content.{at + 1}.image_url.url: 2200x16 makes ")
