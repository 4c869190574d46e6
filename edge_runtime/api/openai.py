"""OpenAI-compatible `/v1/chat/completions` and `/v1/models`, as vLLM and llama.cpp's server accept them.

Messages carry text and `image_url` parts (data URLs; http(s) only when enabled). The conversation is
laid into the bundle's prompt template with the image embeddings at its image slot. `response_format`
json_schema/json_object constrain the output with the same strict grammar as inspections.
"""

from __future__ import annotations

import base64
import binascii
import json
import queue
import time
import uuid
from collections.abc import Iterator
from typing import Any, Literal

from flask import Blueprint, Response, jsonify, request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..grammar import schema_to_grammar
from ..language import Sampling
from ..scheduler import InspectionRequest
from .auth import require_access
from .errors import ApiError
from .rest import daemon, decode_upload, submit, wait_result

bp = Blueprint("openai", __name__)


class ImageUrl(BaseModel):
    url: str
    detail: str | None = None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: ImageUrl | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # vLLM clients send many optional knobs
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=8192)
    max_completion_tokens: int | None = Field(None, ge=1, le=8192)
    temperature: float = Field(0.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = Field(1, ge=1, le=1)
    response_format: dict[str, Any] | None = None


def _model_id() -> str:
    return str(daemon().inspector.bundle.manifest.name)


@bp.get("/v1/models")
def models() -> Any:
    d = daemon()
    data = []
    if d.inspector is not None:
        data.append({"id": _model_id(), "object": "model", "created": int(d.started), "owned_by": "edge-runtime",
                     "root": d.inspector.model_name, "max_model_len": d.config.model.context_size})
    return jsonify(object="list", data=data)


def _grammar(fmt: dict[str, Any] | None) -> str | None:
    from ..errors import InputError

    if not fmt or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_object":
        return schema_to_grammar({"type": "object"})
    if fmt["type"] == "json_schema":
        spec = fmt.get("json_schema") or {}
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise ApiError(400, "invalid_request_error", "response_format.json_schema.schema must be an object")
        try:
            return schema_to_grammar(schema)
        except InputError as exc:  # over the complexity budget: the message names field and limit
            raise ApiError(exc.status, "invalid_request_error", str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - the converter raises bare exceptions for odd schemas
            raise ApiError(400, "invalid_request_error", f"unsupported JSON schema: {exc}") from None
    raise ApiError(400, "invalid_request_error", f"unsupported response_format type {fmt['type']!r}")


def _image_bytes(url: str) -> bytes:
    if url.startswith("data:"):
        header, _, payload = url.partition(",")
        if ";base64" not in header:
            raise ApiError(400, "invalid_request_error", "image data URLs must be base64 encoded")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "invalid_request_error", "the image data URL is not valid base64") from None
    if url.startswith(("http://", "https://")):
        if not daemon().config.api.allow_remote_image_urls:
            raise ApiError(400, "invalid_request_error",
                           "remote image URLs are disabled on this device; send a data: URL "
                           "(or enable api.allow_remote_image_urls)")
        import urllib.request

        limit = int(daemon().config.api.max_request_mb * 1024 * 1024)
        with urllib.request.urlopen(url, timeout=10) as resp:
            data: bytes = resp.read(limit + 1)
        if len(data) > limit:
            raise ApiError(413, "image_too_large", "the remote image is larger than the request limit")
        return data
    raise ApiError(400, "invalid_request_error", "image_url must be a data: URL or an http(s) URL")


def _conversation(messages: list[Message]) -> tuple[str | None, str, bytes | None]:
    """(system text, conversation text for the prompt slot, the image bytes if any)."""
    system: list[str] = []
    turns: list[str] = []
    image: bytes | None = None
    for m in messages:
        parts = [ContentPart(type="text", text=m.content)] if isinstance(m.content, str) else (m.content or [])
        text = []
        for part in parts:
            if part.type == "text" and part.text:
                text.append(part.text)
            elif part.type == "image_url" and part.image_url is not None:
                if image is not None:
                    raise ApiError(400, "invalid_request_error", "this model takes one image per request")
                image = _image_bytes(part.image_url.url)
        joined = "\n".join(text)
        if m.role in ("system", "developer"):
            system.append(joined)
        elif m.role == "assistant":
            turns.append(f"Assistant: {joined}")
        else:
            turns.append(joined if len(messages) <= 2 else f"User: {joined}")
    return ("\n".join(system) or None), "\n".join(turns), image


@bp.post("/v1/chat/completions")
@require_access
def chat_completions() -> Any:
    try:
        req = ChatRequest.model_validate(request.get_json(force=True, silent=False))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ApiError(400, "invalid_request_error", f"{where}: {err['msg']}") from None
    d = daemon()
    if req.model and req.model not in (_model_id(), d.inspector.model_name, "default"):
        raise ApiError(404, "model_not_found", f"model {req.model!r} is not served here; see /v1/models")
    system, prompt, image_bytes = _conversation(req.messages)
    frame = decode_upload(image_bytes) if image_bytes is not None else None
    grammar = _grammar(req.response_format)
    max_tokens = req.max_completion_tokens or req.max_tokens or d.inspector.max_tokens
    stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    sampling = Sampling(req.temperature, req.top_p, req.seed if req.seed is not None else 0)
    deltas: queue.Queue[str | None] = queue.Queue()

    def job(inspector: Any) -> Any:
        encoded = inspector.encode(frame) if frame is not None else None
        prefix, image, suffix = inspector.sequence(prompt, encoded, system or None)
        try:
            return inspector.generate(prefix, image, suffix, grammar, max_tokens, sampling,
                                      deltas.put if req.stream else None, stops)
        finally:
            deltas.put(None)

    future = submit(d.inspections.submit, InspectionRequest(None, "openai", journal=False, job=job))
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    if not req.stream:
        gen = wait_result(future)
        return jsonify({
            "id": completion_id, "object": "chat.completion", "created": created, "model": _model_id(),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": gen.text},
                         "finish_reason": gen.finish_reason, "logprobs": None}],
            "usage": {"prompt_tokens": gen.prompt_tokens, "completion_tokens": gen.tokens,
                      "total_tokens": gen.prompt_tokens + gen.tokens},
        })
    stream = _stream(future, deltas, completion_id, created, _model_id(), d.config.api.request_timeout_s)
    return Response(stream, mimetype="text/event-stream",
                    headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


def _stream(future: Any, deltas: queue.Queue[str | None], cid: str, created: int, model: str,
            timeout: float) -> Iterator[str]:
    """OpenAI chunk events; runs after the view returned, so it gets what it needs as arguments."""

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        body = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}
        return f"data: {json.dumps(body)}\n\n"

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
        gen = future.result(timeout=5)
    except Exception as exc:  # noqa: BLE001 - the stream already started: report inside it
        yield f"data: {json.dumps({'error': {'message': str(exc), 'type': 'inference_failed'}})}\n\n"
        return
    yield chunk({}, gen.finish_reason, usage={"prompt_tokens": gen.prompt_tokens, "completion_tokens": gen.tokens,
                                             "total_tokens": gen.prompt_tokens + gen.tokens})
    yield "data: [DONE]\n\n"

