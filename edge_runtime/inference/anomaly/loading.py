"""Each gated camera's bank (and each line recipe's) loaded and checked against the frames it will score.

A bank fitted on another encoder, budget or crop, a threshold that is not a finite number over 0, or
a gated verdict that is not an OK valid against the bundle's schema is refused at start and reload
(GateLoadError, one line naming the camera or recipe), before any frame is scored. A program with
regions or tiling gets each region's section of the bank (regions.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator

from edge_runtime.config import CameraConfig, ModelConfig
from edge_runtime.config.gate import GateConfig
from edge_runtime.config.programs import ProgramConfig
from edge_runtime.core.bundle.manifest import Bundle
from edge_runtime.core.errors import EdgeRuntimeError
from edge_runtime.inference.anomaly.bank import BankError
from edge_runtime.inference.anomaly.features import gate_context
from edge_runtime.inference.anomaly.gate import AnomalyGate
from edge_runtime.inference.anomaly.regions import RegionGate, has_regions, load_region_gates, program_budget

log = logging.getLogger(__name__)


class GateLoadError(EdgeRuntimeError):
    """A camera's gate cannot be used: one line naming the camera and why."""


@dataclass(frozen=True)
class CameraGate:
    """One camera's (or one line recipe's) loaded bank with how it is used."""

    camera: str
    config: GateConfig
    gate: AnomalyGate
    threshold: float
    verdict: dict[str, Any]  # what a gated frame is answered with (valid against the bundle's schema)
    nok_field: str
    name: str = ""  # what its counters are shown under: the camera, or `<station>/<recipe>`
    # A program with regions or tiling: each region's section of the bank (then `gate` is the first's).
    regions: tuple[RegionGate, ...] = ()
    # The question its OK answers: the camera's configured prompt (a recipe's own gate: the recipe's, else
    # the camera's); None: the model's default. A frame asked anything else goes to the language model.
    prompt: str | None = None

    @property
    def key(self) -> str:
        return self.name or self.camera

    @property
    def patches(self) -> int:
        return sum(r.gate.patches for r in self.regions) if self.regions else self.gate.patches


def ok_verdict(cfg: GateConfig, schema: Mapping[str, Any], nok_field: str) -> dict[str, Any]:
    """The verdict of a gated frame: the configured one, or the schema's NOK field false and each
    string field whose enum holds "none" set to it."""
    if cfg.verdict is not None:
        return dict(cfg.verdict)
    out: dict[str, Any] = {nok_field: False}
    for name, prop in (schema.get("properties") or {}).items():
        if name != nok_field and isinstance(prop, dict) and "none" in (prop.get("enum") or []):
            out[name] = "none"
    return out


