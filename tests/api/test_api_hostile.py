"""Hostile and malformed requests: every client error is a fast 4xx JSON error naming its field."""

from __future__ import annotations

import base64
import io
import json
import re
import struct
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from flask.testing import FlaskClient

from edge_runtime.app.daemon import Daemon
from edge_runtime.core.errors import InputError, NoRoomToAnswer, QuestionRefused, naming_answer, naming_prompt
from edge_runtime.core.samples import part_image
from tests.api.test_api import running_daemon
from tests.support.hostile import heic, heic_declaring, jpeg_segment_flood, png_chunk_flood
from tests.support.images import encode, png_bomb

JPEG = encode(part_image(3, defect=True), ".jpg")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    for d in running_daemon(tmp_path_factory.mktemp("hostile"), demo_dir, results=1):
        d.config.images.max_pixels = 20_000_000  # so the 49-MP PNG below is refused by size
        yield d


def error_of(response: object, status: int) -> dict[str, object]:
    assert response.status_code == status, (response.status_code, response.get_data(as_text=True)[:300])  # type: ignore[attr-defined]
    assert response.mimetype == "application/json"  # type: ignore[attr-defined]
    error: dict[str, object] = response.json["error"]  # type: ignore[attr-defined]
    return error


def chat(text: str = "Describe the part.", **extra: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 8, **extra}


# ---- 4xx naming the field (issue 14 items 9 and 10) ---------------------------------------------

def test_results_cursor_beyond_int64_is_400_naming_before(client: FlaskClient) -> None:
    error = error_of(client.get("/api/v1/results?before=12345678901234567890"), 400)
    assert error["field"] == "before"


@pytest.mark.parametrize("path", ["/api/v1/infer", "/v1/chat/completions", "/api/v1/cameras/belt/trigger"])
def test_deeply_nested_json_is_400_not_a_crash(client: FlaskClient, path: str) -> None:
    nested_40 = json.dumps({"image": json.loads("[" * 40 + '"x"' + "]" * 40)})
    for body in ("[" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000, nested_40):
        error = error_of(client.post(path, data=body, content_type="application/json"), 400)
        assert error["field"] == "body" and "nested" in str(error["message"])


def test_chat_seed_minus_one_means_a_random_seed(client: FlaskClient) -> None:
    reply = client.post("/v1/chat/completions", json=chat(seed=-1, temperature=0.7))
    assert reply.status_code == 200, reply.json
    error = error_of(client.post("/v1/chat/completions", json=chat(seed=-2)), 400)
    assert error["field"] == "seed"


def test_chat_takes_json_sent_as_a_form_like_curl_d_does(client: FlaskClient) -> None:
    reply = client.post("/v1/chat/completions", data=json.dumps(chat()),
                        content_type="application/x-www-form-urlencoded")
    assert reply.status_code == 200, reply.json


def test_chat_denormal_temperature_is_greedy_not_a_crash(client: FlaskClient) -> None:
    # Found by schemathesis: 2.2250738585e-313 made the sampler's probabilities NaN (500).
    reply = client.post("/v1/chat/completions", json=chat(temperature=2.2250738585e-313))
    assert reply.status_code == 200, reply.json


def test_chat_max_tokens_beyond_the_context_is_400_saying_so(client: FlaskClient, daemon: Daemon) -> None:
    error = error_of(client.post("/v1/chat/completions", json=chat(max_tokens=8192)), 400)
    assert error["field"] == "max_tokens" and f"context of {daemon.config.model.context_size}" in str(error["message"])


def test_chat_text_far_longer_than_the_context_is_refused_before_tokenizing(client: FlaskClient) -> None:
    started = time.perf_counter()
    error = error_of(client.post("/v1/chat/completions", json=chat("bolt " * 4_000)), 400)  # 20000 > 2048 * 8
    assert error["field"] == "messages" and time.perf_counter() - started < 1.0
    error = error_of(client.post("/v1/chat/completions", json=chat("bolt " * 200_000)), 400)
    assert error["field"] == "messages.0.content"


