"""JSON errors for every failure: a message, a type and the field at fault; never HTML or a traceback.

Client mistakes are 4xx and name the request field (`field`, and `param` as OpenAI clients read it);
5xx is left for faults of ours.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, jsonify, request
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException, RequestedRangeNotSatisfiable
from werkzeug.routing import RequestRedirect

from edge_runtime.core.errors import ImageError, ImageTooLarge, InputError

log = logging.getLogger(__name__)

# In the environ of a request the app answers for guard.ProbeAnswers (ApiServer._probe_answer), not for a
# client: a list the error handler appends what was raised to, instead of logging it (see `unexpected`).
PROBE_REFRESH = "edge_runtime.probe_refresh"


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None,
                 field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.headers = headers or {}


def invalid(field: str, message: str, status: int = 400) -> ApiError:
    """A 4xx naming the request field (dotted path)."""
    return ApiError(status, "invalid_request_error", f"{field}: {message}", field=field)


_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def from_validation(exc: ValidationError, prefix: str = "") -> ApiError:
    """The first pydantic error as one line naming its field (e.g. `messages.0.content`)."""
    err = exc.errors(include_url=False)[0]
    # pydantic puts union member tags in the path ("str", "constrained-str", "list[ContentPart]"): drop them
    parts = [str(p) for p in err["loc"] if isinstance(p, int) or not (p in _TAGS or "[" in p or "-" in p)]
    where = ".".join(parts) or "body"
    # a validator's own message reads as it was written, without pydantic's "Value error, " in front
    return invalid(f"{prefix}{where}" if where != "body" or not prefix else prefix.rstrip("."),
                   err["msg"].removeprefix("Value error, "))


def from_input_error(exc: InputError) -> ApiError:
    status = exc.status if 400 <= exc.status < 500 else 400
    return ApiError(status, "invalid_request_error", str(exc), field=exc.field)


def from_image_error(exc: ImageError, field: str) -> ApiError:
    if isinstance(exc, ImageTooLarge):
        return ApiError(413, "image_too_large", str(exc), field=field)
    return ApiError(400, "invalid_image", str(exc), field=field)


def body(status: int, code: str, message: str, field: str | None = None) -> dict[str, Any]:
    # OpenAI clients read error.message/type/code/param; our own clients read the same object.
    error: dict[str, Any] = {"message": message, "type": code, "code": status}
    if field is not None:
        error["field"] = error["param"] = field
    return {"error": error}


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(ApiError)
    def api_error(exc: ApiError) -> Any:
        response = jsonify(body(exc.status, exc.code, exc.message, exc.field))
        response.status_code = exc.status
        response.headers.update(exc.headers)
        return response

    @app.errorhandler(InputError)
    def input_error(exc: InputError) -> Any:
        return api_error(from_input_error(exc))

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Any:
        status = exc.code or 500
        message = exc.description or exc.name
        field = None
        if status == 413:
            limit = app.config.get("MAX_CONTENT_LENGTH") or 0
            message = f"the request body is larger than the limit of {limit // (1024 * 1024)} MB"
            length = request.content_length
            parts, text = request.max_form_parts, request.max_form_memory_size
            if request.mimetype == "multipart/form-data" and length is not None and length <= limit \
                    and parts is not None and text is not None:
                # Not the body's size: werkzeug's form parser bounds the parts and each text field.
                field = "body"
                message = (f"the multipart form is over the form parser's limits: at most "
                           f"{parts} parts, and at most {text // 1000} kB "
                           "in one text field (a file part such as `image` is bounded only by the body's size)")
        response = jsonify(body(status, exc.name.lower().replace(" ", "_"), message, field))
        response.status_code = status
        if isinstance(exc, RequestedRangeNotSatisfiable) and exc.length is not None:
            response.headers["Content-Range"] = f"{exc.units} */{exc.length}"  # what a client can ask for
        if status == 405 and exc.response is None:
            # werkzeug keeps the allowed methods on the exception; clients need them in `Allow`.
            valid = getattr(exc, "valid_methods", None)
            if valid:
                response.headers["Allow"] = ", ".join(sorted(valid))
        return response

    routing = app.handle_http_exception

    def handle_http_exception(exc: HTTPException) -> Any:
        # Flask hands routing redirects (`/static//x` -> `/static/x`, a missing trailing slash) back
        # as werkzeug's HTML page, past every error handler: answer them in the JSON shape too.
        if isinstance(exc, RequestRedirect):
            response = jsonify(body(exc.code, "redirect", f"the resource is at {exc.new_url}"))
            response.status_code = exc.code
            response.headers["Location"] = exc.new_url
            return response
        return routing(exc)

    app.handle_http_exception = handle_http_exception  # type: ignore[method-assign,assignment]

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> Any:
        refresh = request.environ.get(PROBE_REFRESH)
        if refresh is not None:  # the health probes' refresher (10 a second): it logs once per failure streak
            refresh.append(exc)
        else:
            log.exception("api: %s %s failed", request.method, request.path)
        response = jsonify(body(500, "internal_error", f"{type(exc).__name__}: {exc}"))
        response.status_code = 500
        return response
