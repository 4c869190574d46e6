"""The `rails:` section: input and output rails of `/v1/chat/completions` and `POST /api/v1/infer`.

A rail checks one thing and names itself in every refusal (`rail_input_<name>`, `rail_output_<name>`).
Regexes are user input: at most 200 characters, compiled here at load, and run by the `regex` engine
with a time limit (`api/rails/text.py`); the evaluator is `api/rails/engine.py`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from edge_runtime.config.api import sendable_token
from edge_runtime.config.base import Section, check_regex
from edge_runtime.config.rules import Condition

RAIL_NAME = r"^[a-z0-9][a-z0-9_]{0,47}$"  # part of the error code and the metric label
RESERVED = frozenset({"scan_limit"})  # the rail a text too long to scan is refused by
MAX_WORDS = 256
MAX_SCHEMA_CHARS = 16_384
MIN_SHARE_MS = 10  # regex time each searching rail gets at least (regex_budget_ms / rails)
Role = Literal["system", "developer", "user", "assistant"]
ROLES: tuple[Role, ...] = ("system", "developer", "user", "assistant")


def _words(words: list[str] | None) -> list[str] | None:
    if words is not None and any(not w.strip() for w in words):
        raise ValueError("a word may not be empty or only spaces")
    return words


def _safe_patterns(schema: Any) -> None:
    """A schema's `pattern`s are regexes from the config too: bounded, compiled by the `regex` engine
    (the rail runs them with a time limit); `patternProperties` would run on Python's `re`: refused."""
    if isinstance(schema, list):
        for item in schema:
            _safe_patterns(item)
    elif isinstance(schema, dict):
        if "patternProperties" in schema:
            raise ValueError("patternProperties is not supported in a rail's schema (use properties)")
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            if len(pattern) > 200:
                raise ValueError("a pattern in the schema is over 200 characters")
            check_regex(pattern)
        for item in schema.values():
            _safe_patterns(item)


def _refs(schema: Any) -> list[str]:
    if isinstance(schema, list):
        return [r for item in schema for r in _refs(item)]
    if isinstance(schema, dict):
        own = [schema["$ref"]] if isinstance(schema.get("$ref"), str) else []
        return own + [r for item in schema.values() for r in _refs(item)]
    return []


def _local_refs(schema: dict[str, Any]) -> None:
    """Every `$ref` points inside the schema and resolves (else each answer's check would raise:
    nothing is fetched, so a remote or dangling one can never pass)."""
    from referencing import Registry
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012

    resolver = Registry().with_resource("", DRAFT202012.create_resource(schema)).resolver()
    for ref in _refs(schema):
        if not ref.startswith("#"):
            raise ValueError(f"$ref {ref[:80]!r} points outside the schema; only local refs (#/...) are supported")
        try:
            resolver.lookup(ref)
        except Unresolvable:
            raise ValueError(f"$ref {ref[:80]!r} does not resolve inside the schema") from None


Word = Annotated[str, Field(min_length=1, max_length=64)]


class Rewrite(Section):
    """What a `rewrite` input rail does when it matches: replace the matching text part, add a system
    instruction, or both."""

    replace: str | None = Field(None, max_length=2000, description="The text part that matched becomes this.")
    system: str | None = Field(None, min_length=1, max_length=2000,
                               description="Add this system instruction to the request.")

    @model_validator(mode="after")
    def _something(self) -> Rewrite:
        if self.replace is None and self.system is None:
            raise ValueError("give replace, system or both")
        return self


class Access(Section):
    """Which models and response formats a caller may use. With `token`, the rail applies only to
    requests bearing that token; without, to every request."""

    token: SecretStr | None = Field(None, description="Applies to requests with this Bearer token only: "
                                    "latin-1 text without control characters or leading/trailing "
                                    "whitespace, at most 4096 characters, as api.token.")
    models: list[str] | None = Field(None, max_length=32, description="Model names the request may ask for "
                                     "(`model`; a request without one asks for the served model).")
    schemas: list[str] | None = Field(None, max_length=64, description="Response formats it may use: a "
                                      "json_schema by its name, `text`, `json_object`; REST infer is `verdict`.")

    @field_validator("token")
    @classmethod
    def _sendable(cls, token: SecretStr | None) -> SecretStr | None:
        # Unlike api.token's '' (no token), an empty one here would match no request: the rail would restrict nobody.
        if token is not None and not token.get_secret_value():
            raise ValueError("is empty, so it would match no request; leave token out to apply the rail to every "
                             "request")
        return sendable_token(token)

    @model_validator(mode="after")
    def _something(self) -> Access:
        if self.models is None and self.schemas is None:
            raise ValueError("give models, schemas or both")
        return self


