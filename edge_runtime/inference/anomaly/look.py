"""What the gate saw of one frame (`GateLook`, carried from `sift` to the frame's Result) and what it
decided per camera since start (`GateCounts`, with the score histogram)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edge_runtime.inference.anomaly.gate import GateScore
from edge_runtime.inference.anomaly.loading import CameraGate

# Score histogram buckets, as score / threshold: one histogram reads the same for every camera's bank.
RATIO_BUCKETS = (0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0)


@dataclass
class GateCounts:
    """One camera's decisions since start: `gated` scored under the threshold (`skipped` of them
    answered without the language model, `audits` sent to it anyway), `passed` at or over it (with regions,
    `audits` also counts frames sent on whose regions under their threshold were asked all the same)."""

    gated: int = 0
    passed: int = 0
    skipped: int = 0
    audits: int = 0
    disagreements: int = 0  # audits the language model called NOK
    errors: int = 0  # frames the gate could not score (another size, a failed search): sent on
    regions_answered: int = 0  # skip_ok: regions under their threshold answered OK in frames sent on
    answering: int = 0  # skip_ok: frames sent on with regions the gate would answer (1 in audit_every: audits)
    buckets: list[int] = field(default_factory=lambda: [0] * (len(RATIO_BUCKETS) + 1))
    ratio_sum: float = 0.0  # of score / threshold, the histogram's sum
    last_disagreement: str | None = None  # the result id

    def to_dict(self) -> dict[str, Any]:
        return {"gated": self.gated, "passed": self.passed, "skipped": self.skipped, "audits": self.audits,
                "disagreements": self.disagreements, "errors": self.errors,
                "regions_answered": self.regions_answered, "last_disagreement": self.last_disagreement}


@dataclass
class GateLook:
    """The gate's look at one frame, carried from `sift` to the frame's Result. A frame of a program's
    regions: `score` is its worst region's (by score / threshold), `regions` each region's score."""

    camera: CameraGate
    score: GateScore
    gated: bool
    audit: bool
    regions: list[GateScore] = field(default_factory=list)  # in the order of camera.regions
    answered: list[str] = field(default_factory=list)  # regions answered by the gate (skip_ok), not asked
    worst: int = 0  # the index in `regions` of `score`
    vouched: list[str] = field(default_factory=list)  # an audit of a frame sent on: the regions the gate called OK

    @property
    def threshold(self) -> float:
        """The threshold `score` is judged by (its region's, for a program's regions)."""
        if not self.regions:
            return self.camera.threshold
        return self.camera.regions[self.worst].threshold

    def field(self) -> dict[str, Any]:
        box = self.score.worst_box()
        search_ms = sum(r.search_ms for r in self.regions) if self.regions else self.score.search_ms
        out: dict[str, Any] = {"mode": self.camera.config.mode, "score": round(self.score.score, 6),
                               "threshold": self.threshold, "gated": self.gated, "audit": self.audit,
                               "search_ms": round(search_ms, 3), "worst_box": list(box) if box is not None else None}
        if self.regions:  # the worst patch's box in the frame, and each region's look
            worst = self.camera.regions[self.worst]
            out["worst_box"] = None if box is None else list(_in_frame(box, worst.box))
            out["regions"] = [{"name": g.name, "box": list(g.box), "score": round(r.score, 6),
                               "threshold": g.threshold, "gated": r.score < g.threshold,
                               "answered": g.name in self.answered}
                              for g, r in zip(self.camera.regions, self.regions, strict=True)]
        return out


def _in_frame(box: tuple[float, float, float, float], region: tuple[int, int, int, int]) -> tuple[float, ...]:
    """A patch box of a region's crop in the frame's pixels."""
    return (box[0] + region[0], box[1] + region[1], box[2] + region[0], box[3] + region[1])
