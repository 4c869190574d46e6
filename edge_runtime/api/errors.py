"""JSON errors for every failure: a message and a code, never an HTML page or a traceback."""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, jsonify, request
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = headers or {}


def _body(status: int, code: str, message: str) -> dict[str, Any]:
    # OpenAI clients read error.message/type/code; our own clients read the same object.
    return {"error": {"message": message, "type": code, "code": status}}


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(ApiError)
    def api_error(exc: ApiError) -> Any:
        response = jsonify(_body(exc.status, exc.code, exc.message))
        response.status_code = exc.status
        response.headers.update(exc.headers)
        return response

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Any:
        status = exc.code or 500
        message = exc.description or exc.name
        if status == 413:
            limit = app.config.get("MAX_CONTENT_LENGTH") or 0
            message = f"the request body is larger than the limit of {limit // (1024 * 1024)} MB"
        response = jsonify(_body(status, exc.name.lower().replace(" ", "_"), message))
        response.status_code = status
        return response

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> Any:
        log.exception("api: %s %s failed", request.method, request.path)
        response = jsonify(_body(500, "internal_error", f"{type(exc).__name__}: {exc}"))
        response.status_code = 500
        return response
