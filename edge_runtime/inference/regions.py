"""Regions and tiling of an inspection program: which crops of a frame are asked, and how their
verdicts make the frame's.

Each region is encoded as its own crop (through the encoder cache, the frame hashed once) and asked as
a sequence of the frame's batch. The overall verdict follows the program's rule, `nok_if_any_nok`:
NOK when any region is NOK (the first NOK region's verdict), OK only when every region has a verdict
and none is NOK; a region without a verdict (its crop refused, its answer invalid, the NOK field
missing or neither true nor false) never makes the frame OK.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from edge_runtime.config.programs import ProgramConfig
from edge_runtime.core.batch import Encoded
from edge_runtime.core.errors import InferenceError
from edge_runtime.inference.encoder_cache import Box


@dataclass(frozen=True)
class RegionSpec:
    name: str
    box: Box
    prompt: str | None = None
    schema: dict[str, Any] | None = None


@dataclass
class RegionsEncoded(Encoded):
    """A frame of a camera whose program has regions: each region's encoding (or why it has none)."""

    regions: list[tuple[RegionSpec, Encoded | Exception]] = field(default_factory=list)
    # Regions the anomaly gate answered OK (skip_ok), by index: not asked, their verdict this one.
    answered: dict[int, dict[str, Any]] = field(default_factory=dict)


def frame_regions(cfg: ProgramConfig, width: int, height: int) -> list[RegionSpec]:
    """The named regions, then the tiles row by row (each grown by `overlap` of its size into its
    neighbours, clipped to the frame)."""
    out = [RegionSpec(r.name, r.box, r.prompt, r.verdict_schema) for r in cfg.regions]
    if cfg.tiling is not None:
        rows, cols, overlap = cfg.tiling.rows, cfg.tiling.cols, cfg.tiling.overlap
        tw, th = width / cols, height / rows
        for r in range(rows):
            for c in range(cols):
                x0 = max(0, math.floor(c * tw - overlap * tw))
                y0 = max(0, math.floor(r * th - overlap * th))
                x1 = min(width, math.ceil((c + 1) * tw + overlap * tw))
                y1 = min(height, math.ceil((r + 1) * th + overlap * th))
                out.append(RegionSpec(f"tile_r{r + 1}_c{c + 1}", (x0, y0, max(1, x1 - x0), max(1, y1 - y0))))
    return out


@dataclass
class RegionOutcome:
    spec: RegionSpec
    verdict: dict[str, Any] | None
    text: str
    nok: bool | None  # None: no verdict, or the NOK field missing
    error: str | None = None
    engine: str | None = None  # "gate": answered by the anomaly gate, not the language model

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.spec.name, "box": list(self.spec.box), "verdict": self.verdict, "text": self.text,
                "outcome": "nok" if self.nok else "ok" if self.nok is False else "none", "error": self.error,
                **({"engine": self.engine} if self.engine else {})}


def judge(spec: RegionSpec, verdict: dict[str, Any] | None, text: str, nok_field: str,
          error: str | None = None) -> RegionOutcome:
    if verdict is None or nok_field not in verdict:
        why = error or f"the verdict has no {nok_field!r} field"
        return RegionOutcome(spec, verdict, text, None, why)
    value = verdict[nok_field]
    if not isinstance(value, bool):  # e.g. null where the schema allows it: says nothing, never a default OK
        return RegionOutcome(spec, verdict, text, None, f"the verdict's {nok_field!r} is {value!r}, not true or false")
    return RegionOutcome(spec, verdict, text, value)


def overall(outcomes: list[RegionOutcome]) -> RegionOutcome:
    """The region whose verdict is the frame's: the first NOK one, else (all OK) the first. InferenceError
    when no region is NOK and one has no verdict: that frame is never a default OK."""
    for o in outcomes:
        if o.nok:
            return o
    missing = [o for o in outcomes if o.nok is None]
    if missing or not outcomes:
        names = ", ".join(f"{o.spec.name} ({o.error})" for o in missing[:4]) or "none asked"
        raise InferenceError(f"regions without a verdict and none NOK, so the frame is not OK: {names}")
    return outcomes[0]