TOOL = {"type": "function", "function": {"name": "reject_part", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(("field", "value"), [
    ("tools", [TOOL]), ("tool_choice", "required"), ("tool_choice", {"type": "function",
                                                                      "function": {"name": "reject_part"}}),
    ("functions", [TOOL["function"]]), ("function_call", {"name": "reject_part"}),
    ("logit_bias", {"15": 100}), ("logprobs", True), ("top_logprobs", 5)])
def test_chat_features_this_server_lacks_are_400_naming_the_field_not_ignored(
        client: FlaskClient, field: str, value: object) -> None:
    # They were taken and ignored (extra="allow"): a client that forced a tool call or banned a token got
    # plain text, with nothing to say its request was not honoured.
    error = error_of(client.post("/v1/chat/completions", json={**chat(), field: value}), 400)
    assert error["field"] == field and "not supported" in str(error["message"])
    assert "Value error" not in str(error["message"])  # the validator's words, not pydantic's wrapping


def test_chat_defaults_of_those_features_pass(client: FlaskClient) -> None:
    # What SDKs send by default asks for nothing: it must keep working.
    body = chat(tools=[], tool_choice="none", logit_bias={}, logprobs=False, top_logprobs=0, functions=None,
                function_call="auto", presence_penalty=0, frequency_penalty=0, n=1, user="line-7")
    assert client.post("/v1/chat/completions", json=body).status_code == 200


@pytest.mark.parametrize(("field", "value"), [
    ("stream", "yes"), ("stream", "true"), ("stream", 1), ("stream", 0),
    ("max_tokens", True), ("max_tokens", "8"), ("max_tokens", 8.0), ("max_completion_tokens", True),
    ("seed", True), ("seed", "3"), ("n", True), ("n", 1.0),
    ("temperature", True), ("temperature", "0.5"), ("top_p", False), ("top_p", "1"),
    ("response_format", {"type": "json_schema", "json_schema": {"schema": {"type": "object"}, "strict": "yes"}})])
def test_chat_booleans_and_numbers_must_be_json_booleans_and_numbers(
        client: FlaskClient, field: str, value: object) -> None:
    # pydantic's lax mode took "stream": "yes" as true and "max_tokens": true as 1: a client's bug
    # became a different request (a stream it cannot read, one token) instead of a 400 naming the field.
    error = error_of(client.post("/v1/chat/completions", json={**chat(), field: value}), 400)
    expected = "response_format.json_schema.strict" if field == "response_format" else field
    assert error["field"] == expected, error


def test_chat_json_numbers_and_booleans_still_pass(client: FlaskClient) -> None:
    body = chat(stream=False, max_completion_tokens=8, seed=3, n=1, temperature=1, top_p=1,
                response_format={"type": "json_schema", "json_schema": {"schema": {"type": "object"}, "strict": True}})
    reply = client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.json


@pytest.mark.parametrize("value", [True, 5, ["x"]])
def test_infer_prompt_must_be_a_json_string(client: FlaskClient, value: object) -> None:
    body = {"image": base64.b64encode(JPEG).decode(), "prompt": value}
    assert error_of(client.post("/api/v1/infer", json=body), 400)["field"] == "prompt"
    assert error_of(client.post("/api/v1/infer", json={"image": value}), 400)["field"] == "image"


def test_chat_message_count_is_bounded(client: FlaskClient) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}] * 65}
    assert error_of(client.post("/v1/chat/completions", json=body), 400)["field"] == "messages"


