"""OpenAI-compatible `/v1/chat/completions` and `/v1/models`, as vLLM and llama.cpp's server accept them.

Messages carry text and `image_url` parts (data URLs; http(s) only when enabled; several in order with a
GGUF + mmproj bundle, bounded before any is decoded). The conversation is
laid into the bundle's prompt template with the image embeddings at its image slot. `response_format`
json_schema/json_object constrain the output with the same strict grammar as inspections.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import random
import time
import urllib.parse
from collections.abc import Callable, Generator
from typing import Any

from flask import Blueprint, Response, jsonify, request

from edge_runtime.api.admission import Ticket, image_size
from edge_runtime.api.auth import require_access
from edge_runtime.api.errors import ApiError, invalid
from edge_runtime.api.models import (
    CHARS_PER_TOKEN,
    MAX_TEXT_CHARS,
    AnyObject,
    ChatRequest,
    ContentPart,
    Message,
    ModelList,
)
from edge_runtime.api.openapi import doc
from edge_runtime.api.rails.engine import Rails
from edge_runtime.api.rails.http import chat_request, checked_chat, rewrite_messages, schema_name
from edge_runtime.api.rails.live import live_rails
from edge_runtime.api.rails.request import RailRefused, refusal_response, request_id
from edge_runtime.api.rest import (
    Closing,
    admission,
    daemon,
    decode_base64,
    decode_upload,
    json_body,
    submit,
    validate,
    wait_result,
)
from edge_runtime.core.device import ChatJob, ChatOutput
from edge_runtime.core.errors import EdgeRuntimeError, InputError

bp = Blueprint("openai", __name__)
bp.app_errorhandler(RailRefused)(refusal_response)  # app-wide: REST infer raises it too
MIN_TEMPERATURE = 1e-3

log = logging.getLogger(__name__)


@bp.get("/v1/models")
@doc("OpenAI-compatible model list", response=ModelList)
def models() -> Any:
    d = daemon()
    data = []
    info = d.status.model_info()
    if info is not None:
        data.append({"id": info.name, "object": "model", "created": int(d.status.started), "owned_by": "edge-runtime",
                     "root": info.model_name, "max_model_len": info.context_size})
    return jsonify(object="list", data=data)


def _grammar(fmt: dict[str, Any] | None) -> str | None:
    """The response_format as a grammar for the constraint engine (its budget is checked first)."""
    if not fmt or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_object":
        return daemon().inference.constraint({"type": "object"})
    if fmt["type"] == "json_schema":
        spec = fmt.get("json_schema") or {}
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise invalid("response_format.json_schema.schema", "must be an object")
        try:
            return daemon().inference.constraint(schema)
        except InputError:
            raise  # over the complexity budget, or beyond the constraint engine: a 4xx naming the field
        except EdgeRuntimeError:  # the model is being swapped: no engine to check the schema against
            raise ApiError(503, "not_ready", "the model is not loaded yet", headers={"Retry-After": "5"}) from None
        except Exception as exc:  # noqa: BLE001 - the converter raises bare exceptions for odd schemas
            raise invalid("response_format.json_schema.schema", f"unsupported JSON schema: {exc}") from None
    raise invalid("response_format.type", f"unsupported response_format type {fmt['type']!r}")


def _image_bytes(url: str, field: str) -> bytes:
    if url.startswith("data:"):
        header = url[:url.find(",")] if "," in url else url[:64]
        if ";base64" not in header:
            raise invalid(field, "image data URLs must be base64 encoded")
        return decode_base64(url, field)
    if url.startswith(("http://", "https://")):
        if not daemon().status.config.api.allow_remote_image_urls:
            raise invalid(field, "remote image URLs are disabled on this device; send a data: URL "
                          "(or enable api.allow_remote_image_urls)")
        from edge_runtime.core.http import request  # one deadline over every phase: a dripping server cannot hold us

        api = daemon().status.config.api
        limit = int(api.max_request_mb * 1024 * 1024)
        try:
            parts = urllib.parse.urlsplit(url)
        except ValueError:
            raise invalid(field, "not a valid URL") from None
        if parts.username is not None or parts.password is not None:
            raise invalid(field, "image URLs with a user name or password are not fetched")
        try:
            data = request("GET", url, timeout_s=10, limit=limit, follow_redirects=True,
                           local_ok=api.allow_local_image_urls).body
        except (OSError, ValueError) as exc:
            # The upstream's status, refusal or timeout stays in the log: echoed, it would make the
            # endpoint a port scanner of whatever network the device sits on.
            log.info("openai: %s: fetching %s failed: %s", field, url[:200], exc)
            if str(exc).startswith("destination not allowed"):
                raise invalid(field, f"{exc} (api.allow_local_image_urls)") from None
            raise invalid(field, "the image could not be fetched") from None
        if len(data) > limit:
            raise ApiError(413, "image_too_large", f"{field}: the remote image is larger than the request limit",
                           field=field)
        return data
    raise invalid(field, "image_url must be a data: URL or an http(s) URL")


def _check_parts(messages: list[Message]) -> None:
    """A part without the object its type names is refused: dropping it would answer as if the model had
    seen an image (or text) it never got."""
    for i, m in enumerate(messages):
        for j, part in enumerate(m.content if isinstance(m.content, list) else []):
            if part.type == "image_url" and part.image_url is None:
                raise invalid(f"messages.{i}.content.{j}.image_url", "required in an image_url part "
                              "(an object with a url)")
            if part.type == "text" and part.text is None:
                raise invalid(f"messages.{i}.content.{j}.text", "required in a text part (a string)")


def _check_text(messages: list[Message], context: int) -> None:
    """Refuse text that cannot fit the context before anything is tokenized (a cheap character bound;
    the model layer makes the exact token check)."""
    total = 0
    for m in messages:
        parts = [m.content] if isinstance(m.content, str) else [p.text or "" for p in (m.content or [])]
        total += sum(len(p) for p in parts)
    limit = min(MAX_TEXT_CHARS, context * CHARS_PER_TOKEN)
    if total > limit:
        raise invalid("messages", f"the text has {total} characters; this model's context of {context} tokens "
                      f"takes at most about {limit}")


def _image_fields(messages: list[Message]) -> list[tuple[ContentPart, str]]:
    """Every image_url part with its field, in order."""
    return [(part, f"messages.{i}.content.{j}.image_url.url")
            for i, m in enumerate(messages) if not isinstance(m.content, str)
            for j, part in enumerate(m.content or []) if part.type == "image_url" and part.image_url is not None]


def _check_image_count(messages: list[Message], several: bool, limit: int) -> None:
    """Refuse too many images, or several where the model takes one, before any is fetched or decoded."""
    fields = [f for _, f in _image_fields(messages)]
    if len(fields) > limit:
        raise invalid(fields[limit], f"the request has {len(fields)} images; at most {limit} are taken "
                      "(api.max_images_per_request)")
    if len(fields) > 1 and not several:
        raise invalid(fields[1], "this model takes one image per request (an ONNX-encoder bundle; several "
                      "images need a GGUF + mmproj bundle, docs/models.md)")


def _conversation(messages: list[Message], rails: Rails, rid: str, max_pixels: int
                  ) -> tuple[str | None, str, list[tuple[bytes, str]], tuple[int, ...]]:
    """(system text, conversation text for the prompt slot, each image's bytes and field, in order, and
    where each image goes in that text). The images' pixels, read from their headers, are bounded
    together by `max_pixels`."""
    system: list[str] = []
    turns: list[str] = []
    images: list[tuple[bytes, str]] = []
    at: list[int | None] = []  # each image's offset in the conversation text (None: in a system message)
    pixels = 0
    for i, m in enumerate(messages):
        parts = [ContentPart(type="text", text=m.content)] if isinstance(m.content, str) else (m.content or [])
        text = []
        head = "Assistant: " if m.role == "assistant" else "" if len(messages) <= 2 else "User: "
        start = sum(len(t) + 1 for t in turns) + len(head)  # where this turn's text begins in the conversation
        for j, part in enumerate(parts):
            if part.type == "text" and part.text:
                text.append(part.text)
            elif part.type == "image_url" and part.image_url is not None:
                field = f"messages.{i}.content.{j}.image_url.url"
                data = _image_bytes(part.image_url.url, field)
                size = image_size(data)
                rails.check_image(size, field, rid)  # from the header: nothing decoded yet
                pixels += size[0] * size[1] if size is not None else 0
                if pixels > max_pixels:
                    raise ApiError(413, "image_too_large", f"{field}: the request's images declare {pixels} "
                                   f"pixels together, more than api.max_request_pixels ({max_pixels})", field=field)
                images.append((data, field))
                at.append(None if m.role in ("system", "developer") else start + len("\n".join(text)))
        joined = "\n".join(text)
        if m.role in ("system", "developer"):
            system.append(joined)
        elif m.role == "assistant":
            turns.append(f"Assistant: {joined}")
        else:
            turns.append(joined if len(messages) <= 2 else f"User: {joined}")
    return ("\n".join(system) or None), "\n".join(turns), images, image_offsets(at)


def image_offsets(at: list[int | None]) -> tuple[int, ...]:
    """Where several images go in the conversation text: each where its part was among the text parts
    (as llama.cpp's server places a media marker), when text comes before one of them; empty (all at
    the template's image slot, in order) for one image, images that all come before the text, or an
    image in a system message (its place is not in the conversation)."""
    if len(at) < 2 or any(a is None for a in at) or not any(at):
        return ()
    return tuple(a for a in at if a is not None)


@bp.post("/v1/chat/completions")
@doc("OpenAI-compatible chat completions with image_url parts", body={"application/json": ChatRequest},
     response=AnyObject, errors=(400, 401, 403, 404, 413, 422, 429, 504), secured=True, body_required=True)
@require_access
def chat_completions() -> Any:
    ticket = admission().enter()  # before the body is parsed or any image decoded
    try:
        response = _chat(ticket)
    except BaseException:
        ticket.release()
        raise
    if not response.is_streamed:
        ticket.release()
    return response


def _chat(ticket: Ticket) -> Any:
    req: ChatRequest = validate(ChatRequest, json_body(force=True))
    _check_parts(req.messages)
    d = daemon()
    info = d.status.model_info()
    if info is None:
        raise ApiError(503, "not_ready", "the model is not loaded yet", headers={"Retry-After": "5"})
    if req.model and req.model not in (info.name, info.model_name, "default"):
        raise ApiError(404, "model_not_found", f"model {req.model[:128]!r} is not served here; see /v1/models",
                       field="model")
    context = info.context_size
    # The answer's length as the client set it, and the field it used (None: neither, the model's default).
    sent = "max_completion_tokens" if req.max_completion_tokens else "max_tokens" if req.max_tokens else None
    asked = req.max_completion_tokens or req.max_tokens
    if sent is not None and asked is not None and asked >= context:
        raise invalid(sent, f"{asked} is not less than this model's context of {context} tokens "
                      "(prompt and answer share it)")
    _check_text(req.messages, context)
    fmt = req.response_format.model_dump(by_alias=True, exclude_none=True) if req.response_format else None
    rid = request_id(request.headers.get("X-Request-Id"), "chatcmpl")
    rails = live_rails(d.status.config.rails)
    rewrites = rails.check_input(chat_request(req.messages, rid, req.model or info.name, schema_name(fmt)))
    rewrite_messages(req.messages, rewrites.texts)
    api = d.status.config.api
    _check_image_count(req.messages, info.several_images, api.max_images_per_request)
    system, prompt, image_bytes, image_at = _conversation(req.messages, rails, rid, api.max_request_pixels)
    system = "\n".join([s for s in (system, *rewrites.system) if s]) or None
    frames = [decode_upload(data, ticket, field) for data, field in image_bytes]
    grammar = _grammar(fmt)
    max_tokens = asked or info.max_tokens
    stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    seed = req.seed if req.seed is not None and req.seed >= 0 else random.randrange(2**32)
    # Below MIN_TEMPERATURE sampling is greedy in all but name, and a denormal one (2e-313, found by
    # fuzzing) overflows the sampler's division into NaN probabilities: take it as greedy.
    temperature = req.temperature if req.temperature >= MIN_TEMPERATURE else 0.0
    deltas: queue.Queue[str | None] = queue.Queue()
    live = req.stream and not rails.output  # output rails hold a stream until the whole answer passed them
    job = ChatJob(prompt, system, frames[0] if frames else None, grammar, max_tokens, temperature, req.top_p, seed,
                  stops, on_text=deltas.put if live else None, on_end=lambda: deltas.put(None),
                  more_images=frames[1:], image_at=image_at, image_fields=tuple(f for _, f in image_bytes),
                  max_tokens_field=sent)
    future = submit(d.inference.chat, job)
    created = int(time.time())
    if live:
        stream = _stream(future, deltas, rid, created, info.name, d.status.config.api.request_timeout_s)
        return Response(Closing(stream, ticket.release), mimetype="text/event-stream",
                        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no", "X-Request-Id": rid})
    gen: ChatOutput = wait_result(future)
    text, usage, finish = checked_chat(rails, gen, _regenerate(job), rid)
    if req.stream:
        held = _held_stream(text, finish, usage, rid, created, info.name)
        return Response(Closing(held, ticket.release), mimetype="text/event-stream",
                        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no", "X-Request-Id": rid})
    response = jsonify({
        "id": rid, "object": "chat.completion", "created": created, "model": info.name,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": finish, "logprobs": None}],
        "usage": usage,
    })
    response.headers["X-Request-Id"] = rid
    return response


def _regenerate(job: ChatJob) -> Callable[[str], ChatOutput]:
    """One more generation of the same job with a reask rail's instruction added to its system text."""

    def again(instruction: str) -> ChatOutput:
        system = "\n".join(s for s in (job.system, instruction) if s)
        out: ChatOutput = wait_result(submit(daemon().inference.chat, dataclasses.replace(
            job, system=system, on_text=None, on_end=None)))
        return out

    return again


def _held_stream(text: str, finish: str, usage: dict[str, int], cid: str, created: int, model: str
                 ) -> Generator[str, None, None]:
    """A checked answer as OpenAI chunk events: role, the text, the finish with usage, [DONE]."""
    yield _chunk(cid, created, model, {"role": "assistant", "content": ""})
    if text:
        yield _chunk(cid, created, model, {"content": text})
    yield _chunk(cid, created, model, {}, finish, usage=usage)
    yield "data: [DONE]\n\n"


def _chunk(cid: str, created: int, model: str, delta: dict[str, Any], finish: str | None = None,
           **extra: Any) -> str:
    body = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}
    return f"data: {json.dumps(body)}\n\n"


def _stream(future: Any, deltas: queue.Queue[str | None], cid: str, created: int, model: str,
            timeout: float) -> Generator[str, None, None]:
    """OpenAI chunk events; runs after the view returned, so it gets what it needs as arguments."""

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        return _chunk(cid, created, model, delta, finish, **extra)

    yield chunk({"role": "assistant", "content": ""})
    deadline = time.monotonic() + timeout
    while True:
        try:
            piece = deltas.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            yield f"data: {json.dumps({'error': {'message': 'timed out', 'type': 'timeout'}})}\n\n"
            return
        if piece is None:
            break
        yield chunk({"content": piece})
    try:
        gen: ChatOutput = future.result(timeout=5)
    except Exception as exc:  # noqa: BLE001 - the stream already started: report inside it
        yield f"data: {json.dumps({'error': {'message': str(exc), 'type': 'inference_failed'}})}\n\n"
        return
    yield chunk({}, gen.finish_reason, usage={"prompt_tokens": gen.prompt_tokens, "completion_tokens": gen.tokens,
                                             "total_tokens": gen.prompt_tokens + gen.tokens})
    yield "data: [DONE]\n\n"

