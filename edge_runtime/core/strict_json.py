"""JSON from outside (HTTP bodies, MQTT commands, a central server's answers), read strictly.

Python's `json.loads` accepts what our consumers and the journal cannot keep: a key twice in one
object (the second value slips past whatever checked the first), `NaN`/`Infinity`, numbers that
overflow to infinity, and lone surrogates (`"\\ud800"`, valid JSON but not encodable as UTF-8, so
SQLite and every UTF-8 consumer fail on it later). One reader refuses them all, with the dotted path
of the offending field, so the HTTP API, the MQTT commands and offload answer alike.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


class StrictJsonError(ValueError):
    """Why a document was refused; `field` is the dotted path of the offending key or value, or ""
    when the document as a whole is at fault. `malformed`: not JSON at all (syntax, nesting), as
    opposed to JSON that must not be kept (duplicate key, NaN, overflow, lone surrogate)."""

    def __init__(self, message: str, field: str = "", malformed: bool = False) -> None:
        super().__init__(message)
        self.field = field
        self.malformed = malformed


def loads(data: str | bytes, max_depth: int | None = None, max_values: int | None = None) -> Any:
    """Parse `data` (already bounded in size by the caller) or raise StrictJsonError. `max_values` bounds
    the values it may hold, counted before any is built: the checks below walk every value in Python
    (~2 us each), so 8 MB of `[{},{},...]` took 4.6 s and 100 MB that the allocator kept."""
    if max_values is not None and too_many_values(data, max_values):
        raise StrictJsonError(f"the JSON holds more than {max_values} commas, arrays and objects",
                              malformed=True)
    try:
        value = json.loads(data, object_pairs_hook=_unique_keys, parse_constant=_no_constant,
                           parse_float=_finite_float)
    except StrictJsonError:
        raise
    except RecursionError:  # the C decoder guards its recursion: a deep document ends here, not in a crash
        raise StrictJsonError(f"the JSON is nested deeper than {max_depth or 'the parser allows'} levels",
                              malformed=True) from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise StrictJsonError(f"not valid JSON ({str(exc)[:200]})", malformed=True) from None
    if max_depth is not None and json_depth(value) > max_depth:
        raise StrictJsonError(f"the JSON is nested deeper than {max_depth} levels", malformed=True)
    fault = first_fault(value)
    if fault is not None:
        raise StrictJsonError(*fault)
    return value


def has_surrogate(text: str) -> bool:
    """Searched in place, with no encoded copy of the text."""
    return _SURROGATE.search(text) is not None


def shown(text: str, limit: int = 80) -> str:
    """A key or path as it may appear in an error message (lone surrogates escaped, bounded)."""
    return text.encode("utf-8", "backslashreplace").decode()[:limit]


def too_many_values(data: str | bytes, limit: int) -> bool:
    """Whether `data` has more than `limit` commas, `[` and `{` (each value but the first of a container
    follows a comma), those inside strings too: counted in C (cutting the strings out with a regex held
    the GIL ~1 us a string, 0.7 s for a flood of empty ones), so the caller's limit leaves room for text."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    return sum(raw.count(c) for c in (b",", b"[", b"{")) > limit


def json_depth(value: Any) -> int:
    """Nesting depth, walked without recursion."""
    depth, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        depth = max(depth, level)
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return depth


def first_fault(value: Any) -> tuple[str, str] | None:
    """(why, dotted path) of the first key twice in one object or string holding a lone surrogate ("" for
    the document itself), else None. Walked without recursion."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if has_surrogate(item):
                return _SURROGATE_WHY, path
        elif isinstance(item, dict):
            if isinstance(item, _Repeated):
                key = f"{path}.{item.repeated}" if path else item.repeated
                return "the key appears more than once in one JSON object", shown(key)
            for key, sub in item.items():
                where = f"{path}.{key}" if path else str(key)
                if has_surrogate(key):
                    return _SURROGATE_WHY, shown(where)
                stack.append((sub, where))
        elif isinstance(item, list):
            stack.extend((sub, f"{path}.{i}" if path else str(i)) for i, sub in enumerate(item))
    return None


_SURROGATE_WHY = "contains a lone surrogate (\\ud800-\\udfff); text must be valid UTF-8"


class _Repeated(dict[str, Any]):
    """An object in which `repeated` appeared twice: the parser's hook cannot know where the object is,
    so it is marked and named with its path by the walk after the parse."""

    repeated: str


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in pairs:
        if key in out:
            marked = _Repeated(out)
            marked.repeated = key
            return marked
        out[key] = item
    return out


def _no_constant(name: str) -> Any:
    raise StrictJsonError(f"not valid JSON ({name} is not a JSON number)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise StrictJsonError(f"number out of range ({text[:40]})")
    return value