def test_input_error_from_the_model_layer_is_400_naming_its_field(client: FlaskClient, daemon: Daemon,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # The model layer refuses a prompt longer than its context with InputError inside the future.
    refused: Future[object] = Future()
    refused.set_exception(InputError("the prompt has 3000 tokens; the context holds 2048", field="prompt"))
    monkeypatch.setattr(daemon.entry, "submit_image", lambda *a, **k: refused)
    error = error_of(client.post("/api/v1/infer", json={"image": base64.b64encode(JPEG).decode(),
                                                        "prompt": "x"}), 400)
    assert error["field"] == "prompt" and "context holds 2048" in str(error["message"])


def test_trigger_prompt_must_be_a_string_and_is_never_journaled(client: FlaskClient, daemon: Daemon) -> None:
    before = daemon.journal.counts()["total"]
    error = error_of(client.post("/api/v1/cameras/belt/trigger", json={"prompt": 123}), 400)
    assert error["field"] == "prompt"
    rows = daemon.journal.query(limit=50)
    assert all(isinstance(r["prompt"], str) for r in rows) and daemon.journal.counts()["total"] >= before


@pytest.mark.parametrize("path", ["/api/v1/cameras/belt/trigger", "/api/v1/infer"])
def test_a_20000_character_prompt_is_400(client: FlaskClient, path: str) -> None:
    body = {"prompt": "x" * 20_000, "image": base64.b64encode(JPEG).decode()}
    if "trigger" in path:
        body.pop("image")
    assert error_of(client.post(path, json=body), 400)["field"] == "prompt"


@pytest.mark.parametrize("path", ["/api/v1/cameras/belt/trigger", "/api/v1/infer"])
def test_a_prompt_under_the_character_bound_but_over_the_context_is_400_naming_prompt(
        client: FlaskClient, daemon: Daemon, path: str) -> None:
    """The model layer names `messages` (the chat field) for any prompt over the context: a REST client
    was told its `messages` were too long on routes whose field is `prompt`."""
    body = {"prompt": "word " * 790, "image": base64.b64encode(JPEG).decode()}  # 3,950 characters
    if "trigger" in path:
        body.pop("image")
    error = error_of(client.post(path, json=body), 400)
    assert error["field"] == "prompt", error
    assert str(error["message"]).startswith("prompt: the prompt is ")
    assert f"the context holds {daemon.config.model.context_size}" in str(error["message"])


@pytest.mark.parametrize("path", ["/api/v1/cameras/belt/trigger", "/api/v1/infer"])
def test_a_prompt_that_fits_the_context_but_leaves_no_room_for_the_answer_is_400_naming_prompt(
        client: FlaskClient, daemon: Daemon, path: str) -> None:
    """A prompt under the context but within max_tokens of it was a 400 naming `max_tokens` ("prompt (1924
    tokens) + max_tokens (160) exceeds the context size 2048"), a field these routes do not have. The demo
    bundle's boundary: about 610 words left too little room, about 655 filled the context."""
    n_ctx = daemon.config.model.context_size
    messages = []
    for words in range(540, 670, 10):  # through the gap between "room for the answer" and "over the context"
        body = {"prompt": "word " * words, "image": base64.b64encode(JPEG).decode()}
        if "trigger" in path:
            body.pop("image")
        reply = client.post(path, json=body)
        if reply.status_code == 200:
            continue
        error = error_of(reply, 400)
        assert error["field"] == "prompt", (words, error)
        messages.append(str(error["message"]))
    no_room = [m for m in messages if "leave no room" in m]
    assert no_room, messages  # the gap was crossed, not only the context
    assert re.fullmatch(rf"prompt: \d+ tokens leave no room for the \d+-token answer in the {n_ctx}-token context",
                        no_room[0]), no_room[0]
    assert any("the context holds" in m for m in messages), messages  # and past it, still `prompt`


def test_a_frame_refusal_named_prompt_stays_a_question_refused() -> None:
    """A batch's frame reports its refusal as a QuestionRefused (an InferenceError too): renaming its field
    must not turn it back into a plain InputError."""
    for cause in (NoRoomToAnswer(1924, 160, 2048), InputError("messages: the prompt is 2100 tokens", "messages")):
        named = naming_prompt(QuestionRefused(str(cause), cause.field, cause.status, cause))
        assert isinstance(named, QuestionRefused) and named.field == "prompt", named
    assert str(naming_prompt(NoRoomToAnswer(1924, 160, 2048))) == (
        "prompt: 1924 tokens leave no room for the 160-token answer in the 2048-token context")


def test_a_chat_that_leaves_no_room_for_its_max_tokens_is_still_400_naming_max_tokens(
        client: FlaskClient, daemon: Daemon) -> None:
    """The chat endpoint's client sets max_tokens: there the field stays the one to change."""
    error = error_of(client.post("/v1/chat/completions", json=chat("word " * 560, max_tokens=1500)), 400)
    assert error["field"] == "max_tokens", error
    assert f"exceeds the context size {daemon.config.model.context_size}" in str(error["message"])


def no_room_for_the_default_answer(client: FlaskClient, **extra: object) -> dict[str, object]:
    """The 400 of a chat without max_tokens whose messages fit the context but leave less than the model's
    default answer length: from over the context down, until the refusal is no longer the context's."""
    for words in range(720, 400, -10):
        body = {"messages": [{"role": "user", "content": "word " * words}], **extra}
        error = error_of(client.post("/v1/chat/completions", json=body), 400)
        if "the context holds" not in str(error["message"]):
            return error
    raise AssertionError("no chat between 400 and 720 words left too little room for the default answer")


def test_a_chat_without_max_tokens_that_leaves_no_room_for_the_default_answer_is_400_naming_messages(
        client: FlaskClient, daemon: Daemon) -> None:
    """The route fills in the model's default max_tokens when the client sends neither max_tokens nor
    max_completion_tokens: a 400 naming `max_tokens` told the client to change a field it never sent.
    It names `messages` and says the prompt's tokens, the default answer length and the context, as
    OpenAI's "maximum context length" error does (seen failing before: field 'max_tokens')."""
    info = daemon.model_info()
    assert info is not None
    n_ctx, default = info.context_size, info.max_tokens
    error = no_room_for_the_default_answer(client)
    assert error["field"] == "messages" and error["param"] == "messages", error
    found = re.fullmatch(rf"messages: this model's maximum context length is {n_ctx} tokens; the messages take "
                         rf"(\d+) tokens and the default answer length is {default} tokens \((\d+) in all\); "
                         rf"shorten the messages, or send max_tokens of at most (\d+)", str(error["message"]))
    assert found, error["message"]
    prompt_tokens, total, room = map(int, found.groups())
    assert total == prompt_tokens + default > n_ctx and room == n_ctx - prompt_tokens >= 1


def test_a_chat_that_leaves_no_room_for_its_max_completion_tokens_is_400_naming_max_completion_tokens(
        client: FlaskClient, daemon: Daemon) -> None:
    """A client that sent max_completion_tokens (OpenAI's newer name) was told about `max_tokens` (seen
    failing before: field 'max_tokens'); the refusal names the field it sent."""
    body = {"messages": [{"role": "user", "content": "word " * 560}], "max_completion_tokens": 1500}
    error = error_of(client.post("/v1/chat/completions", json=body), 400)
    assert error["field"] == "max_completion_tokens", error
    assert re.fullmatch(rf"max_completion_tokens: prompt \(\d+ tokens\) \+ max_completion_tokens \(1500\) exceeds "
                        rf"the context size {daemon.config.model.context_size}; at most \d+ fit",
                        str(error["message"])), error["message"]


def test_a_chat_refusal_for_the_answers_room_is_named_by_what_its_client_sent() -> None:
    """naming_answer: the client's own field, `messages` when it sent none (no max_tokens to suggest when the
    messages fill the context), a batch's QuestionRefused stays one, other refusals are left alone."""
    cause = NoRoomToAnswer(1950, 160, 2048)
    assert naming_answer(cause, "max_tokens") is cause
    assert naming_answer(cause, "max_completion_tokens").field == "max_completion_tokens"
    named = naming_answer(QuestionRefused(str(cause), cause.field, cause.status, cause), None)
    assert isinstance(named, QuestionRefused) and named.field == "messages", named
    assert str(naming_answer(NoRoomToAnswer(2048, 160, 2048), None)).endswith(
        "(2208 in all); shorten the messages")
    other = InputError("messages: the prompt is 2100 tokens, the context holds 2048", "messages")
    assert naming_answer(other, None) is other


def test_a_body_of_millions_of_tiny_json_values_is_a_400_naming_body_before_they_are_built(
        client: FlaskClient) -> None:
    """8 MB of `{}` in a knob the chat endpoint lets through (vLLM clients send many) took 4.6 s and kept
    100 MB: each value was built and walked twice in Python before anything looked at the request."""
    body = json.dumps({**chat(), "metadata": [{}] * 600_000}, separators=(",", ":"))  # 1.8 of its 2 MB
    started = time.monotonic()
    error = error_of(client.post("/v1/chat/completions", data=body, content_type="application/json"), 400)
    assert error["field"] == "body" and "more than 400000 commas, arrays and objects" in str(error["message"])
    assert time.monotonic() - started < 1.0  # counted in C: ~10 ms
    many_parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": ""}] * 512}] * 64,
                  "max_tokens": 1}
    assert client.post("/v1/chat/completions", json=many_parts).status_code == 200  # the largest valid shape


