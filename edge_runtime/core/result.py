"""The Result of one inspection: the JSON every consumer (journal, MQTT, REST) receives."""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

STAGES = ("capture", "preprocess", "encode", "prefill", "decode", "total")


def utc_now() -> str:
    """RFC 3339 UTC timestamp with milliseconds, e.g. 2026-11-30T06:10:00.123Z."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_id() -> str:
    return uuid.uuid4().hex


@dataclass
class FrameInfo:
    seq: int
    width: int
    height: int


@dataclass
class Result:
    """One verdict. `id` is unique so at-least-once consumers can de-duplicate."""

    device: str
    camera: str
    frame: FrameInfo
    verdict: dict[str, Any]
    text: str
    model: str
    timings_ms: dict[str, float]
    prompt: str
    governor: dict[str, Any] | None = None
    energy_j: float | None = None
    evidence: dict[str, Any] | None = None  # {uri, sha256, bytes, width, height} of the kept image
    rules: list[dict[str, Any]] | None = None  # rules that fired: name, actions (and a re-ask's answer)
    review: dict[str, Any] | None = None  # state (pending/confirmed/corrected) and correction
    id: str = field(default_factory=new_id)
    ts: str = field(default_factory=utc_now)
    # Who answered: {engine: edge|remote, endpoint, model}; remote results add reason (and
    # second_opinion_of for escalations). See docs/scale-out.md.
    source: dict[str, Any] = field(default_factory=lambda: {"engine": "edge", "endpoint": None, "model": None})
    # Set when a line triggered it (docs/line-io.md): the station, the part id the PLC sent, the recipe,
    # and the station's job id (InspectionSeq) that the line acknowledges.
    station: str | None = None
    part_id: str | None = None
    recipe: str | None = None
    inspection_seq: int | None = None
    # An inspection program's regions (docs/inspection.md): name, box, verdict, text, outcome (ok, nok or
    # none) and error per region; `verdict` is the overall one. None without regions.
    regions: list[dict[str, Any]] | None = None
    # The anomaly gate's look at the frame (docs/inspection.md#the-anomaly-gate): mode, score, threshold,
    # gated, audit (and disagree on an audit). Left out of the JSON when the camera has no gate.
    gate: dict[str, Any] | None = None
    # A program's clip (docs/inspection.md): the frames the question was about, oldest first, each
    # {seq, captured_at}; `frame` is the newest. Left out of the JSON without a clip.
    clip: list[dict[str, Any]] | None = None
    # Offload's key for the frame's image while an escalation may ask about it (the request's
    # `offload_tag`, fleet/offload/escalation.py). In-process only: never in the JSON.
    offload_tag: int | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.source.get("engine") == "edge" and self.source.get("model") is None:
            self.source = {**self.source, "model": self.model}

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["offload_tag"]
        if out["gate"] is None:  # consumers of cameras without a gate see the JSON they always saw
            del out["gate"]
        if out["clip"] is None:
            del out["clip"]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Result:
        data = dict(data)
        data["frame"] = FrameInfo(**data["frame"])
        return cls(**data)