def load_gates(bundle: Bundle, settings: ModelConfig, cameras: Sequence[CameraConfig],
               nok_fields: Mapping[str, str] | None = None,
               recipes: Sequence[tuple[str, str, str, GateConfig]] = (),
               programs: Mapping[str, ProgramConfig] | None = None) -> dict[str, CameraGate | None]:
    """Each gated camera's bank (and each line recipe's: (station, recipe, camera, gate)), checked
    against the encoder, budget and crop its frames get. A recipe's gate replaces its camera's for that
    recipe's frames (None: `mode: off`, not gated). Raises GateLoadError (one line) for the first that
    cannot be used. `programs`: each camera's inspection program, by camera name, and a recipe's own (a
    recipe's or its station's program) by `<station>/<recipe>`."""
    schema = bundle.manifest.verdict_schema
    validator = Draft202012Validator(schema)
    out: dict[str, CameraGate | None] = {}
    by_name = {c.name: c for c in cameras}

    def load(why: str, cam: CameraConfig, cfg: GateConfig, name: str = "") -> CameraGate:
        assert cfg.bank is not None  # GateConfig refuses a mode without a bank
        program = (programs or {}).get(name, (programs or {}).get(cam.name)) if name else (programs or {}).get(cam.name)
        if program is not None and program.clip is not None:
            raise GateLoadError(f"{why}: camera {cam.name}'s program asks about a clip of {program.clip.frames} "
                                "frames; the gate scores single frames and their regions: remove the gate or the clip")
        context = gate_context(bundle, settings, region=cam.roi, budget=program_budget(program))
        regions: list[AnomalyGate] = []
        try:
            if program is not None and has_regions(program):
                # Its frames are encoded as crops, never whole: each region against its own bank section.
                regions = load_region_gates(cfg.bank, context, program, _frame_size(cam),
                                            int(cfg.max_bank_mb * 2**20), cfg.search_threads)
                gate = regions[0]
            else:
                gate = AnomalyGate.load(cfg.bank, context, int(cfg.max_bank_mb * 2**20), cfg.search_threads)
        except BankError as exc:
            raise GateLoadError(f"{why}: {exc}") from None
        except OSError as exc:
            raise GateLoadError(f"{why}: cannot read the bank {cfg.bank}: {exc.strerror or exc}") from None
        threshold = _threshold(why, cfg, gate)
        parts = tuple(RegionGate(g.context.part[0], g.context.part[1], g, _threshold(why, cfg, g))
                      for g in regions if g.context.part is not None)
        nok_field = (nok_fields or {}).get(name, (nok_fields or {}).get(cam.name, "defect")) if name \
            else (nok_fields or {}).get(cam.name, "defect")
        verdict = ok_verdict(cfg, schema, nok_field)
        errors = sorted(validator.iter_errors(verdict), key=str)
        if cfg.mode == "skip_ok" and errors:
            raise GateLoadError(f"{why}.verdict: the gated OK verdict {verdict} does not match the bundle's "
                                f"schema ({errors[0].message}); set gate.verdict to a whole OK verdict")
        # OK as the audits and regions judge it (bool of the NOK field): present and exactly false.
        if cfg.mode == "skip_ok" and verdict.get(nok_field, True) is not False:
            raise GateLoadError(f"{why}.verdict: the gated verdict must be OK, with {nok_field!r} (the camera's "
                                f"NOK field) false; it is {verdict.get(nok_field, '(missing)')!r}")
        if cfg.mode == "skip_ok" and cfg.threshold is None and not gate.header.threshold.supported:
            log.warning("%s: skip_ok on the bank's threshold %.4g, which makes no escape claim (%s); "
                        "run annotate until labelled data supports it", why, threshold,
                        gate.header.threshold.method)
        return CameraGate(cam.name, cfg, gate, float(threshold), verdict, nok_field, name, parts, cam.prompt)

    for cam in cameras:
        if cam.gate is not None and cam.gate.mode != "off" and cam.enabled:
            out[cam.name] = load(f"cameras.{cam.name}.gate", cam, cam.gate)
    for station, recipe, camera, cfg in recipes:
        key, bound = f"{station}/{recipe}", by_name.get(camera)
        if bound is not None and bound.enabled:
            out[key] = None if cfg.mode == "off" else load(
                f"line_io.stations.{station}.recipes.{recipe}.gate", bound, cfg, key)
    return out


def _threshold(why: str, cfg: GateConfig, gate: AnomalyGate) -> float:
    """The configured threshold, else the bank's (a region's section has its own); GateLoadError unless
    it is a finite number over 0."""
    threshold = cfg.threshold if cfg.threshold is not None else gate.threshold
    if threshold is None:
        raise GateLoadError(f"{why}: the bank {cfg.bank} holds no threshold; set gate.threshold or fit "
                            "with --labelled DIR --max-escape RATE")
    if not (math.isfinite(threshold) and threshold > 0):  # JSON has no infinity; inf would gate every frame
        raise GateLoadError(f"{why}.threshold: {threshold} (the bank's {cfg.bank}) is not a finite number "
                            "over 0; set gate.threshold")
    return float(threshold)


def _frame_size(cam: CameraConfig) -> tuple[int, int] | None:
    """The size of the camera's frames where the config fixes it (tiles are cut from it)."""
    if cam.roi is not None:
        return cam.roi[2], cam.roi[3]
    return (cam.width, cam.height) if cam.width and cam.height else None
