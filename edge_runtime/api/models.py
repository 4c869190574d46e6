"""Request and response models of the HTTP API: validation, the OpenAPI document and fuzzing read these.

Every bound a client can hit is here (lengths, counts, ranges), so a bad request is refused with a
4xx naming its field before it costs a decode, a tokenization or a grammar.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationInfo, field_validator, model_validator

from edge_runtime.core.result_filter import TIMESTAMP

MAX_PROMPT_CHARS = 4000  # REST and trigger prompts: an inspection question, not a document
MAX_MESSAGES = 64
MAX_PARTS = 512  # one message's parts: room for api.max_images_per_request (<= 256) images and text
MAX_TEXT_CHARS = 262_144  # absolute cap on one OpenAI request's text; the context bound is usually lower
CHARS_PER_TOKEN = 8  # generous: real text averages ~4, so a text over ctx*8 chars cannot fit
INT64_MAX = 2**63 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- shared responses ---------------------------------------------------------------------------

class ErrorDetail(BaseModel):
    message: str
    type: str
    code: int | str = Field(description="The HTTP status, or the rail's name (rail_input_<name>) for a rail's refusal")
    field: str | None = Field(None, description="The request field at fault (dotted path), when one is")
    param: str | None = Field(None, description="Same as `field`, as OpenAI clients read it")


class ErrorBody(BaseModel):
    error: ErrorDetail


class Alive(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    ready: bool
    state: Literal["ok", "starting", "degraded"]
    reasons: list[str] = Field(description="Why the device is degraded (e.g. `disk full`)")
    model: str | None = None


class FrameInfoModel(BaseModel):
    seq: int
    width: int
    height: int


class ResultModel(BaseModel):
    """One verdict, as journaled and published over MQTT."""

    model_config = ConfigDict(extra="allow")
    id: str
    device: str
    camera: str
    ts: str = Field(description="RFC 3339 UTC")
    frame: FrameInfoModel
    verdict: dict[str, Any] = Field(description="Valid against the bundle's schema")
    text: str
    model: str
    timings_ms: dict[str, float]
    prompt: str | None = None
    governor: dict[str, Any] | None = None
    energy_j: float | None = None
    journal_seq: int | None = Field(None, description="Journal order; the `before` cursor")
    regions: list[dict[str, Any]] | None = Field(
        None, description="An inspection program's verdict per region, in the program's order: name, box [x, y, "
        "w, h], verdict, text, outcome (ok, nok or none: no verdict), error; `verdict` is the overall one")


class ResultsPage(BaseModel):
    results: list[ResultModel]
    next_before: int | None = Field(description="Pass as `before` for the next (older) page")
    last_event_id: int = Field(description="Pass to /api/v1/events as `last_event_id` to miss nothing")


class AnyObject(BaseModel):
    model_config = ConfigDict(extra="allow")


# ---- REST requests --------------------------------------------------------------------------------

class ResultsQuery(_Strict):
    model_config = ConfigDict(extra="ignore")  # cache-busting parameters are harmless
    limit: int = Field(50, ge=1, le=1000)
    before: int | None = Field(None, ge=0, le=INT64_MAX, description="journal_seq cursor from next_before")
    camera: str | None = Field(None, max_length=64)
    since: str | None = Field(None, min_length=1, max_length=40, pattern=TIMESTAMP, description="RFC 3339 timestamp")
    until: str | None = Field(None, min_length=1, max_length=40, pattern=TIMESTAMP, description="RFC 3339 timestamp")


class EventsQuery(_Strict):
    model_config = ConfigDict(extra="ignore")
    last_event_id: int | None = Field(None, ge=0, le=INT64_MAX,
                                      description="Replay events after this id (also read from Last-Event-ID)")


class InferJson(_Strict):
    image: str = Field(min_length=1, description="Base64 (or a data: URL) of a JPEG/PNG/BMP/TIFF/WebP image",
                       json_schema_extra={"contentEncoding": "base64"})
    prompt: str | None = Field(None, max_length=MAX_PROMPT_CHARS)


class InferMultipart(_Strict):
    image: bytes = Field(json_schema_extra={"format": "binary"})
    prompt: str | None = Field(None, max_length=MAX_PROMPT_CHARS)


class TriggerBody(_Strict):
    prompt: str | None = Field(None, max_length=MAX_PROMPT_CHARS)


# ---- OpenAI-compatible ---------------------------------------------------------------------------

class ImageUrl(BaseModel):
    url: str = Field(min_length=1)
    detail: str | None = Field(None, max_length=16)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "image_url"]
    text: str | None = Field(None, max_length=MAX_TEXT_CHARS)
    image_url: ImageUrl | None = None


def _content_kind(value: Any) -> str | None:
    # Chosen by the value's type, so a bad part is reported at its own field, not as pydantic's
    # str|list fallback ("messages.0.content: Input should be a valid string").
    if isinstance(value, str):
        return "str"
    return "list" if isinstance(value, list) else None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant"]
    content: Annotated[
        Annotated[Annotated[str, Field(max_length=MAX_TEXT_CHARS)], Tag("str")]
        | Annotated[Annotated[list[ContentPart], Field(min_length=1, max_length=MAX_PARTS)], Tag("list")],
        Discriminator(_content_kind, custom_error_type="content",
                      custom_error_message="must be a string or a list of text/image_url parts")] | None = None


class JsonSchemaSpec(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str = Field("response", max_length=64)
    description: str | None = Field(None, max_length=1024)
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = Field(None, strict=True)


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_when_needed(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("json_schema is required when type is json_schema")
        return self


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # vLLM clients send many optional knobs
    model: str | None = Field(None, max_length=128)
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    # strict=True: a JSON integer, number or boolean, never pydantic's lax reading ("stream": "yes" as true,
    # "max_tokens": true as 1, "8" or 8.0 as 8): a client's mistake is a 400 naming the field, not another request.
    max_tokens: int | None = Field(None, strict=True, ge=1, le=131072, description="At most the model's context")
    max_completion_tokens: int | None = Field(None, strict=True, ge=1, le=131072)
    temperature: float = Field(0.0, strict=True, ge=0, le=2)
    top_p: float = Field(1.0, strict=True, gt=0, le=1)
    seed: int | None = Field(None, strict=True, ge=-1, le=2**32 - 1, description="-1 or empty: a random seed")
    stop: (Annotated[str, Field(min_length=1, max_length=64)]
           | Annotated[list[Annotated[str, Field(min_length=1, max_length=64)]], Field(max_length=4)] | None) = None
    stream: bool = Field(False, strict=True)
    n: int = Field(1, strict=True, ge=1, le=1)
    response_format: ResponseFormat | None = None
    # Features this server does not have. Other knobs are taken and ignored (vLLM clients send many), but
    # these ask for a different answer (a tool call, banned tokens, log-probabilities): ignored, the client
    # got plain text and no word that its request was not honoured. Their "off" values pass.
    tools: Any = Field(None, description="Not supported: only null or [] (no tool calling).")
    functions: Any = Field(None, description="Not supported: only null or [] (no function calling).")
    tool_choice: Any = Field(None, description="Only null, \"none\" or \"auto\" (there are no tools).")
    function_call: Any = Field(None, description="Only null, \"none\" or \"auto\" (there are no functions).")
    logit_bias: Any = Field(None, description="Not supported: only null or {}.")
    logprobs: Any = Field(None, description="Not supported: only null or false.")
    top_logprobs: Any = Field(None, description="Not supported: only null or 0.")

    @field_validator("tools", "functions", "logit_bias", "logprobs", "top_logprobs", "tool_choice", "function_call")
    @classmethod
    def _not_asked(cls, v: Any, info: ValidationInfo) -> Any:
        off = (None, "none", "auto") if info.field_name in ("tool_choice", "function_call") else (None, False, 0)
        if v in off or v == [] or v == {}:
            return None
        raise ValueError(f"{info.field_name} is not supported by this server (no tool calling, logit bias or "
                         "log-probabilities); leave it out")


class ModelCard(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]