class _Rail(Section):
    """What input and output rails share: a name, exactly one of CHECKS, the regex and word checks."""

    CHECKS: ClassVar[tuple[str, ...]] = ()

    name: str = Field(pattern=RAIL_NAME, description="In the error code (`rail_input_<name>`, `rail_output_"
                      "<name>`) and metrics.")
    enabled: bool = Field(True, description="false keeps the rail but never checks it.")

    @field_validator("regex", check_fields=False)
    @classmethod
    def _regex_compiles(cls, v: str | None) -> str | None:
        return check_regex(v)

    @field_validator("words", check_fields=False)
    @classmethod
    def _no_blank_word(cls, v: list[str] | None) -> list[str] | None:
        return _words(v)

    def _the_one_check(self) -> str:
        checks = [k for k in self.CHECKS if getattr(self, k) is not None]
        if len(checks) != 1:
            raise ValueError(f"give exactly one of {', '.join(self.CHECKS)}")
        if self.name in RESERVED:
            raise ValueError(f"the rail name {self.name!r} is reserved")
        return checks[0]

    @property
    def kind(self) -> str:
        return next(k for k in self.CHECKS if getattr(self, k) is not None)


class InputRail(_Rail):
    """One check on the request before anything is decoded or generated; exactly one check."""

    CHECKS = ("max_text_chars", "max_images", "max_image_pixels", "regex", "words", "access")

    max_text_chars: int | None = Field(None, ge=0, le=262_144, description="Characters of text parts of the "
                                       "roles below, all messages together (image data never counts).")
    max_images: int | None = Field(None, ge=0, le=16, description="Images in the request.")
    max_image_pixels: int | None = Field(None, ge=1, le=100_000_000,
                                         description="Pixels of each image (from its header, before decoding).")
    regex: str | None = Field(None, max_length=200, description="Refuse/rewrite text this regex searches.")
    words: list[Word] | None = Field(None, max_length=MAX_WORDS, description="Refuse/rewrite text with any of "
                                    "these words (whole words, case-insensitive).")
    access: Access | None = Field(None, description="Models and response formats a caller may use.")
    roles: list[Role] = Field(list(ROLES), min_length=1, description="Whose text the text checks read.")
    action: Literal["refuse", "rewrite"] = Field("refuse", description="refuse: a 4xx naming the rail; "
                                                 "rewrite: see `rewrite` (regex and words only).")
    rewrite: Rewrite | None = Field(None, description="What `action: rewrite` does.")
    message: str | None = Field(None, max_length=300, description="Said to the client in the refusal.")

    @model_validator(mode="after")
    def _one_check(self) -> InputRail:
        check = self._the_one_check()
        if self.action == "rewrite":
            if check not in ("regex", "words"):
                raise ValueError("action rewrite works with regex and words only (a length, image or access "
                                 "rail can only refuse)")
            if self.rewrite is None:
                raise ValueError("action rewrite needs rewrite: {replace: ..., system: ...}")
        elif self.rewrite is not None:
            raise ValueError("rewrite is set but action is refuse")
        return self


class Reask(Section):
    prompt: str = Field(min_length=1, max_length=2000, description="Added as a system instruction to the one "
                        "regeneration (e.g. 'Answer again without naming people').")


