"""REST endpoints of DESIGN.md: health, status, results, frames, infer, trigger, live events.

Inference requests pass admission (count and pixels in flight) before their body is parsed, and
every input is bounded by the request models in `models.py` before it costs a decode.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import queue
import sqlite3
import time
from collections.abc import Callable, Generator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request
from pydantic import BaseModel, ValidationError

from edge_runtime.api.admission import (
    RETRY_AFTER_S,
    Admission,
    Closing,
    Ticket,
    image_size,
    parse_json,
    storage_full,
)
from edge_runtime.api.auth import require_access
from edge_runtime.api.errors import ApiError, from_image_error, from_input_error, from_validation, invalid
from edge_runtime.api.models import (
    INT64_MAX,
    Alive,
    AnyObject,
    EventsQuery,
    InferJson,
    InferMultipart,
    Readiness,
    ResultModel,
    ResultsPage,
    ResultsQuery,
    TriggerBody,
)
from edge_runtime.api.openapi import doc, openapi_document
from edge_runtime.api.rails.http import checked_result, infer_prompt
from edge_runtime.api.rails.live import live_rails
from edge_runtime.api.rails.request import request_id
from edge_runtime.core.device import DeviceRoles
from edge_runtime.core.errors import EdgeRuntimeError, ImageError, InputError, QueueFull, StorageFull
from edge_runtime.core.images import decode_image
from edge_runtime.delivery.events import SHUTDOWN, EventHub

log = logging.getLogger(__name__)
bp = Blueprint("rest", __name__)
KEEPALIVE_S = 5.0


def daemon() -> DeviceRoles:
    """The device this app serves, by role (passed to create_app, never a global)."""
    device: DeviceRoles = current_app.extensions["edge_runtime"]
    return device


def admission() -> Admission:
    gate: Admission = current_app.extensions["edge_runtime_admission"]
    return gate


def validate(model: type[BaseModel], data: Any, prefix: str = "") -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation(exc, prefix) from None


def json_body(force: bool = False) -> Any:
    """The request's JSON, size-bounded by MAX_CONTENT_LENGTH and depth-bounded before it is parsed.
    `force`: whatever the Content-Type says (OpenAI clients and `curl -d` differ on it)."""
    if not force and not request.is_json:
        raise ApiError(415, "unsupported_media_type", "send application/json", field="body")
    return parse_json(request.get_data(cache=True))


def wait_result(future: Future[Any]) -> Any:
    timeout = daemon().status.config.api.request_timeout_s
    try:
        return future.result(timeout=timeout)
    except FutureTimeout:
        raise ApiError(504, "timeout", f"no verdict within {timeout:.0f} s") from None
    except InputError as exc:  # the model layer refused the input (e.g. longer than the context)
        raise from_input_error(exc) from None
    except ImageError as exc:
        raise from_image_error(exc, "image") from None
    except StorageFull as exc:
        raise storage_full(exc) from None
    except EdgeRuntimeError as exc:
        raise ApiError(500, "inference_failed", str(exc)) from None


def submit(fn: Callable[..., Future[Any]], *args: Any, **kwargs: Any) -> Future[Any]:
    """Put work on the shared inspection queue; a full queue is 429 with Retry-After."""
    try:
        return fn(*args, **kwargs)
    except QueueFull as exc:
        raise ApiError(429, "queue_full", f"{exc}; retry shortly",
                       headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    except InputError as exc:
        raise from_input_error(exc) from None
    except StorageFull as exc:
        raise storage_full(exc) from None


def decode_base64(text: str, field: str) -> bytes:
    """Base64 (or a data: URL's payload) to bytes, its size checked before anything is decoded."""
    payload = text.split(",", 1)[-1] if text.startswith("data:") else text
    limit = int(daemon().status.config.api.max_request_mb * 1024 * 1024)
    if len(payload) // 4 * 3 > limit:
        raise ApiError(413, "image_too_large", f"{field}: the image is larger than {limit // (1024 * 1024)} MB",
                       field=field)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(field, "not valid base64") from None


def decode_upload(data: bytes, ticket: Ticket | None = None, field: str = "image") -> Any:
    """Reserve the image's pixels (read from its header) with admission, then decode it."""
    limits = daemon().status.config.images
    size = image_size(data)
    if ticket is not None and size is not None and size[0] * size[1] <= limits.max_pixels:
        ticket.reserve_pixels(size[0], size[1], field)
    try:
        return decode_image(data, limits.max_pixels, limits.min_side)
    except ImageError as exc:
        raise from_image_error(exc, field) from None


# ---- health and status ---------------------------------------------------------------------

@bp.get("/healthz")
@doc("Process is alive (answers in milliseconds whatever else runs)", response=Alive)
def healthz() -> Any:
    return jsonify(status="ok")


@bp.get("/readyz")
@doc("Ready: the model is loaded and warmed up, and results can be inspected and journaled (200, also "
     "while `degraded` by a fault that does not stop that, e.g. a webhook receiver or the broker down); "
     "else 503 with state and reasons", response=Readiness, errors=(503,))
def readyz() -> Any:
    d = daemon()
    health = d.status.health()  # cheap by contract: no journal query
    info = d.status.model_info()
    response = jsonify(**health, model=info.model_name if info else None)
    # Readiness is "can inspect and journal": a degraded sink shows in the body, status, metrics and
    # telemetry, never here (the image's HEALTHCHECK and the OTA health gate read this code).
    response.status_code = 200 if health["ready"] else 503
    if response.status_code == 503:
        response.headers["Retry-After"] = "5"
    return response


@bp.get("/api/v1/status")
@doc("Device, model, cameras, queue, journal, MQTT, governor, health", response=AnyObject)
def status() -> Any:
    return jsonify(daemon().status.status())


@bp.get("/api/v1/openapi.json")
@doc("This document", response=AnyObject)
def openapi() -> Any:
    return jsonify(openapi_document())


# ---- results -------------------------------------------------------------------------------

@bp.get("/api/v1/results")
@doc("Results from the journal, newest first", query=ResultsQuery, response=ResultsPage, errors=(400,))
def results() -> Any:
    q: ResultsQuery = validate(ResultsQuery, request.args.to_dict())
    last_event_id = current_app.extensions["edge_runtime_events"].last_id  # before the query: no gap
    # A page of a large journal takes its one connection for a while: two at a time (429 beyond), so a
    # crowd of readers cannot take every server thread from /healthz.
    with current_app.extensions["edge_runtime_queries"].admitted():
        rows = daemon().results.query_results(camera=q.camera, since=q.since, until=q.until, limit=q.limit,
                                              before_seq=q.before)
    next_before = rows[-1]["journal_seq"] if len(rows) == q.limit else None
    return jsonify(results=rows, next_before=next_before, last_event_id=last_event_id)


@bp.get("/api/v1/results/<result_id>")
@doc("One result", response=ResultModel, errors=(404,))
def result(result_id: str) -> Any:
    found = daemon().results.get_result(result_id[:128])
    if found is None:
        raise ApiError(404, "not_found", f"no result with id {result_id[:128]!r}", field="result_id")
    return jsonify(found)


@bp.get("/api/v1/cameras/<name>/frame.jpg")
@doc("Latest frame of a camera", response="image/jpeg", errors=(404,))
def frame(name: str) -> Any:
    try:
        jpeg = daemon().cameras.latest_jpeg(name)
    except EdgeRuntimeError as exc:
        raise ApiError(404, "not_found", str(exc), field="name") from None
    if jpeg is None:
        raise ApiError(404, "no_frame", f"camera {name!r} has not delivered a frame yet", field="name")
    return Response(jpeg, mimetype="image/jpeg", headers={"Cache-Control": "no-store"})


# ---- inference -------------------------------------------------------------------------------

@bp.post("/api/v1/infer")
@doc("Inspect an uploaded image (not journaled)", body={"multipart/form-data": InferMultipart,
                                                          "application/json": InferJson},
     response=ResultModel, errors=(400, 401, 403, 413, 415, 422, 429, 504), secured=True, body_required=True)
@require_access
def infer() -> Any:
    """multipart: `image` file + optional `prompt`; or JSON {"image": base64, "prompt": ...}."""
    with admission().admitted() as ticket:  # before the body is parsed or decoded
        d = daemon()
        info = d.status.model_info()
        rails, rid = live_rails(d.status.config.rails), request_id(request.headers.get("X-Request-Id"), "infer")
        # The input rails read the prompt before the image is read or its base64 decoded, as on chat.
        if request.mimetype == "multipart/form-data":
            upload = request.files.get("image")
            if upload is None:
                raise invalid("image", "the multipart field 'image' is missing")
            form = validate(TriggerBody, {"prompt": request.form.get("prompt")})  # the form's prompt field
            prompt = infer_prompt(rails, rid, form.prompt, info.name if info else "")
            data = upload.read()
        elif request.is_json:
            body = validate(InferJson, json_body())
            prompt = infer_prompt(rails, rid, body.prompt, info.name if info else "")
            data = decode_base64(body.image, "image")
        else:
            raise ApiError(415, "unsupported_media_type", "send multipart/form-data or application/json",
                           field="body")
        rails.check_image(image_size(data), "image", rid)  # from the header: nothing decoded yet
        image = decode_upload(data, ticket)
        result = wait_result(submit(d.inference.submit_image, image, prompt))
        out = checked_result(rails, result, lambda p: wait_result(submit(d.inference.submit_image, image, p)), rid)
        current_app.extensions["edge_runtime_events"].publish(out)  # as answered: after the output rails
        return jsonify(out)


@bp.post("/api/v1/cameras/<name>/trigger")
@doc("Inspect the camera's newest frame now (journaled and published)", body={"application/json": TriggerBody},
     response=ResultModel, errors=(400, 401, 403, 404, 409, 429, 504), secured=True)
@require_access
def trigger(name: str) -> Any:
    with admission().admitted():
        body = validate(TriggerBody, json_body() if request.get_data(cache=True).strip() else {})
        d = daemon()
        if name not in d.status.camera_names():
            raise ApiError(404, "not_found", f"no camera named {name[:64]!r}", field="name")
        try:
            future = submit(d.cameras.trigger, name, body.prompt)
        except (StorageFull, ApiError):
            raise
        except EdgeRuntimeError as exc:
            raise ApiError(409, "no_frame", str(exc), field="name") from None
        return jsonify(wait_result(future).to_dict())


# ---- live events -----------------------------------------------------------------------------

def event_id(raw: str | None, field: str) -> int | None:
    """An event id as the server wrote it: ASCII digits only, at most 19 of them (pydantic's int would
    take "5.0", "+5", "1_000" and "٥")."""
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > INT64_MAX:
        raise invalid(field, "must be an event id: ASCII digits only, at most 19 of them")
    return int(raw)


def as_journaled_now(event: dict[str, Any]) -> dict[str, Any]:
    """A replayed event's evidence as the journal has it now: an image removed since it was published
    is `uri: null` with `removed` (as in /api/v1/results), not a link that answers 410."""
    evidence = event.get("evidence")
    if not (isinstance(evidence, dict) and evidence.get("uri")) or not isinstance(event.get("id"), str):
        return event
    try:
        now = daemon().results.get_result(event["id"])
    except sqlite3.Error as exc:  # the journal locked or failing: the event as it was published
        log.warning("api: replaying event of result %s as published: the journal cannot be read (%s)",
                    event["id"], exc)
        return event
    return event if now is None else {**event, "evidence": now.get("evidence")}


@bp.get("/api/v1/events")
@doc("Server-sent events: `result` per new verdict, each with an id; a stream ends after a while and the "
     "browser resumes it with Last-Event-ID", query=EventsQuery, response="text/event-stream", errors=(400, 429))
def events() -> Any:
    validate(EventsQuery, request.args.to_dict())
    after = event_id(request.args.get("last_event_id"), "last_event_id")
    header = request.headers.get("Last-Event-ID", "").strip()
    if header:
        after = event_id(header, "Last-Event-ID")
    ticket = current_app.extensions["edge_runtime_streams"].enter()
    hub: EventHub = current_app.extensions["edge_runtime_events"]
    lifetime = float(current_app.config["EDGE_STREAM_SECONDS"])
    q, backlog = hub.subscribe(after)

    def frame(event_id: int, event: dict[str, Any]) -> str:
        return f"id: {event_id}\nevent: result\ndata: {json.dumps(event)}\n\n"

    def release() -> None:
        hub.unsubscribe(q)
        ticket.release()

    try:  # a request that fails here gives its slot and subscription back (stream() holds them after)
        backlog = [(i, as_journaled_now(e)) for i, e in backlog]
    except BaseException:
        release()
        raise

    def stream() -> Generator[str, None, None]:
        # Ends after `lifetime` so no stream holds a thread for good; `retry` brings the browser back.
        try:
            yield "retry: 1000\n\n"
            for event_id, event in backlog:
                yield frame(event_id, event)
            deadline = time.monotonic() + lifetime
            while not hub.closed and (left := deadline - time.monotonic()) > 0:
                try:
                    # A closed browser is noticed only when a write fails: keep-alive often.
                    item = q.get(timeout=min(KEEPALIVE_S, left))
                except queue.Empty:
                    yield ": keep-alive\n\n"
                    continue
                if item is SHUTDOWN:
                    break
                yield frame(*item)
        finally:
            release()

    return Response(Closing(stream(), release), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
