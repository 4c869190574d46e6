"""The one query over results and their reviews, and how it is checked (api, verdicts, evaluation)."""

from __future__ import annotations

import re
from dataclasses import dataclass

STATES = ("pending", "confirmed", "corrected")
TIMESTAMP = r"^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:\d{2})?)?$"  # RFC 3339, or a prefix
_TS = re.compile(TIMESTAMP)


class ReviewError(ValueError):
    """A review or query parameter is wrong; `field` names it."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass
class ResultFilter:
    """A query over results and their reviews (`/api/v1/inspections`, exports); `check` bounds it."""

    camera: str | None = None
    defect: bool | None = None
    category: str | None = None
    since: str | None = None
    until: str | None = None
    review: str | None = None          # pending | confirmed | corrected | reviewed | none
    below: float | None = None         # confidence below (the low-confidence part of the queue)
    before: int | None = None          # cursor: journal seq, newest first
    after: int | None = None           # only rows newer than this seq (live polling)
    limit: int = 50
    defect_field: str = "defect"

    def check(self) -> ResultFilter:
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None and not _TS.match(value):
                raise ReviewError(f"{name} must be an RFC 3339 time, e.g. 2026-11-30T06:00:00Z", name)
        if self.review is not None and self.review not in (*STATES, "reviewed", "none"):
            raise ReviewError("review must be pending, confirmed, corrected, reviewed or none", "review")
        if not 1 <= self.limit <= 1000:
            raise ReviewError("limit must be between 1 and 1000", "limit")
        for name in ("before", "after"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < 2**63:
                raise ReviewError(f"{name} must be a cursor from a previous page", name)
        if self.camera is not None and len(self.camera) > 64:
            raise ReviewError("camera is at most 64 characters", "camera")
        if self.category is not None and len(self.category) > 200:
            raise ReviewError("category is at most 200 characters", "category")
        return self
