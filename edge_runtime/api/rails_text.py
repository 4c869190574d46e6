"""The text side of the rails: regex and word searches that cannot stall the server.

Patterns are user input. Python's `re` holds the GIL for as long as a catastrophic pattern backtracks
(every thread stops, /healthz included); the `regex` engine releases it (`concurrent`) and gives up
after a time limit. Each search gets its share of the request's budget (the rules engine's
`RegexBudget`); unlike a rule, a rail whose search did not finish fails closed: the caller refuses.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import regex

if TYPE_CHECKING:  # the budget object is handed in by rails.py
    from edge_runtime.verdicts.rules import RegexBudget


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


def search(pattern: regex.Pattern[str], text: str, budget: RegexBudget) -> regex.Match[str] | None:
    """The first match, or None; `Unfinished` when the search ran out of time."""
    try:
        return pattern.search(text, timeout=_limit(budget), concurrent=True)
    except TimeoutError:
        budget.timeouts += 1
        raise Unfinished(f"the search took over its share of the regex budget ({pattern.pattern[:40]!r})") from None


def redact(pattern: regex.Pattern[str], text: str, replacement: str, budget: RegexBudget) -> str:
    """`text` with every match replaced by `replacement` (literally: no group references)."""
    try:
        return str(pattern.sub(lambda _m: replacement, text, timeout=_limit(budget), concurrent=True))
    except TimeoutError:
        budget.timeouts += 1
        raise Unfinished(f"the redaction took over its share of the regex budget ({pattern.pattern[:40]!r})") from None


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