class OutputRail(_Rail):
    """One check on the answer before it is sent; exactly one check."""

    CHECKS = ("regex", "words", "when", "json_schema")

    regex: str | None = Field(None, max_length=200, description="Fires when this regex searches the answer.")
    words: list[Word] | None = Field(None, max_length=MAX_WORDS, description="Fires on any of these words "
                                    "(whole words, case-insensitive).")
    when: list[Condition] | None = Field(None, min_length=1, max_length=32, description="Fires when all these "
                                         "conditions (as in `rules:`) hold on the answer's JSON (REST infer: "
                                         "the verdict); an answer that is not a JSON object never fires it.")
    json_schema: dict[str, Any] | None = Field(None, description="Fires when the answer is not JSON valid "
                                               "against this schema.")
    action: Literal["refuse", "filter", "reask"] = Field("refuse", description="refuse: an error naming the "
                                                         "rail; filter: redact (regex, words, when); reask: "
                                                         "regenerate once with `reask.prompt`.")
    replacement: str = Field("[redacted]", max_length=64, description="What `filter` puts in place of a match "
                             "(or of the value of a `when` condition's field).")
    reask: Reask | None = Field(None, description="What `action: reask` asks.")
    message: str | None = Field(None, max_length=300, description="Said to the client in the refusal.")

    @field_validator("json_schema")
    @classmethod
    def _valid_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            from jsonschema import Draft202012Validator
            from jsonschema.exceptions import SchemaError

            try:
                Draft202012Validator.check_schema(v)
            except SchemaError as exc:
                raise ValueError(f"not a valid JSON schema: {exc.message}") from None
            if len(json.dumps(v)) > MAX_SCHEMA_CHARS:
                raise ValueError(f"the schema is over {MAX_SCHEMA_CHARS} characters of JSON")
            _safe_patterns(v)
            _local_refs(v)
        return v

    @model_validator(mode="after")
    def _one_check(self) -> OutputRail:
        check = self._the_one_check()
        if self.action == "filter" and check == "json_schema":
            raise ValueError("a json_schema rail cannot filter (there is no match to redact): refuse or reask")
        if (self.action == "reask") != (self.reask is not None):
            raise ValueError("action reask needs reask: {prompt: ...}, and reask needs action reask")
        return self


def _unique(rails: list[Any], where: str) -> None:
    names = [r.name for r in rails]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"{where} rail names must be unique; repeated: {', '.join(dupes)}")


class RailsConfig(Section):
    """Input and output rails of the OpenAI-compatible endpoint and REST infer (docs/api.md)."""

    input: list[InputRail] = Field(default_factory=list, max_length=64, description="Checked in order on "
                                   "every request; the first that refuses answers.")
    output: list[OutputRail] = Field(default_factory=list, max_length=64, description="Checked on every answer.")
    max_scan_chars: int = Field(65_536, ge=1024, le=262_144, description="Longest text (all parts together) "
                                "or answer the regex and word rails search; a longer one is refused "
                                "(rail_input_scan_limit / rail_output_scan_limit), never searched in part.")
    regex_budget_ms: float = Field(250, ge=5, le=2000, description="Regex time of one request over the input "
                                   "rails (and again over the output rails); a search that runs out of its share "
                                   "refuses (the check did not finish). Shares under 10 ms would refuse "
                                   "harmless text on a busy CPU, so the budget must give each rail 10 ms.")
    reasks_per_minute: int = Field(6, ge=0, le=600, description="Regenerations by reask rails in any 60 s; "
                                   "beyond it, a firing reask rail refuses instead (counted).")

    @model_validator(mode="after")
    def _unique_names(self) -> RailsConfig:
        _unique(self.input, "input")
        _unique(self.output, "output")
        return self

    @model_validator(mode="after")
    def _budget_shares(self) -> RailsConfig:
        # A search preempted for a few ms on a loaded 2-core device must not look like a runaway pattern.
        searches = max(sum(1 for r in self.input if r.enabled and r.kind in ("regex", "words")),
                       sum(1 for r in self.output if r.enabled and r.kind in ("regex", "words", "when")))
        if searches and self.regex_budget_ms / searches < MIN_SHARE_MS:
            raise ValueError(f"regex_budget_ms: {self.regex_budget_ms} ms shared by {searches} searching rails "
                             f"leaves each under {MIN_SHARE_MS} ms; raise it to at least {searches * MIN_SHARE_MS}")
        return self
