"""The OpenAPI 3.1 document, generated from the routes and their pydantic models.

Each view carries its spec (`@doc`) beside its route; the document walks Flask's URL map and
pydantic's `models_json_schema`, so validation, docs and fuzzing read one source and a new route
without a spec fails a test. Why not a framework (flask-openapi3, spectree): see docs/decisions.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from flask import current_app
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from edge_runtime import __version__

F = TypeVar("F", bound=Callable[..., Any])

_ERROR_TEXT = {400: "Invalid request: `error.field` names the field", 401: "Missing or wrong token",
               403: "Remote caller without a configured token, or an access rail forbids the model or format",
               404: "Not found",
               405: "Method not allowed (see Allow)", 409: "Camera has no frame yet",
               413: "Body or image too large", 415: "Wrong content type",
               422: "A rail refused the answer: error.code names it (rail_output_<name>)",
               429: "Too many requests or event streams in flight, or the queue is full (see Retry-After)",
               503: "Not ready or degraded (see Retry-After)",
               504: "No verdict in time"}


@dataclass
class Spec:
    summary: str
    query: type[BaseModel] | None = None
    body: dict[str, type[BaseModel]] = field(default_factory=dict)
    response: type[BaseModel] | str | None = None  # a model (JSON) or a media type
    errors: tuple[int, ...] = ()
    secured: bool = False
    body_required: bool = False


def doc(summary: str, *, query: type[BaseModel] | None = None, body: dict[str, type[BaseModel]] | None = None,
        response: type[BaseModel] | str | None = None, errors: tuple[int, ...] = (),
        secured: bool = False, body_required: bool = False) -> Callable[[F], F]:
    """Attach the OpenAPI description to a view (read back from the URL map)."""

    def attach(view: F) -> F:
        setattr(view, "__openapi__", Spec(summary, query, body or {}, response, errors, secured,  # noqa: B010
                                          body_required))
        return view

    return attach


def _ref(model: type[BaseModel]) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _models(specs: list[Spec]) -> list[type[BaseModel]]:
    from edge_runtime.api.models import ErrorBody

    found: list[type[BaseModel]] = [ErrorBody]
    for s in specs:
        candidates = [s.query, s.response, *s.body.values()]
        found += [m for m in candidates if isinstance(m, type) and issubclass(m, BaseModel) and m not in found]
    return found


def _operation(spec: Spec, path_params: list[str]) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": spec.summary}
    params = [{"name": p, "in": "path", "required": True, "schema": {"type": "string", "maxLength": 128}}
              for p in path_params]
    if spec.query is not None:
        schema = spec.query.model_json_schema()
        for name, prop in schema.get("properties", {}).items():
            prop = {k: v for k, v in prop.items() if k not in ("title", "default")}
            if "anyOf" in prop:  # `int | None` is "may be left out" in a query string
                prop = {**next(a for a in prop.pop("anyOf") if a.get("type") != "null"), **prop}
            params.append({"name": name, "in": "query", "required": False, "schema": prop,
                           **({"description": prop["description"]} if "description" in prop else {})})
    if params:
        op["parameters"] = params
    if spec.body:
        op["requestBody"] = {"required": spec.body_required,
                             "content": {t: {"schema": _ref(m)} for t, m in spec.body.items()}}
    if isinstance(spec.response, str):
        ok: dict[str, Any] = {"description": "OK", "content": {spec.response: {}}}
    elif spec.response is not None:
        ok = _json(_ref(spec.response))
    else:
        ok = {"description": "OK"}
    error = {"$ref": "#/components/schemas/ErrorBody"}
    op["responses"] = {"200": ok, **{str(c): _json(error, _ERROR_TEXT[c]) for c in spec.errors}}
    if spec.secured:
        op["security"] = [{"bearer": []}]
    return op


def openapi_document() -> dict[str, Any]:
    """Walk the app's routes; every documented view becomes an operation."""
    paths: dict[str, dict[str, Any]] = {}
    specs: list[Spec] = []
    for rule in current_app.url_map.iter_rules():
        spec = getattr(current_app.view_functions[rule.endpoint], "__openapi__", None)
        if spec is None:
            continue
        path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            paths.setdefault(path, {})[method.lower()] = _operation(spec, list(rule.arguments))
        specs.append(spec)
    _, schemas = models_json_schema([(m, "validation") for m in _models(specs)],
                                    ref_template="#/components/schemas/{model}")
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "edge-runtime", "version": __version__,
                 "description": "Inspection device API. Inference and mutating endpoints (every endpoint "
                                "but health probes and the status page shell with api.auth: all) need a "
                                "Bearer token when one is configured, otherwise they answer loopback "
                                "clients only."},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
                       "schemas": schemas.get("$defs", {})},
        "paths": dict(sorted(paths.items())),
    }
    from edge_runtime.api.review import RESULT_FIELDS, openapi_paths  # issue 17: evidence, queries, review

    doc["paths"].update(openapi_paths())
    result = doc["components"]["schemas"].get("ResultModel")
    if result is not None:
        result.setdefault("properties", {}).update(RESULT_FIELDS)
    if current_app.config.get("EDGE_API_AUTH") == "all":  # every operation needs the token but the open ones
        from edge_runtime.api.auth import OPEN_ENDPOINTS

        doc["security"] = [{"bearer": []}]
        for rule in current_app.url_map.iter_rules():
            if rule.endpoint in OPEN_ENDPOINTS:
                path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
                for op in doc["paths"].get(path, {}).values():
                    op["security"] = []
    return doc