@pytest.mark.parametrize("flood", ["png", "jpeg"])
def test_a_small_image_in_a_flood_of_empty_chunks_is_refused_in_milliseconds(client: FlaskClient, flood: str) -> None:
    """1.4 MB of empty PNG chunks or JPEG segments around a 64x64 image (under this daemon's 2 MB body):
    Pillow read each in Python, twice, the header's reading too (11 MB of PNG chunks took 14 s)."""
    data = png_chunk_flood(1.4) if flood == "png" else jpeg_segment_flood(1.4)
    url = f"data:image/{flood};base64," + base64.b64encode(data).decode()
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
            "max_tokens": 1}
    started = time.monotonic()
    error = error_of(client.post("/v1/chat/completions", json=body), 400)
    assert error["field"] == "messages.0.content.0.image_url.url"
    assert ("chunks" if flood == "png" else "marker segments") in str(error["message"])
    assert time.monotonic() - started < 0.5


def test_unknown_fields_are_named(client: FlaskClient) -> None:
    error = error_of(client.post("/api/v1/cameras/belt/trigger", json={"promt": "typo"}), 400)
    assert error["field"] == "promt"


def test_method_not_allowed_carries_allow(client: FlaskClient) -> None:
    response = client.delete("/api/v1/infer")
    error_of(response, 405)
    assert response.headers["Allow"] == "OPTIONS, POST"


