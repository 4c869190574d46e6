"""REST endpoints of DESIGN.md: health, status, results, frames, infer, trigger, live events."""

from __future__ import annotations

import base64
import binascii
import json
import queue
from collections.abc import Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request

from ..errors import EdgeRuntimeError, ImageError, ImageTooLarge
from ..scheduler import QueueFull
from ..vision import decode_image
from .auth import require_access
from .errors import ApiError
from .openapi import openapi_document

bp = Blueprint("rest", __name__)
RETRY_AFTER_S = 2


def daemon() -> Any:
    return current_app.extensions["edge_runtime"]


def wait_result(future: Future[Any]) -> Any:
    timeout = daemon().config.api.request_timeout_s
    try:
        return future.result(timeout=timeout)
    except FutureTimeout:
        raise ApiError(504, "timeout", f"no verdict within {timeout:.0f} s") from None
    except EdgeRuntimeError as exc:
        raise ApiError(500, "inference_failed", str(exc)) from None


def submit(fn: Any, *args: Any, **kwargs: Any) -> Future[Any]:
    """Put work on the shared inspection queue; a full queue is 429 with Retry-After."""
    try:
        return fn(*args, **kwargs)
    except QueueFull as exc:
        raise ApiError(429, "queue_full", f"{exc}; retry shortly",
                       headers={"Retry-After": str(RETRY_AFTER_S)}) from None


def decode_upload(data: bytes) -> Any:
    limits = daemon().config.images
    try:
        return decode_image(data, limits.max_pixels, limits.min_side)
    except ImageTooLarge as exc:
        raise ApiError(413, "image_too_large", str(exc)) from None
    except ImageError as exc:
        raise ApiError(400, "invalid_image", str(exc)) from None


# ---- health and status ---------------------------------------------------------------------

@bp.get("/healthz")
def healthz() -> Any:
    return jsonify(status="ok")


@bp.get("/readyz")
def readyz() -> Any:
    d = daemon()
    ready = bool(d.inspector and d.inspector.ready and d.alive())
    response = jsonify(ready=ready, model=d.inspector.model_name if d.inspector else None)
    response.status_code = 200 if ready else 503
    return response


@bp.get("/api/v1/status")
def status() -> Any:
    return jsonify(daemon().status())


@bp.get("/api/v1/openapi.json")
def openapi() -> Any:
    return jsonify(openapi_document())


# ---- results -------------------------------------------------------------------------------

@bp.get("/api/v1/results")
def results() -> Any:
    args = request.args
    try:
        limit = int(args.get("limit", 50))
        before = int(args["before"]) if "before" in args else None
    except ValueError:
        raise ApiError(400, "bad_request", "limit and before must be integers") from None
    if not 1 <= limit <= 1000:
        raise ApiError(400, "bad_request", "limit must be between 1 and 1000")
    rows = daemon().journal.query(camera=args.get("camera"), since=args.get("since"), until=args.get("until"),
                                  limit=limit, before_seq=before)
    next_before = rows[-1]["journal_seq"] if len(rows) == limit else None
    return jsonify(results=rows, next_before=next_before)


@bp.get("/api/v1/results/<result_id>")
def result(result_id: str) -> Any:
    found = daemon().journal.get(result_id)
    if found is None:
        raise ApiError(404, "not_found", f"no result with id {result_id!r}")
    return jsonify(found)


@bp.get("/api/v1/cameras/<name>/frame.jpg")
def frame(name: str) -> Any:
    try:
        jpeg = daemon().latest_jpeg(name)
    except EdgeRuntimeError as exc:
        raise ApiError(404, "not_found", str(exc)) from None
    if jpeg is None:
        raise ApiError(404, "no_frame", f"camera {name!r} has not delivered a frame yet")
    return Response(jpeg, mimetype="image/jpeg", headers={"Cache-Control": "no-store"})


# ---- inference -------------------------------------------------------------------------------

@bp.post("/api/v1/infer")
@require_access
def infer() -> Any:
    """multipart: `image` file + optional `prompt`; or JSON {"image": base64, "prompt": ...}."""
    if request.mimetype == "multipart/form-data":
        upload = request.files.get("image")
        if upload is None:
            raise ApiError(400, "bad_request", "multipart field 'image' is missing")
        data, prompt = upload.read(), request.form.get("prompt")
    elif request.is_json:
        body = request.get_json(silent=True)
        if not isinstance(body, dict) or not isinstance(body.get("image"), str):
            raise ApiError(400, "bad_request", "JSON body needs 'image' as a base64 string")
        try:
            data = base64.b64decode(body["image"].split(",", 1)[-1], validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "bad_request", "'image' is not valid base64") from None
        prompt = body.get("prompt")
    else:
        raise ApiError(415, "unsupported_media_type", "send multipart/form-data or application/json")
    if prompt is not None and (not isinstance(prompt, str) or len(prompt) > 4000):
        raise ApiError(400, "bad_request", "'prompt' must be a string of at most 4000 characters")
    image = decode_upload(data)
    return jsonify(wait_result(submit(daemon().submit_image, image, prompt)).to_dict())


@bp.post("/api/v1/cameras/<name>/trigger")
@require_access
def trigger(name: str) -> Any:
    body = request.get_json(silent=True) if request.data else {}
    prompt = body.get("prompt") if isinstance(body, dict) else None
    d = daemon()
    if name not in d.rigs:
        raise ApiError(404, "not_found", f"no camera named {name!r}")
    try:
        future = submit(d.trigger, name, prompt)
    except EdgeRuntimeError as exc:
        raise ApiError(409, "no_frame", str(exc)) from None
    return jsonify(wait_result(future).to_dict())


# ---- live events -----------------------------------------------------------------------------

@bp.get("/api/v1/events")
def events() -> Any:
    """Server-sent events: `result` for every new verdict; a comment every 15 s keeps proxies open."""
    hub = current_app.extensions["edge_runtime_events"]
    q = hub.subscribe()

    def stream() -> Iterator[str]:
        try:
            yield "retry: 3000\n\n"
            while not hub.closed:
                try:
                    event = q.get(timeout=15)
                except queue.Empty:
                    yield ": keep-alive\n\n"
                    continue
                if event.get("type") != "shutdown":
                    yield f"event: result\ndata: {json.dumps(event)}\n\n"
        finally:
            hub.unsubscribe(q)

    return Response(stream(), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
