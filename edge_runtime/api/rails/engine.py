"""The rails evaluator: one rails config compiled once, its input checks on a request and its
output checks (refuse, filter, redact, reask) on an answer."""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import regex
from referencing.exceptions import Unresolvable

from edge_runtime.api.rails import text as rails_text
from edge_runtime.api.rails.request import Answer, RailRefused, RailRequest, Rewrites, TextPart
from edge_runtime.api.rails.schema import SCHEMA_BUDGET, SchemaValidator
from edge_runtime.api.rails.text import Unfinished
from edge_runtime.config.rails import InputRail, OutputRail, RailsConfig
from edge_runtime.config.rules import Condition
from edge_runtime.verdicts.rules import RegexBudget, condition_holds, lookup


class ReaskWindow:
    """Regenerations by reask rails in the last 60 s (all requests together); survives reloads."""

    def __init__(self) -> None:
        self._times: deque[float] = deque()
        self._lock = threading.Lock()

    def take(self, per_minute: int, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        with self._lock:
            while self._times and now - self._times[0] >= 60:
                self._times.popleft()
            if len(self._times) >= per_minute:
                return False
            self._times.append(now)
            return True


Fire = Callable[[str, str, str, str], None]  # (code, action, request id, detail)


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


class Rails:
    """One rails config, compiled: patterns, word lists and schemas built once."""

    def __init__(self, cfg: RailsConfig, window: ReaskWindow, fire: Fire) -> None:
        self.cfg, self.window, self.fire = cfg, window, fire
        self.input = [(r, _pattern(r)) for r in cfg.input if r.enabled]
        self.output = [(r, _pattern(r)) for r in cfg.output if r.enabled]
        self.patterns = {r.name: p for r, p in self.output}
        self.validators = {r.name: SchemaValidator(r.json_schema) for r, _ in self.output if r.json_schema}
        # A `when` regex is searched here over the whole field (the rules engine reads 10,000 characters).
        self.conditions = {c.regex: rails_text.compile_rail(c.regex, None)
                           for r, _ in self.output for c in (r.when or []) if c.regex is not None}
        self.budget_s = cfg.regex_budget_ms / 1000
        self.searches_in = sum(1 for _, p in self.input if p is not None)
        self.searches_out = sum(1 for r, p in self.output if p is not None or r.when or r.json_schema)
        self.pixel_rails = [r for r, _ in self.input if r.max_image_pixels is not None]

    # ---- input -------------------------------------------------------------------------------------

    def _refuse(self, rail: InputRail | OutputRail | str, stage: str, status: int, reason: str, rid: str,
                field: str | None = None) -> RailRefused:
        name = rail if isinstance(rail, str) else rail.name
        code = f"rail_{stage}_{name}"
        message = rail.message if not isinstance(rail, str) and rail.message else reason
        self.fire(code, "refuse", rid, reason)
        return RailRefused(code, status, message, field, rid)

    def check_input(self, req: RailRequest) -> Rewrites:
        """The rewrites to apply, or `RailRefused` from the first rail that refuses (config order;
        each rail reads the text as the rails before it rewrote it)."""
        out = Rewrites()
        if not self.input:
            return out
        texts = [TextPart(t.field, t.role, t.text) for t in req.texts]
        if self.searches_in and sum(len(t.text) for t in texts) > self.cfg.max_scan_chars:
            raise self._refuse("scan_limit", "input", 400, f"the text is longer than the {self.cfg.max_scan_chars} "
                               "characters the rails search (rails.max_scan_chars)", req.request_id, "messages")
        budget = RegexBudget(self.budget_s, self.searches_in)
        folds: dict[str, str] = {}  # text -> its folded form, once per request
        for rail, pattern in self.input:
            mine = [t for t in texts if t.role in rail.roles]
            if rail.max_text_chars is not None:
                n = sum(len(t.text) for t in mine)
                if n > rail.max_text_chars:
                    raise self._refuse(rail, "input", 400, f"the text has {n} characters; this endpoint takes at most "
                                       f"{rail.max_text_chars} (image data is not text and is not counted)",
                                       req.request_id, "messages")
            elif rail.max_images is not None and req.images > rail.max_images:
                raise self._refuse(rail, "input", 400, f"the request has {req.images} images; this endpoint takes "
                                   f"at most {rail.max_images}", req.request_id, "messages")
            elif rail.access is not None:
                self._access(rail, req)
            elif pattern is not None:
                self._search_input(rail, pattern, mine, budget, req.request_id, out, folds)
        return out

    def _search_input(self, rail: InputRail, pattern: regex.Pattern[str], texts: list[TextPart],
                      budget: RegexBudget, rid: str, out: Rewrites, folds: dict[str, str]) -> None:
        matched = False
        for part in texts:
            try:
                hit = rails_text.search(pattern, part.text, budget)
                seen = folds.get(part.text)
                if seen is None:
                    seen = folds[part.text] = rails_text.folded(part.text)
                if hit is None and seen != part.text:
                    # What the model reads is the folded text: a zero-width space must not hide a word.
                    if len(seen) > self.cfg.max_scan_chars:
                        raise Unfinished("its folded form is longer than rails.max_scan_chars")
                    hit = rails_text.search(pattern, seen, budget)
            except Unfinished as exc:
                raise self._refuse(rail, "input", 400, f"the check of {part.field} did not finish ({exc}); the "
                                   "request is refused rather than let through unchecked", rid, part.field) from None
            if hit is None:
                continue
            if rail.action == "refuse":
                what = "a refused word" if rail.words is not None else "a refused pattern"
                raise self._refuse(rail, "input", 400, f"{part.field} contains {what}", rid, part.field)
            matched = True
            assert rail.rewrite is not None
            if rail.rewrite.replace is None:
                break  # only an instruction to add: one match is enough
            part.text = out.texts[part.field] = rail.rewrite.replace
        if matched:
            assert rail.rewrite is not None
            if rail.rewrite.system is not None:
                out.system.append(rail.rewrite.system)
            self.fire(f"rail_input_{rail.name}", "rewrite", rid, "the text matched; rewritten")

    def _access(self, rail: InputRail, req: RailRequest) -> None:
        access = rail.access
        assert access is not None
        if access.token is not None:  # this caller's rule only; constant-time, like the auth check
            if req.token is None or not hmac.compare_digest(_digest(req.token),
                                                            _digest(access.token.get_secret_value())):
                return
        if access.models is not None and req.model not in access.models:
            raise self._refuse(rail, "input", 403, f"model {req.model[:128]!r} is not allowed for this caller",
                               req.request_id, "model")
        if access.schemas is not None and req.schema not in access.schemas:
            raise self._refuse(rail, "input", 403, f"response format {req.schema[:64]!r} is not allowed for "
                               "this caller", req.request_id, "response_format")

    def check_image(self, size: tuple[int, int] | None, field: str, rid: str) -> None:
        """Pixels of one image, from its header (before any pixel is decoded)."""
        if size is None:
            return  # unreadable header: the decoder refuses it with the reason
        for rail in self.pixel_rails:
            assert rail.max_image_pixels is not None
            if size[0] * size[1] > rail.max_image_pixels:
                raise self._refuse(rail, "input", 400, f"the image is {size[0]}x{size[1]} = {size[0] * size[1]} "
                                   f"pixels; this endpoint takes at most {rail.max_image_pixels}", rid, field)

    # ---- output ------------------------------------------------------------------------------------

    def check_output(self, answer: Answer, reask: Callable[[str], Answer] | None, rid: str) -> Answer:
        """The answer to send (filtered), after at most one regeneration; or `RailRefused`."""
        if not self.output:
            return answer
        for attempt in (0, 1):
            fired = self._fired(answer, rid)
            deciding = next((r for r in fired if r.action != "filter"), None)
            if deciding is None:
                return self._filter(fired, answer, rid)
            if deciding.action == "refuse":
                raise self._refuse(deciding, "output", 422, "the answer was refused", rid)
            if attempt == 1 or reask is None:
                raise self._refuse(deciding, "output", 422, "the answer broke the rail again after one "
                                   "regeneration", rid)
            if not self.window.take(self.cfg.reasks_per_minute):
                self.fire(f"rail_output_{deciding.name}", "reask_skipped", rid, "rails.reasks_per_minute spent")
                raise self._refuse(deciding, "output", 422, "the answer broke the rail and the regeneration "
                                   "budget (rails.reasks_per_minute) is spent", rid)
            assert deciding.reask is not None
            self.fire(f"rail_output_{deciding.name}", "reask", rid, "regenerating once")
            answer = reask(deciding.reask.prompt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _fired(self, answer: Answer, rid: str) -> list[OutputRail]:
        if self.searches_out and len(answer.text) > self.cfg.max_scan_chars:
            raise self._refuse("scan_limit", "output", 422, f"the answer is longer than the {self.cfg.max_scan_chars} "
                               "characters the rails search (rails.max_scan_chars)", rid)
        budget = RegexBudget(self.budget_s, self.searches_out)
        fired = []
        for rail, pattern in self.output:
            try:
                if self._fires(rail, pattern, answer, budget):
                    fired.append(rail)
            except Unfinished as exc:
                raise self._refuse(rail, "output", 422, f"the check did not finish ({exc}); the answer is refused "
                                   "rather than sent unchecked", rid) from None
        return fired

    def _fires(self, rail: OutputRail, pattern: regex.Pattern[str] | None, answer: Answer,
               budget: RegexBudget) -> bool:
        if pattern is not None:
            if rails_text.search(pattern, answer.text, budget) is not None:
                return True
            seen = rails_text.folded(answer.text)  # `hunter\u200b2` reads as `hunter2`
            if seen == answer.text:
                return False
            if len(seen) > self.cfg.max_scan_chars:
                raise Unfinished("the answer's folded form is longer than rails.max_scan_chars")
            return rails_text.search(pattern, seen, budget) is not None
        data = answer.json(self.cfg.max_scan_chars)
        if rail.json_schema is not None:
            return data is None or not self._schema_valid(rail.name, data, budget)
        assert rail.when is not None
        if data is None and answer.text.lstrip()[:1] in ("{", "["):
            # JSON cut off (max_tokens) or broken: the client still reads its fields; fail closed.
            raise Unfinished("the answer opens as JSON but does not parse, so its fields cannot be checked")
        if not isinstance(data, dict):
            return False
        return all(self._holds(c, data, budget) for c in rail.when)

    def _holds(self, cond: Condition, data: dict[str, Any], budget: RegexBudget) -> bool:
        """The rules engine's condition, but a regex searches the whole string within the budget (a
        rule reads the first 10,000 characters and counts a timeout as no match: a rail fails closed)."""
        if cond.regex is None:
            return condition_holds(cond, data)
        value = lookup(data, cond.field)
        return isinstance(value, str) and rails_text.search(self.conditions[cond.regex], value, budget) is not None

    def _schema_valid(self, name: str, data: Any, budget: RegexBudget) -> bool:
        token = SCHEMA_BUDGET.set(budget)
        try:
            return bool(self.validators[name].is_valid(data))
        except RecursionError:  # a schema that refers to itself on the same value (`$ref: "#"`)
            raise Unfinished("the schema refers to itself without end") from None
        except Unresolvable as exc:  # the config refuses these; a refusal, never a 500, if one slips by
            raise Unfinished(f"the schema's $ref does not resolve ({str(exc)[:80]})") from None
        finally:
            SCHEMA_BUDGET.reset(token)

    def _filter(self, rails: list[OutputRail], answer: Answer, rid: str) -> Answer:
        for rail in rails:
            budget = RegexBudget(self.budget_s, 2)
            try:
                answer = self._redact(rail, answer, budget)
                still = self._fires(rail, self.patterns[rail.name], answer, budget)
            except Unfinished as exc:
                raise self._refuse(rail, "output", 422, f"the redaction did not finish ({exc})", rid) from None
            if still:
                raise self._refuse(rail, "output", 422, "the answer still breaks the rail after redaction", rid)
            self.fire(f"rail_output_{rail.name}", "filter", rid, "redacted")
        return answer

    def _redact(self, rail: OutputRail, answer: Answer, budget: RegexBudget) -> Answer:
        data = answer.json(self.cfg.max_scan_chars)
        if rail.when is not None:
            assert isinstance(data, dict)
            for cond in rail.when:
                _set(data, cond.field, rail.replacement)
            return Answer(rails_text.dumps(data), data)
        pattern = self.patterns[rail.name]
        assert pattern is not None
        if isinstance(data, (dict, list)):  # redact inside the strings: the answer stays JSON
            data = rails_text.map_strings(data, lambda s: rails_text.redact(pattern, s, rail.replacement, budget))
            return Answer(rails_text.dumps(data), data)
        return Answer(rails_text.redact(pattern, answer.text, rail.replacement, budget), None)


def _pattern(rail: InputRail | OutputRail) -> regex.Pattern[str] | None:
    if rail.regex is None and rail.words is None:
        return None
    return rails_text.compile_rail(rail.regex, rail.words)


def _set(data: dict[str, Any], path: str, value: str) -> None:
    *parents, last = path.split(".")
    holder = lookup(data, ".".join(parents)) if parents else data
    if isinstance(holder, dict) and last in holder:
        holder[last] = value