def test_non_finite_numbers_are_not_json(client: FlaskClient) -> None:
    body = '{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'
    assert error_of(client.post("/v1/chat/completions", data=body, content_type="application/json"), 400)[
        "field"] == "body"


def test_response_format_shape_is_validated(client: FlaskClient) -> None:
    error = error_of(client.post("/v1/chat/completions", json=chat(response_format={"type": "json_schema"})), 400)
    assert error["field"] == "response_format"
    error = error_of(client.post("/v1/chat/completions", json=chat(response_format={"type": "xml"})), 400)
    assert error["field"] == "response_format.type"


def test_base64_size_is_checked_before_decoding(client: FlaskClient, daemon: Daemon) -> None:
    limit = int(daemon.config.api.max_request_mb * 1024 * 1024)
    daemon.config.api.max_request_mb, old = 0.5, daemon.config.api.max_request_mb
    try:  # the body passes the request limit; the image inside it does not pass the image limit
        body = {"image": "A" * (limit // 2)}
        error = error_of(client.post("/api/v1/infer", json=body), 413)
        assert error["field"] == "image"
    finally:
        daemon.config.api.max_request_mb = old


# ---- hostile uploads on every image path (issue 14 item 6) -----------------------------------------

def _png(width: int, height: int, rows: bytes | None = None, depth: int = 8, color: int = 2) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    channels = {0: 1, 2: 3, 6: 4}[color]
    comp = zlib.compressobj(9)
    row = b"\0" + b"\0" * (width * channels * depth // 8)
    idat = b"".join(comp.compress(row) for _ in range(height)) + comp.flush() if rows is None else rows
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _cmyk_jpeg() -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.new("CMYK", (64, 48), (10, 200, 30, 0)).save(buf, "JPEG")
    return buf.getvalue()


def _animated_gif() -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    frames = [Image.new("RGB", (64, 48), (i * 40, 0, 0)) for i in range(3)]
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    return buf.getvalue()


# name -> (bytes, acceptable statuses). Valid but unusual images may be inspected (200); nothing 5xx.
CORPUS: dict[str, tuple[bytes, set[int]]] = {
    "zero-byte": (b"", {400}),
    "truncated-jpeg": (JPEG[: len(JPEG) // 2], {400}),
    "wrong-magic": (b"\x89PNG\r\n\x1a\n" + JPEG[2:], {400}),
    "png-49-megapixel-bomb": (_png(7000, 7000, depth=8, color=0), {413}),
    "png-30000x30000-header": (png_bomb(30000, 30000), {413}),
    "png-16-bit": (encode(np.full((48, 64, 3), 30000, np.uint16), ".png"), {200, 400}),
    "cmyk-jpeg": (_cmyk_jpeg(), {200, 400}),
    "animated-gif": (_animated_gif(), {400}),
    "svg": (b'<svg xmlns="http://www.w3.org/2000/svg" width="64" height="48"><script>alert(1)</script></svg>', {400}),
    # A complete JPEG with bytes after its end marker is a valid image (cameras append metadata there):
    # its pixels are inspected, the trailing bytes are never interpreted. A truncated scan is refused.
    "jpeg-zip-polyglot": (JPEG + b"PK\x03\x04" + b"\0" * 200, {200}),
    "html-in-png-comment": (_png(32, 32)[:-12] + b"<html><script>x</script></html>" + _png(32, 32)[-12:], {200, 400}),
    "garbage-after-jpeg-header": (JPEG[:200] + bytes(range(256)) * 20, {400}),
    # HEIC phone photos: inspected like a JPEG, within the same pixel budget, one image at a time
    "heic-phone-photo": (heic(part_image(3, defect=True)), {200}),
    "heic-60000x60000-header": (heic_declaring(60000, 60000), {413}),
    "heic-burst": (heic(part_image(3), part_image(4)), {400}),
    "heic-truncated": (heic(part_image(3))[:3000], {400}),
}


def _post(client: FlaskClient, path: str, data: bytes) -> object:
    if path == "multipart":
        return client.post("/api/v1/infer", data={"image": (io.BytesIO(data), "x.bin")})
    if path == "json":
        return client.post("/api/v1/infer", json={"image": base64.b64encode(data).decode()})
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return client.post("/v1/chat/completions", json={"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "ok?"}]}]})


@pytest.mark.parametrize("path", ["multipart", "json", "openai-data-url"])
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_hostile_upload_is_refused_fast(client: FlaskClient, path: str, name: str) -> None:
    data, statuses = CORPUS[name]
    started = time.perf_counter()
    response = _post(client, path, data)
    elapsed = time.perf_counter() - started
    assert response.status_code in statuses, (response.status_code, response.get_data(as_text=True)[:200])  # type: ignore[attr-defined]
    print(f"\nhostile {name} via {path}: {response.status_code} in {elapsed * 1000:.0f} ms")  # type: ignore[attr-defined]
    if response.status_code >= 400:  # type: ignore[attr-defined]
        assert response.json["error"]["field"].endswith(("image", "url"))  # type: ignore[attr-defined]
        assert elapsed < 2.0, elapsed
    assert client.get("/healthz").status_code == 200


def test_truncated_jpeg_with_an_end_marker_appended_is_400(client: FlaskClient) -> None:
    forged = JPEG[: len(JPEG) // 2] + b"\xff\xd9"
    response = client.post("/api/v1/infer", data={"image": (io.BytesIO(forged), "x.jpg")})
    assert response.status_code == 400


def test_cv2_is_not_asked_to_decode_what_the_header_refuses(client: FlaskClient,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = cv2.imdecode

    def counting(*a: Any) -> Any:
        calls.append(1)
        return real(*a)

    monkeypatch.setattr(cv2, "imdecode", counting)
    error_of(_post(client, "multipart", png_bomb(30000, 30000)), 413)
    assert calls == []
