"""The OpenAPI 3.1 document of the HTTP API (served at /api/v1/openapi.json)."""

from __future__ import annotations

from typing import Any

from .. import __version__

_ERROR = {"$ref": "#/components/schemas/Error"}
_RESULT = {"$ref": "#/components/schemas/Result"}


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {400: "Bad request or image", 401: "Missing or wrong token", 403: "Remote caller without token",
            404: "Not found", 409: "Camera has no frame yet", 413: "Body or image too large",
            415: "Wrong content type", 429: "Inspection queue full (see Retry-After)",
            503: "Not ready", 504: "No verdict in time"}
    return {str(c): _json(_ERROR, text[c]) for c in codes}


def openapi_document() -> dict[str, Any]:
    secured: list[dict[str, list[str]]] = [{"bearer": []}]
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "edge-runtime", "version": __version__,
                 "description": "Inspection device API. Inference and mutating endpoints need a Bearer token "
                                "when one is configured, otherwise they answer loopback clients only."},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                    "type": "object", "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                                                     "code": {"type": "integer"}}}}},
                "Result": {"type": "object", "required": ["id", "device", "camera", "ts", "frame", "verdict",
                                                          "text", "model", "timings_ms"],
                           "properties": {
                               "id": {"type": "string"}, "device": {"type": "string"},
                               "camera": {"type": "string"}, "ts": {"type": "string", "format": "date-time"},
                               "frame": {"type": "object", "properties": {
                                   "seq": {"type": "integer"}, "width": {"type": "integer"},
                                   "height": {"type": "integer"}}},
                               "verdict": {"type": "object", "description": "Valid against the bundle's schema"},
                               "text": {"type": "string"}, "model": {"type": "string"},
                               "prompt": {"type": "string"},
                               "timings_ms": {"type": "object", "additionalProperties": {"type": "number"}},
                               "governor": {"type": ["object", "null"]},
                               "energy_j": {"type": ["number", "null"]}}},
            },
        },
        "paths": {
            "/healthz": {"get": {"summary": "Process is alive", "responses": {"200": _json({"type": "object"})}}},
            "/readyz": {"get": {"summary": "Model loaded and warmed up",
                                "responses": {"200": _json({"type": "object"}), **_errors(503)}}},
            "/api/v1/status": {"get": {"summary": "Device, model, cameras, queue, MQTT, governor",
                                       "responses": {"200": _json({"type": "object"})}}},
            "/api/v1/results": {"get": {
                "summary": "Results from the journal, newest first",
                "parameters": [
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}},
                    {"name": "camera", "in": "query", "schema": {"type": "string"}},
                    {"name": "since", "in": "query", "schema": {"type": "string", "format": "date-time"}},
                    {"name": "until", "in": "query", "schema": {"type": "string", "format": "date-time"}},
                    {"name": "before", "in": "query", "description": "journal_seq cursor from next_before",
                     "schema": {"type": "integer"}}],
                "responses": {"200": _json({"type": "object", "properties": {
                    "results": {"type": "array", "items": _RESULT},
                    "next_before": {"type": ["integer", "null"]}}}), **_errors(400)}}},
            "/api/v1/results/{id}": {"get": {
                "summary": "One result", "parameters": [{"name": "id", "in": "path", "required": True,
                                                          "schema": {"type": "string"}}],
                "responses": {"200": _json(_RESULT), **_errors(404)}}},
            "/api/v1/cameras/{name}/frame.jpg": {"get": {
                "summary": "Latest frame of a camera",
                "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "JPEG", "content": {"image/jpeg": {}}}, **_errors(404)}}},
            "/api/v1/cameras/{name}/trigger": {"post": {
                "summary": "Inspect the camera's newest frame now", "security": secured,
                "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
                "requestBody": {"required": False, "content": {"application/json": {"schema": {
                    "type": "object", "properties": {"prompt": {"type": "string"}}}}}},
                "responses": {"200": _json(_RESULT), **_errors(401, 403, 404, 409, 429, 504)}}},
            "/api/v1/infer": {"post": {
                "summary": "Inspect an uploaded image", "security": secured,
                "requestBody": {"required": True, "content": {
                    "multipart/form-data": {"schema": {"type": "object", "required": ["image"], "properties": {
                        "image": {"type": "string", "format": "binary"}, "prompt": {"type": "string"}}}},
                    "application/json": {"schema": {"type": "object", "required": ["image"], "properties": {
                        "image": {"type": "string", "contentEncoding": "base64"},
                        "prompt": {"type": "string"}}}}}},
                "responses": {"200": _json(_RESULT), **_errors(400, 401, 403, 413, 415, 429, 504)}}},
            "/api/v1/events": {"get": {"summary": "Server-sent events: `result` per new verdict",
                                       "responses": {"200": {"description": "text/event-stream"}}}},
            "/api/v1/openapi.json": {"get": {"summary": "This document",
                                             "responses": {"200": _json({"type": "object"})}}},
            "/v1/models": {"get": {"summary": "OpenAI-compatible model list",
                                   "responses": {"200": _json({"type": "object"})}}},
            "/v1/chat/completions": {"post": {
                "summary": "OpenAI-compatible chat completions with image_url parts", "security": secured,
                "requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}},
                "responses": {"200": _json({"type": "object"}), **_errors(400, 401, 403, 413, 429, 504)}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "text"}}}},
            "/": {"get": {"summary": "Status page for technicians", "responses": {"200": {"description": "HTML"}}}},
        },
    }
    from .inspection import RESULT_FIELDS, openapi_paths  # issue 17: evidence, queries, review

    doc["paths"].update(openapi_paths())
    doc["components"]["schemas"]["Result"]["properties"].update(RESULT_FIELDS)
    return doc
