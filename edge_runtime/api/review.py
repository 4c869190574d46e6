"""Inspection evidence, result queries, exports and review writes (a blueprint of its own).

- `GET /api/v1/results/<id>/image.jpg` and `…/thumbnail.jpg`: the kept evidence (immutable, ETag = sha256);
  410 `evidence_removed` once retention deleted it or it was found removed (the result says so too)
- `GET /api/v1/inspections`: results filtered by camera, defect, category, since/until, review state,
  confidence below; newest first with a `before` cursor (`after` returns only newer rows, for polling)
- `GET /api/v1/inspections/export.csv|.jsonl`: the same filters, streamed page by page, one export at
  a time (a 429 for another: an export holds a server thread while its client reads it); a client that
  takes it slower than `api.export_min_kib_s` or not within `api.export_max_s` is cut (guard.SendBound)
- `GET /api/v1/review/schema`: the bundle's verdict schema (the page builds its correction form from it)
- `POST /api/v1/results/<id>/review`: confirm or correct (token rules as for every write)
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
from collections.abc import Generator, Iterator
from typing import Any

from flask import Blueprint, Flask, Response, current_app, jsonify, request, send_file
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from werkzeug.exceptions import RequestedRangeNotSatisfiable

from edge_runtime.api.admission import Closing, parse_json, storage_full
from edge_runtime.api.auth import require_access
from edge_runtime.api.errors import ApiError
from edge_runtime.api.guard import Limits, bind
from edge_runtime.api.metrics import webhook_metrics
from edge_runtime.core.device import DeviceRoles
from edge_runtime.core.errors import StorageFull
from edge_runtime.core.result_filter import ResultFilter, ReviewError

log = logging.getLogger(__name__)
bp = Blueprint("inspection", __name__)
MAX_REVIEW_BYTES = 64 * 1024
CSV_COLUMNS = ("id", "ts", "camera", "defect", "category", "confidence", "verdict", "review_state",
               "correction", "rules", "evidence_uri", "total_ms", "model")


def daemon() -> DeviceRoles:
    device: DeviceRoles = current_app.extensions["edge_runtime"]
    return device


def _bad(message: str, field: str) -> ApiError:
    return ApiError(400, "bad_request", f"{field}: {message}", field=field)


def _int(name: str) -> int | None:
    raw = request.args.get(name)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19:  # "²".isdigit() is True
        raise _bad("must be a non-negative integer (a cursor from a previous page)", name)
    return int(raw)


def _filter() -> ResultFilter:
    args = request.args
    defect = args.get("defect")
    if defect is not None and defect.lower() not in ("true", "false", "1", "0"):
        raise _bad("must be true or false", "defect")
    below: float | None = None
    if "below" in args:
        try:
            below = float(args["below"])
        except ValueError:
            raise _bad("must be a number", "below") from None
        if not math.isfinite(below):
            raise _bad("must be a finite number", "below")
    for name in ("since", "until"):  # an empty bound is a mistake, not "no bound"
        if name in args and not args[name].strip():
            raise _bad("must be an RFC 3339 timestamp, not empty (leave the parameter out for no bound)", name)
    limit = _int("limit")
    d = daemon()
    f = ResultFilter(camera=args.get("camera") or None, category=args.get("category") or None,
                     defect=None if defect is None else defect.lower() in ("true", "1"),
                     since=args.get("since") or None, until=args.get("until") or None,
                     review=args.get("review") or None, below=below, before=_int("before"), after=_int("after"),
                     limit=50 if limit is None else limit, defect_field=d.status.config.evidence.defect_field)
    try:
        return f.check()
    except ReviewError as exc:
        raise _bad(str(exc), exc.field) from None


# ---- evidence images -------------------------------------------------------------------------------

def _gone(result_id: str, evidence: dict[str, Any]) -> ApiError:
    """410: the result had an image and it was removed (its journal row says when and why)."""
    removed = evidence.get("removed") or {}
    why = {"retention": "deleted by retention (evidence.max_mb / max_age_days)",
           "missing": "removed from the evidence folder by something other than the device"}.get(
        str(removed.get("why")), "deleted by retention")
    when = f" at {removed['at']}" if removed.get("at") else ""
    return ApiError(410, "evidence_removed", f"the evidence image of result {result_id!r} (sha256 "
                    f"{evidence.get('sha256', '?')}) was {why}{when}")


def _evidence(result_id: str, thumbnail: bool) -> Any:
    d = daemon()
    if len(result_id) > 64:
        raise ApiError(404, "not_found", "no result with that id")
    try:  # opened here: retention may delete the file between the lookup and now
        found = d.results.evidence_file(result_id, thumbnail)
        handle = found.path.open("rb") if found is not None else None
    except FileNotFoundError:  # gone since the lookup: the result, read below, is marked removed
        found = handle = None
    except OSError as exc:  # there but unreadable (EACCES), or its thumbnail cannot be made (ENOSPC)
        log.warning("api: the evidence of result %s cannot be read: %s", result_id, exc)
        raise ApiError(503, "storage_error", f"the evidence image of result {result_id!r} cannot be read from "
                       f"the device's storage now ({exc.strerror or exc})", headers={"Retry-After": "30"}) from None
    if found is None or handle is None:
        result = d.results.get_result(result_id)  # marked removed when its file is found missing
        evidence = result.get("evidence") if result is not None else None
        if isinstance(evidence, dict) and evidence.get("removed"):
            raise _gone(result_id, evidence)
        if result is None:
            why = "no result with that id"
        elif not d.status.config.evidence.enabled:
            why = "evidence is off (evidence.enabled: false)"
        elif isinstance(evidence, dict) and evidence.get("uri"):
            why = "its image is not kept on the device"
        else:
            why = "its image was not kept (passes are sampled)"
        raise ApiError(404, "not_found", f"no evidence for {result_id!r}: {why}")
    # The size comes from the open handle (the path may be gone by now): with it, HEAD has a
    # Content-Length and a single `Range: bytes=a-b` is a 206 with Content-Range (416 past the end).
    stat = os.fstat(handle.fileno())
    response: Any = send_file(handle, mimetype="image/jpeg", etag=found.etag, conditional=False, max_age=86400,
                         last_modified=stat.st_mtime)
    response.content_length = stat.st_size
    try:
        response = response.make_conditional(request.environ, accept_ranges=True, complete_length=stat.st_size)
    except RequestedRangeNotSatisfiable:
        handle.close()
        raise
    response.headers["Cache-Control"] = "private, max-age=86400, immutable"  # content-addressed
    return response


@bp.get("/api/v1/results/<result_id>/image.jpg")
def image(result_id: str) -> Any:
    return _evidence(result_id, thumbnail=False)


@bp.get("/api/v1/results/<result_id>/thumbnail.jpg")
def thumbnail(result_id: str) -> Any:
    return _evidence(result_id, thumbnail=True)


# ---- queries and exports ---------------------------------------------------------------------------

@bp.get("/api/v1/inspections")
def inspections() -> Any:
    f = _filter()
    with current_app.extensions["edge_runtime_queries"].admitted():  # two at a time, as /api/v1/results
        rows, cursor = daemon().results.query_inspections(f)
    return jsonify(results=rows, next_before=cursor)


def _csv_row(r: dict[str, Any]) -> list[Any]:
    v = r.get("verdict") or {}
    review = r.get("review") or {}
    return [r["id"], r["ts"], r["camera"], v.get("defect"), v.get("category"), v.get("confidence"),
            json.dumps(v, ensure_ascii=False), review.get("state"),
            json.dumps(review["correction"]) if review.get("correction") else "",
            ";".join(x["name"] for x in r.get("rules") or []), (r.get("evidence") or {}).get("uri", ""),
            (r.get("timings_ms") or {}).get("total"), r.get("model")]


def _csv_text(values: list[Any]) -> str:
    buf = io.StringIO()
    # Spreadsheet formula injection: a cell starting with = + - @ is read as a formula by Excel.
    csv.writer(buf).writerow(["'" + x if isinstance(x, str) and x[:1] in "=+-@" else x for x in values])
    return buf.getvalue()


@bp.get("/api/v1/inspections/export.<fmt>")
def export(fmt: str) -> Any:
    if fmt not in ("csv", "jsonl"):
        raise ApiError(404, "not_found", "export formats: export.csv, export.jsonl")
    f = _filter()
    # An export holds a server thread until its client has read it (a large journal is more than
    # waitress buffers): one at a time, on a thread of its own, so /healthz never waits behind them.
    ticket = current_app.extensions["edge_runtime_exports"].enter()
    try:
        matches = daemon().results.iterate_inspections(f)
    except BaseException:
        ticket.release()
        raise

    def rows() -> Generator[str, None, None]:
        if fmt == "csv":
            yield _csv_text(list(CSV_COLUMNS))
        for r in matches:
            yield _csv_text(_csv_row(r)) if fmt == "csv" else json.dumps(r, ensure_ascii=False) + "\n"

    # The slot is held until the whole answer has left waitress's buffer (up to 16 MB of it is there when
    # the app has written its last row; the kernel's socket buffer still holds a few MB for the client):
    # the bound's end releases it, as does a cut of one that takes a trickle or takes too long, or the
    # connection closing, so the next client gets the slot (guard.SendBound). Outside GuardedServer (a
    # test client) there is no bound: the slot goes when the app has written the answer.
    limits = current_app.extensions.get("edge_runtime_limits") or Limits()
    bound = bind(request.environ, "export", limits, on_end=ticket.release)

    def written() -> None:
        if bound is None:
            ticket.release()
        else:  # the flush of its last bytes (the chunked answer's end) ends the bound; the loop's pass at latest
            bound.done = True

    mimetype = "text/csv" if fmt == "csv" else "application/x-ndjson"
    return Response(Closing(rows(), written), mimetype=mimetype,
                    headers={"Content-Disposition": f'attachment; filename="results.{fmt}"'})


# ---- review --------------------------------------------------------------------------------------

@bp.get("/api/v1/review/schema")
def review_schema() -> Any:
    info = daemon().status.model_info()
    if info is None:
        raise ApiError(503, "not_ready", "the model is not loaded yet")
    return jsonify(schema=info.verdict_schema,
                   token_required=bool(current_app.config["EDGE_API_TOKEN"]))


@bp.post("/api/v1/results/<result_id>/review")
@require_access
def review(result_id: str) -> Any:
    if (request.content_length or 0) > MAX_REVIEW_BYTES:
        raise ApiError(413, "too_large", f"a review is at most {MAX_REVIEW_BYTES} bytes")
    # Depth-bounded, and NaN/Infinity are not JSON (they passed the schema's bounds, then broke SQLite's json()).
    body = parse_json(request.get_data(cache=True))
    if not isinstance(body, dict):
        raise _bad("send a JSON object {action, verdict?, note?}", "body")
    d = daemon()
    result = d.results.get_result(result_id) if len(result_id) <= 64 else None
    if result is None:
        raise ApiError(404, "not_found", f"no result with id {result_id!r}")
    # A confirmation keeps the model's verdict: a `verdict` sent with it is not stored.
    correction = body.get("verdict") if body.get("action") == "correct" else None
    if body.get("action") == "correct":
        if not isinstance(correction, dict):
            raise _bad("the corrected verdict object is required to correct", "verdict")
        if d.status.model_info() is None:
            raise ApiError(503, "not_ready", "the model is not loaded yet (its schema checks corrections)")
        error = d.review.verdict_error(correction)
        if error is not None:  # jsonschema quotes the offending value: a 60 kB string is not echoed back
            message = error[0] if len(error[0]) <= 200 else error[0][:200] + "…"
            raise _bad(f"does not match the bundle's schema: {message}", f"verdict{error[1]}")
    try:
        written = d.review.review_result(result, str(body.get("action")), correction, body.get("note"))
    except ReviewError as exc:
        raise _bad(str(exc), exc.field) from None
    except StorageFull as exc:  # the journal's disk is full: 503 with Retry-After, as for a trigger
        raise storage_full(exc) from None
    return jsonify(id=result_id, review=written)


# ---- metrics ---------------------------------------------------------------------------------------

class VerdictCollector(Collector):
    """Rule firings, evidence, webhooks and reviews, read from the services at scrape time."""

    def __init__(self, device: DeviceRoles) -> None:
        self.device = device

    def collect(self) -> Iterator[Any]:
        s = self.device.status.verdict_status()
        if s is None:
            return
        fired = CounterMetricFamily("edge_rule_firings", "Rule firings by rule", labels=["rule"])
        for name, n in s["rules"]["fired"].items():
            fired.add_metric([name], n)
        yield fired
        yield CounterMetricFamily("edge_rule_reasks", "Second questions asked by rules", value=s["rules"]["reasks"])
        yield CounterMetricFamily("edge_rule_reasks_skipped", "Re-asks skipped (over a rule's max_per_minute or "
                                  "rules_budget)", value=s["rules"].get("reasks_skipped", 0))
        yield CounterMetricFamily("edge_rule_reasks_budget_skipped", "Re-asks skipped over rules_budget",
                                  value=s["rules"].get("reasks_budget_skipped", 0))
        yield CounterMetricFamily("edge_rule_regex_budget_exhausted", "Regex conditions counted as no match: the "
                                  "verdict's rules_budget.regex_s_per_verdict was spent",
                                  value=s["rules"].get("regex_budget_exhausted", 0))
        yield CounterMetricFamily("edge_rule_regex_timeouts", "Regex searches that ran out of their share",
                                  value=s["rules"].get("regex_timeouts", 0))
        yield GaugeMetricFamily("edge_alerts_backlog", "Alerts and reviews not yet acknowledged by the broker",
                                value=s["rules"]["alerts_backlog"])
        ev = s["evidence"]
        if ev.get("enabled"):
            yield GaugeMetricFamily("edge_evidence_bytes", "Bytes in the evidence store", value=ev["bytes"])
            yield GaugeMetricFamily("edge_evidence_budget_bytes", "Evidence disk budget", value=ev["budget_bytes"])
            yield CounterMetricFamily("edge_evidence_saved", "Evidence images written", value=ev["saved"])
            yield CounterMetricFamily("edge_evidence_write_failures", "Evidence not kept: disk or budget full",
                                      value=ev["skipped_full"])
        wh = s["webhooks"]
        yield from webhook_metrics(wh)
        yield GaugeMetricFamily("edge_webhooks_pending", "Webhook POSTs waiting for delivery", value=wh["pending"])
        yield CounterMetricFamily("edge_webhooks_delivered", "Webhook POSTs acknowledged (2xx)", value=wh["delivered"])
        yield CounterMetricFamily("edge_webhooks_dropped", "Webhook POSTs dropped (outbox full)", value=wh["dropped"])
        reviews = GaugeMetricFamily("edge_reviews", "Results by review state", labels=["state"])
        for state, n in s["reviews"].items():
            reviews.add_metric([state], n)
        yield reviews


def register(app: Flask, daemon: DeviceRoles, registry: Any) -> None:
    """Blueprint and metrics of evidence, queries, exports and review."""
    app.register_blueprint(bp)
    registry.register(VerdictCollector(daemon))


# ---- OpenAPI -------------------------------------------------------------------------------------

_ERR = {"$ref": "#/components/schemas/ErrorBody"}  # the one error shape (openapi._models defines it)
RESULT_FIELDS: dict[str, Any] = {
    "evidence": {"type": ["object", "null"], "description": "The kept image: uri, sha256, bytes, width, height; "
                 "once the image is removed, uri is null and removed is {at, why: retention or missing}"},
    "rules": {"type": ["array", "null"], "items": {"type": "object"}, "description": "Rules that fired"},
    "review": {"type": ["object", "null"], "description": "state (pending/confirmed/corrected), correction"},
}


def _ok(mimetype: str = "application/json", schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": "OK", "content": {mimetype: {"schema": schema or {"type": "object"}}}}


def _err(*codes: int) -> dict[str, Any]:
    return {str(c): {"description": "Error", "content": {"application/json": {"schema": _ERR}}} for c in codes}


def _q(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


_ID = {"name": "result_id", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 64}}
_FILTERS = [
    _q("camera", {"type": "string", "maxLength": 64}, "Only this camera"),
    _q("defect", {"type": "string", "enum": ["true", "false"]}, "Defects only, or passes only"),
    _q("category", {"type": "string", "maxLength": 200}, "verdict.category equals"),
    _q("since", {"type": "string", "format": "date-time"}, "ts >= (RFC 3339)"),
    _q("until", {"type": "string", "format": "date-time"}, "ts < (RFC 3339)"),
    _q("review", {"type": "string", "enum": ["pending", "confirmed", "corrected", "reviewed", "none"]}, "Review state"),
    _q("below", {"type": "number"}, "verdict.confidence below"),
    _q("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "Page size (default 50)"),
    _q("before", {"type": "integer", "minimum": 0}, "Cursor: next_before of the previous page"),
    _q("after", {"type": "integer", "minimum": 0}, "Only rows newer than this journal_seq"),
]


def openapi_paths() -> dict[str, Any]:
    """This blueprint's part of /api/v1/openapi.json."""
    jpeg = _ok("image/jpeg", {"type": "string", "format": "binary"})
    review_body = {"type": "object", "required": ["action"], "properties": {
        "action": {"type": "string", "enum": ["confirm", "correct"]},
        "verdict": {"type": "object", "description": "The corrected verdict (valid against the bundle's schema)"},
        "note": {"type": "string", "maxLength": 500}}}
    return {
        "/api/v1/results/{result_id}/image.jpg": {"get": {
            "summary": "The result's evidence image (410 once it was removed)", "parameters": [_ID],
            "responses": {"200": jpeg, **_err(404, 410)}}},
        "/api/v1/results/{result_id}/thumbnail.jpg": {"get": {
            "summary": "Its thumbnail (410 once it was removed)", "parameters": [_ID],
            "responses": {"200": jpeg, **_err(404, 410)}}},
        "/api/v1/inspections": {"get": {
            "summary": "Results filtered, newest first, with a cursor", "parameters": _FILTERS,
            "responses": {"200": _ok(), **_err(400)}}},
        "/api/v1/inspections/export.{fmt}": {"get": {
            "summary": "Filtered results as CSV or JSON lines (streamed)",
            "parameters": [{"name": "fmt", "in": "path", "required": True,
                            "schema": {"type": "string", "enum": ["csv", "jsonl"]}}, *_FILTERS[:7]],
            "responses": {"200": {"description": "CSV or JSON lines", "content": {
                "text/csv": {"schema": {"type": "string"}},
                "application/x-ndjson": {"schema": {"type": "string"}}}}, **_err(400, 404)}}},
        "/api/v1/review/schema": {"get": {
            "summary": "The bundle's verdict schema (the review form)", "responses": {"200": _ok(), **_err(503)}}},
        "/api/v1/results/{result_id}/review": {"post": {
            "summary": "Confirm or correct a result", "parameters": [_ID], "security": [{"bearer": []}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": review_body}}},
            "responses": {"200": _ok(), **_err(400, 401, 403, 404, 413, 503)}}},
    }
