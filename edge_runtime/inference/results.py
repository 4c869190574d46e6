"""Generations -> a camera's `Result`: its verdict, the stage timings, and for a program with regions
the frame's verdict made of its regions' (regions.py's rule), as their sequences finish."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

from edge_runtime.core.batch import BatchJob, Encoded
from edge_runtime.core.errors import InferenceError, InputError, QuestionRefused
from edge_runtime.core.result import FrameInfo, Result
from edge_runtime.inference.clips import clip_stamps
from edge_runtime.inference.llm.feed import Generation
from edge_runtime.inference.regions import RegionOutcome, RegionsEncoded, judge, overall
from edge_runtime.inference.schemas import SchemaRefused, VerdictRules


def frame_result(device_id: str, model: str, enc: Encoded, verdict: dict[str, Any], gen: Generation, question: str,
                 camera: str, seq: int, capture_ms: float, governor: dict[str, Any] | None, t0: float) -> Result:
    """One frame's (or clip's) Result from its one generation (started at `t0`)."""
    total = capture_ms + enc.preprocess_ms + enc.encode_ms + (time.perf_counter() - t0) * 1000
    timings = {
        "capture": round(capture_ms, 3), "preprocess": round(enc.preprocess_ms, 3),
        "encode": round(enc.encode_ms, 3), "prefill": round(gen.prefill_ms, 3),
        "decode": round(gen.decode_ms, 3), "total": round(total, 3),
    }
    return Result(device=device_id, camera=camera, frame=FrameInfo(seq, enc.width, enc.height),
                  verdict=verdict, text=gen.text, model=model, timings_ms=timings,
                  prompt=question, governor=governor, clip=clip_stamps(enc))


def refused(exc: InputError) -> InferenceError:
    """`exc` as that frame's own failure in a batch, still an InputError with its field and status."""
    return exc if isinstance(exc, InferenceError) else QuestionRefused(str(exc), exc.field, exc.status, exc)


class RegionsCollected:
    """A frame's regions as their sequences finish (serve's `done` hears of them one by one)."""

    def __init__(self, enc: RegionsEncoded, nok_field: str,
                 parse: Callable[[Generation, VerdictRules | None], dict[str, Any]]) -> None:
        self.enc, self.nok_field, self.parse = enc, nok_field, parse
        self.outcomes: list[RegionOutcome | None] = [None] * len(enc.regions)
        self.gens: list[Generation] = []
        self.pending = 0
        # The first region asked with the frame's own question that could not be (too long for the context):
        # the frame is refused with it, as a frame without regions is (not "regions without a verdict", nor
        # a verdict made of the regions that have their own question).
        self.refused: InputError | None = None

    def failed(self, k: int, exc: Exception) -> None:
        """Region `k` could not be asked (its crop refused, its question too long, ...)."""
        spec = self.enc.regions[k][0]
        self.outcomes[k] = judge(spec, None, "", self.nok_field, str(exc))
        if isinstance(exc, InputError) and not isinstance(exc, SchemaRefused) and spec.prompt is None \
                and self.refused is None:
            self.refused = exc

    def answered(self, k: int, verdict: dict[str, Any]) -> None:
        """Region `k` answered by the anomaly gate (skip_ok's OK): it is not asked."""
        spec = self.enc.regions[k][0]
        self.outcomes[k] = dataclasses.replace(
            judge(spec, verdict, json.dumps(verdict, separators=(",", ":")), self.nok_field), engine="gate")

    def add(self, k: int, rules: VerdictRules | None, outcome: Generation | Exception) -> None:
        spec = self.enc.regions[k][0]
        self.pending -= 1
        if isinstance(outcome, Exception):
            self.failed(k, outcome)
            return
        self.gens.append(outcome)
        try:
            verdict = self.parse(outcome, rules)
        except InferenceError as exc:
            self.outcomes[k] = judge(spec, None, outcome.text, self.nok_field, str(exc))
            return
        self.outcomes[k] = judge(spec, verdict, outcome.text, self.nok_field)


def regions_result(device_id: str, model: str, w: BatchJob, collected: RegionsCollected, prompt: str,
                   t0: float) -> Result | Exception:
    """A frame's Result from its regions' outcomes (or why it has none: no region NOK, one without a verdict)."""
    enc, gens = collected.enc, collected.gens
    outcomes = [o for o in collected.outcomes if o is not None]
    if collected.refused is not None:  # the frame's question cannot be asked: refused whole, as without regions
        return refused(collected.refused)
    try:
        best = overall(outcomes)
    except InferenceError as exc:
        return exc
    total = w.capture_ms + enc.preprocess_ms + enc.encode_ms + (time.perf_counter() - t0) * 1000
    # The regions run together (one batch, prefilled together): the frame's prefill and decode are its
    # longest region's, not their sum (which counted the shared time once per region), nor the longest
    # prefill and the longest decode of two regions (together more than the frame took).
    longest = max(gens, key=lambda g: g.prefill_ms + g.decode_ms, default=None)
    timings = {
        "capture": round(w.capture_ms, 3), "preprocess": round(enc.preprocess_ms, 3),
        "encode": round(enc.encode_ms, 3), "prefill": round(longest.prefill_ms if longest else 0.0, 3),
        "decode": round(longest.decode_ms if longest else 0.0, 3), "total": round(total, 3),
    }
    assert best.verdict is not None
    return Result(device=device_id, camera=w.camera, frame=FrameInfo(w.seq, enc.width, enc.height),
                  verdict=best.verdict, text=best.text, model=model, timings_ms=timings,
                  prompt=prompt, governor=w.governor, regions=[o.to_dict() for o in outcomes])
