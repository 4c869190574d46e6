"""The gate on an inspection program: the image budget it encodes frames at, and its regions.

A camera whose program has regions or tiling is never encoded whole: each region's crop is encoded
(inspector.encode_frame, through the encoder cache) and asked on its own. The gate scores those same
crops, each against its own section of the bank (one per region, fitted on that region's crops of
good parts, with its own threshold): a region's patches are compared only with good patches of that
region, and the language model gets the embeddings the gate scored, never a second encode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_runtime.config.programs import ProgramConfig
from edge_runtime.core.batch import Encoded
from edge_runtime.inference.anomaly.bank import BankMismatch, LoadedBank, read_banks, read_headers
from edge_runtime.inference.anomaly.features import GateContext, for_part
from edge_runtime.inference.anomaly.gate import AnomalyGate, FrameMismatch, GateScore
from edge_runtime.inference.regions import RegionsEncoded, RegionSpec, frame_regions

Box = tuple[int, int, int, int]


def program_budget(program: ProgramConfig | None) -> dict[str, Any] | None:
    """What a program adds to the image budget its camera's frames are encoded at: its image_tokens
    (a bank fitted at the bundle's budget has another patch grid and is refused at load)."""
    tokens = program.image_tokens if program is not None else None
    if tokens is None or not (tokens.min or tokens.max):
        return None
    return {"image_tokens": {"min": tokens.min, "max": tokens.max}}


def has_regions(program: ProgramConfig | None) -> bool:
    return program is not None and bool(program.regions or program.tiling is not None)


def program_regions(program: ProgramConfig, frame: tuple[int, int]) -> list[RegionSpec]:
    """The regions a frame of size `frame` (width, height) is cut into, as the inspector cuts it."""
    return frame_regions(program, frame[0], frame[1])


@dataclass(frozen=True)
class RegionGate:
    """One region's section of a program's bank, with the threshold its scores are judged by."""

    name: str
    box: Box
    gate: AnomalyGate
    threshold: float


def load_region_gates(path: str, context: GateContext, program: ProgramConfig, frame: tuple[int, int] | None,
                      max_bytes: int, search_threads: int = 1) -> list[AnomalyGate]:
    """Each region's gate of a program's bank, checked region by region against `context` (encoder,
    budget, crop) and the boxes the program cuts from frames of size `frame` (width, height; None:
    the size the bank was fitted on). BankError (one line) when they are not the same regions."""
    if frame is None:
        first = read_headers(Path(path))[0]
        if first.part is None:
            raise BankMismatch(f"gate bank {path}: holds whole frames; these frames are regions of a program: fit "
                               "the gate again for the camera's program (gate fit --camera NAME)")
        frame = first.part.frame
    contexts = [for_part(context, spec.name, spec.box) for spec in program_regions(program, frame)]
    banks: list[LoadedBank] = read_banks(Path(path), max_bytes, contexts)
    return [AnomalyGate(bank, ctx, search_threads) for bank, ctx in zip(banks, contexts, strict=True)]


def frame_ratios(scores: Sequence[float], thresholds: Sequence[float]) -> tuple[list[float], int]:
    """The daemon's rule for one frame: each region's score over its own threshold (a whole frame: its
    score over the bank's), and which region is the worst. The frame's ratio is the worst region's, the
    largest: under 1 the frame is gated (every region under its threshold), so one region over its
    threshold sends the frame on however clean the others are. `gate fit --labelled` and `eval --gate`
    judge a program's frames by this same function."""
    ratios = [s / t for s, t in zip(scores, thresholds, strict=True)]
    return ratios, int(np.argmax(ratios))


def score_regions(gates: Sequence[RegionGate], enc: Encoded) -> list[GateScore]:
    """Each region's score, in the order of `gates`: the crop the inspector encoded for that region,
    against that region's bank. FrameMismatch when a region has no encoding in this frame (outside it)
    or another box (tiles of a frame of another size)."""
    if not isinstance(enc, RegionsEncoded):
        raise FrameMismatch("the frame was encoded whole; the bank holds the regions of a program")
    names = [spec.name for spec, _ in enc.regions]
    if names != [g.name for g in gates]:  # a region without a section is never scored: never under a threshold
        raise FrameMismatch(f"this frame's regions are {', '.join(names)}; the bank's are "
                            f"{', '.join(g.name for g in gates)}")
    crops = {spec.name: (spec, renc) for spec, renc in enc.regions}
    out = []
    for g in gates:
        spec, renc = crops.get(g.name, (None, None))
        if spec is None or renc is None:
            raise FrameMismatch(f"region {g.name}: not in this frame's regions")
        if isinstance(renc, Exception):
            raise FrameMismatch(f"region {g.name}: not encoded ({renc})")
        if tuple(spec.box) != g.box:
            raise FrameMismatch(f"region {g.name} is {list(spec.box)} in this frame; the bank's is {list(g.box)}")
        out.append(g.gate.score(renc))
    return out
