"""The text side of the rails: regex and word searches that cannot stall the server.

Patterns are user input. Python's `re` holds the GIL for as long as a catastrophic pattern backtracks
(every thread stops, /healthz included); the `regex` engine releases it (`concurrent`) and gives up
after a time limit. Each search gets its share of the request's budget (the rules engine's
`RegexBudget`), holding the GIL for at most QUICK_S of it; unlike a rule, a rail whose search did not
finish fails closed: the caller refuses.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import regex

if TYPE_CHECKING:  # the budget object is handed in by engine.py
    from edge_runtime.verdicts.rules import RegexBudget


T = TypeVar("T")
QUICK_S = 0.002  # how long a search may hold the GIL before it goes on without it


class Unfinished(Exception):
    """A search ran out of its share of the request's regex budget."""


def compile_rail(pattern: str | None, words: list[str] | None) -> regex.Pattern[str]:
    """A rail's regex, or its word list as one case-insensitive whole-word alternation (longest
    first, so `bolt` does not hide `bolts`; a word that starts or ends with a symbol still works)."""
    if pattern is not None:
        return regex.compile(pattern)
    assert words is not None
    alternation = "|".join(regex.escape(w.strip()) for w in sorted(set(words), key=len, reverse=True))
    return regex.compile(rf"(?<!\w)(?:{alternation})(?!\w)", regex.IGNORECASE)


def _limit(budget: RegexBudget) -> float:
    limit = budget.timeout()
    if limit is None:
        raise Unfinished("the request's regex budget was spent")
    return limit


def _bounded(run: Callable[[float, bool], T], budget: RegexBudget, what: str) -> T:
    """`run(timeout, concurrent)` within the search's share: first briefly with the GIL held (a
    harmless pattern ends in microseconds, and releasing the GIL per search cost ~1 ms a request in
    handoffs), then, if it is still going, without the GIL for the rest of its share."""
    limit = _limit(budget)
    try:
        return run(min(QUICK_S, limit), False)
    except TimeoutError:
        if limit <= QUICK_S:
            budget.timeouts += 1
            raise Unfinished(f"the {what} took over its share of the regex budget") from None
    try:
        return run(limit - QUICK_S, True)
    except TimeoutError:
        budget.timeouts += 1
        raise Unfinished(f"the {what} took over its share of the regex budget") from None


def folded(text: str) -> str:
    """The text as a reader sees it: NFKC (fullwidth `ｓａｂｏｔａｇｅ` is `sabotage`) without format
    characters (zero-width joiners, soft hyphens: `sab\u200botage` reads as `sabotage`)."""
    if text.isascii():
        return text
    return "".join(c for c in unicodedata.normalize("NFKC", text) if unicodedata.category(c) != "Cf")


def search(pattern: regex.Pattern[str], text: str, budget: RegexBudget) -> regex.Match[str] | None:
    """The first match, or None; `Unfinished` when the search ran out of time."""
    return _bounded(lambda t, c: pattern.search(text, timeout=t, concurrent=c), budget,
                    f"search ({pattern.pattern[:40]!r})")


def redact(pattern: regex.Pattern[str], text: str, replacement: str, budget: RegexBudget) -> str:
    """`text` with every match replaced by `replacement` (literally: no group references)."""
    return _bounded(lambda t, c: str(pattern.sub(lambda _m: replacement, text, timeout=t, concurrent=c)), budget,
                    f"redaction ({pattern.pattern[:40]!r})")


def map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    """A JSON value with `fn` applied to every string in it (keys stay), so redacting a JSON answer
    keeps it JSON."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, list):
        return [map_strings(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: map_strings(v, fn) for k, v in value.items()}
    return value


def dumps(value: Any) -> str:
    """A JSON answer as text again (compact, non-ASCII kept as the model wrote it)."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
