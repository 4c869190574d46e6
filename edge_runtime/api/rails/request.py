"""What the rails read and what they answer: the request's text parts, the rewrites input rails
make, an answer as output rails see it, and the refusal (an OpenAI-style error naming the rail)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import regex
from flask import jsonify

from edge_runtime.core import strict_json

MAX_ANSWER_DEPTH = 32
_UNPARSED: Any = object()


class RailRefused(Exception):
    """A rail refused the request or its answer: an OpenAI-style error whose `code` names the rail."""

    def __init__(self, code: str, status: int, message: str, field: str | None, request_id: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.status, self.field, self.request_id = code, status, field, request_id


def refusal_response(exc: RailRefused) -> Any:
    """The error body OpenAI clients read (`error.code` is the rail), plus our `field`."""
    error: dict[str, Any] = {"message": str(exc), "type": "rail_refused", "code": exc.code, "param": exc.field}
    if exc.field is not None:
        error["field"] = exc.field
    response = jsonify(error=error)
    response.status_code = exc.status
    response.headers["X-Request-Id"] = exc.request_id
    return response


@dataclass
class TextPart:
    field: str  # where the client put it (`messages.0.content.1.text`, `prompt`)
    role: str
    text: str


@dataclass
class RailRequest:
    """What the input rails read of a request (text parts only: image data is never text)."""

    request_id: str
    texts: list[TextPart]
    images: int
    model: str  # the model asked for (the served one when the request names none)
    schema: str  # the response format: a json_schema's name, `text`, `json_object`; REST infer `verdict`
    token: str | None  # the Bearer token presented, if any


@dataclass
class Rewrites:
    texts: dict[str, str] = field(default_factory=dict)  # field -> the text that replaces it
    system: list[str] = field(default_factory=list)  # instructions to add


@dataclass
class Answer:
    """An answer as output rails see it: its text and its JSON (parsed on first need)."""

    text: str
    data: Any = _UNPARSED

    def json(self, limit: int) -> Any:
        if self.data is _UNPARSED:
            self.data = None
            if len(self.text) <= limit and self.text.lstrip()[:1] in ("{", "["):
                try:
                    self.data = strict_json.loads(self.text, MAX_ANSWER_DEPTH)
                except strict_json.StrictJsonError:
                    pass  # not JSON: conditions never hold, a schema rail fires
        return self.data


_REQUEST_ID = regex.compile(r"[A-Za-z0-9._:-]{1,64}")


def request_id(header: str | None, prefix: str) -> str:
    """The client's X-Request-Id when it is a plain token, else a new one."""
    if header and _REQUEST_ID.fullmatch(header):
        return header
    return f"{prefix}-{uuid.uuid4().hex}"
