"""The anomaly gate in the daemon: each camera's bank, the decision per frame, audits and counters.

The inspection worker hands each batch of encoded frames to `GateStep.sift` before the language model
sees them: a gated frame in `skip_ok` (score under the threshold, not picked for an audit) becomes an
OK Result here (`source.engine: gate`) and is delivered like any other; every other frame goes on,
and `annotate` puts the gate's look on its Result before it is journaled. The frame's own encoder
output is scored, so the gate costs a search, never a second encode. The banks are loaded and
checked by loading.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from jsonschema import Draft202012Validator

from edge_runtime.config import Config
from edge_runtime.core.batch import Encoded
from edge_runtime.core.bundle.manifest import Bundle
from edge_runtime.core.result import FrameInfo, Result
from edge_runtime.core.supervise import RateLimitedLog
from edge_runtime.inference.anomaly.heatmap import heat_map, overlay_heat
from edge_runtime.inference.anomaly.loading import CameraGate, load_gates
from edge_runtime.inference.anomaly.look import RATIO_BUCKETS, GateCounts, GateLook
from edge_runtime.inference.anomaly.regions import frame_ratios, score_regions
from edge_runtime.inference.regions import RegionsEncoded, judge

if TYPE_CHECKING:
    from edge_runtime.core.inspection_queue import InspectionRequest

log = logging.getLogger(__name__)

_MAX_PENDING = 4096  # looks kept for frames still with the language model (a leak guard, never reached)


class FrameSource(Protocol):
    """What the gate needs of the inspector that serves the frames."""

    device_id: str
    default_prompt: str

    @property
    def model_name(self) -> str: ...

    def encode_frame(self, camera: str, frame: np.ndarray, clip: Any = None, program_name: str | None = None
                     ) -> Encoded: ...


class GateStep:
    """The worker's gate: which cameras have one, each frame's look, and the counters."""

    def __init__(self, heat_wanted: bool = False) -> None:
        """`heat_wanted`: evidence is kept, so scores are kept for its heat map (`overlay`)."""
        self._gates: dict[str, CameraGate | None] = {}  # by camera, and by `<station>/<recipe>`
        self._counts: dict[str, GateCounts] = {}
        # id(request) -> look (None: not scored), until its Result is delivered or it fails
        self._looks: dict[int, GateLook | None] = {}
        self._scores: dict[str, GateLook] = {}  # result id -> look, for the evidence heat map
        self._lock = threading.Lock()
        self._log = RateLimitedLog(log)
        self.heat_wanted = heat_wanted

    def install(self, gates: Mapping[str, CameraGate | None]) -> None:
        """Replace the gates (start, reload); counters of cameras that keep a gate go on."""
        self._gates = dict(gates)
        for name, cam in gates.items():
            if cam is not None:
                self._counts.setdefault(name, GateCounts())

    @property
    def cameras(self) -> dict[str, CameraGate]:
        """The gates in use, by camera and by `<station>/<recipe>`."""
        return {name: cam for name, cam in self._gates.items() if cam is not None}

    def counts(self) -> dict[str, GateCounts]:
        return {name: c for name, c in self._counts.items() if self._gates.get(name) is not None}

    def gate_for(self, request: InspectionRequest) -> CameraGate | None:
        """The gate of a request: its line recipe's own when it has one, else its camera's."""
        job = request.line  # a line job's tag (lineio/service.py): its recipe may have a gate of its own
        if job is not None and f"{job.station}/{job.recipe}" in self._gates:
            return self._gates[f"{job.station}/{job.recipe}"]
        return self._gates.get(request.camera)

    def status(self) -> dict[str, Any]:
        """Per gated camera: how it is used, its decisions, and the score histogram (score / threshold,
        cumulative counts per upper bound as Prometheus keeps them)."""
        out: dict[str, Any] = {}
        for name, cam in self.cameras.items():
            c = self._counts.get(name) or GateCounts()
            running, cumulative = 0, list[list[float | str | int]]()
            bounds: list[float | str] = [*RATIO_BUCKETS, "+Inf"]  # JSON has no infinity
            for bound, n in zip(bounds, c.buckets, strict=True):
                running += n
                cumulative.append([bound, running])
            out[name] = {"mode": cam.config.mode, "threshold": cam.threshold, "bank": str(cam.gate.path),
                         "audit_every": cam.config.audit_every, "patches": cam.patches, **c.to_dict(),
                         "histogram": {"buckets": cumulative, "sum": round(c.ratio_sum, 6), "count": running}}
            if cam.regions:
                out[name]["regions"] = [{"name": r.name, "box": list(r.box), "threshold": r.threshold,
                                         "patches": r.gate.patches} for r in cam.regions]
        return out

    # ---- the worker's hooks ------------------------------------------------------------------

    def sift(self, work: list[tuple[InspectionRequest, Encoded | Exception | None]],
             inspector: FrameSource, governor: dict[str, Any] | None,
             deliver: Callable[[InspectionRequest, Result], Result],
             failed: Callable[[InspectionRequest, Exception], None],
             answer: Callable[[InspectionRequest, Result], None] | None = None
             ) -> list[tuple[InspectionRequest, Encoded | Exception | None]]:
        """Look at each camera frame with a gate; answer the gated ones of skip_ok here. Returns the
        work that still goes to the language model (frames not encoded ahead come back encoded).
        `answer`: where a gated frame's OK Result goes to be delivered (the worker's delivery thread);
        without it the OK is delivered here (`deliver`, then the request's future, or `failed`).

        The worker calls it on its gate thread right after stage 1's encode (a gated frame is then answered
        while stage 1 encodes the next one and stage 2 generates) and again in stage 2, which passes on
        the frames the gate looked at."""
        if not self._gates:
            return work
        rest = []
        for request, encoded in work:
            cam = self.gate_for(request)
            with self._lock:
                seen = id(request) in self._looks
            if cam is None or request.job is not None or request.chat is not None or request.image is None \
                    or isinstance(encoded, Exception) or seen:
                rest.append((request, encoded))
                continue
            if encoded is None:  # not encoded ahead (overlap off, or a reload meanwhile): encode once, here
                try:
                    encoded = inspector.encode_frame(request.camera, request.image, request.clip, request.program)
                except Exception as exc:  # noqa: BLE001 - reported by the worker like any encoder failure
                    rest.append((request, exc))
                    continue
            look = self._look(cam, request, encoded, inspector.default_prompt)
            if look is None or not look.gated or look.audit or cam.config.mode != "skip_ok":
                self._keep(request, look)
                if look is not None and look.answered and isinstance(encoded, RegionsEncoded):
                    # skip_ok: only the regions over their threshold are asked; the others take the OK verdict
                    # In place: the worker's stage 1 hands this same object on (each frame's own, never cached).
                    encoded.answered = {k: dict(cam.verdict) for k, (spec, _) in enumerate(encoded.regions)
                                        if spec.name in look.answered}
                rest.append((request, encoded))
                continue
            ok = self._ok_result(look, request, encoded, governor, inspector)
            if answer is not None:
                answer(request, ok)
                continue
            try:
                result = deliver(request, ok)
            except Exception as exc:  # noqa: BLE001 - e.g. a full disk: that caller hears it
                failed(request, exc)
            else:
                request.future.set_result(result)
        return rest

    def annotate(self, request: InspectionRequest, result: Result) -> Result:
        """Put the gate's look on a Result the language model made (before it is journaled)."""
        with self._lock:
            look = self._looks.pop(id(request), None)
        if look is None or result.camera != look.camera.camera:
            return result
        result.gate = look.field()
        if look.audit:
            if look.vouched:  # a frame sent on for some regions: only a NOK where the gate said OK disagrees
                nok = any(isinstance(r, dict) and r.get("name") in look.vouched and r.get("outcome") == "nok"
                          for r in result.regions or [])
            else:
                nok = bool(result.verdict.get(look.camera.nok_field))
            result.gate["disagree"] = nok
            if nok:
                counts = self._counts[look.camera.key]
                counts.disagreements += 1
                counts.last_disagreement = result.id
                said = (f"would have answered {', '.join(look.vouched)} OK" if look.vouched else
                        f"scored {look.score.score:.4g} (under {look.threshold:.4g})")
                log.warning("gate: camera %s: audit %s: the gate %s and the language model called the part NOK",
                            look.camera.camera, result.id, said)
        self._remember(result.id, look)
        return result

    def forget(self, request: InspectionRequest) -> None:
        """The frame failed: its look goes with it."""
        with self._lock:
            self._looks.pop(id(request), None)

    def overlay(self, image: np.ndarray, result: Result) -> np.ndarray:
        """The evidence image with the gate's heat map over the part it scored: the whole image when it
        is the frame the gate saw, the camera's crop (`roi`) of it when it is the full frame."""
        with self._lock:
            look = self._scores.pop(result.id, None)
        if look is None:
            return image
        cam, kept = look.camera, look.score
        if look.regions:
            return _overlay_regions(image, look, (result.frame.width, result.frame.height))
        lay, roi = kept.layout, cam.gate.context.region
        heat = heat_map(kept)
        if image.shape[:2] == (lay.height, lay.width):
            return overlay_heat(image, heat, cam.threshold)
        if roi is not None and (roi[2], roi[3]) == (lay.width, lay.height) \
                and image.shape[0] >= roi[1] + roi[3] and image.shape[1] >= roi[0] + roi[2]:
            x, y, w, h = roi
            out = image.copy()
            out[y:y + h, x:x + w] = overlay_heat(image[y:y + h, x:x + w], heat, cam.threshold)
            return out
        return image  # not a frame the gate saw

    # ---- internals ---------------------------------------------------------------------------

    def _look(self, cam: CameraGate, request: InspectionRequest, encoded: Encoded,
              default_prompt: str) -> GateLook | None:
        counts = self._counts.setdefault(cam.key, GateCounts())
        if bool(cam.regions) != isinstance(encoded, RegionsEncoded):
            # A reload changed the program between the encode and here: this frame is not the bank's kind.
            counts.errors += 1
            return None
        try:
            # A NaN/inf embedding would score as garbage (faiss) and a non-finite score is not JSON.
            crops = [e for _, e in encoded.regions if not isinstance(e, Exception)] \
                if isinstance(encoded, RegionsEncoded) else [encoded]
            if not all(np.isfinite(e.embeds).all() for e in crops):
                raise ValueError("the encoder's output is not all finite numbers")
            scores = score_regions(cam.regions, encoded) if cam.regions else [cam.gate.score(encoded)]
            if not all(math.isfinite(sc.score) for sc in scores):
                raise ValueError(f"a score ({', '.join(str(sc.score) for sc in scores)}) is not a finite number")
        except Exception as exc:  # noqa: BLE001 - a frame the gate cannot judge goes to the language model
            counts.errors += 1
            self._log.log(logging.ERROR, "gate: camera %s: frame %d not scored, sent to the language model: %s",
                          cam.camera, request.seq, exc)
            return None
        limits = [g.threshold for g in cam.regions] if cam.regions else [cam.threshold]
        ratios, worst = frame_ratios([sc.score for sc in scores], limits)
        score, ratio = scores[worst], ratios[worst]
        gated = ratio < 1  # every region (or the frame) under its threshold
        # Who may take the gate's OK: the request's own schema (a recipe's), else a region's own; and only
        # the question the gate stands for (its camera's or recipe's prompt, or a region's own), never a
        # client's own prompt (a trigger's): the OK says "like the good parts", not an answer to that.
        asked = (request.prompt or default_prompt) == (cam.prompt or default_prompt)
        fits = [self._fits(cam, request.schema, spec.schema) and (asked or bool(spec.prompt))
                for spec, _ in encoded.regions] \
            if isinstance(encoded, RegionsEncoded) else [self._fits(cam, request.schema, None) and asked]
        unfit = gated and not all(fits)  # the model answers (counted as an audit)
        audit = False
        answered: list[str] = []
        vouched: list[str] = []  # an audit of a frame sent on: the regions the gate would have answered
        with self._lock:  # the gate thread and stage 2 may look (stage 2 at frames stage 1 did not encode)
            counts.buckets[next((i for i, b in enumerate(RATIO_BUCKETS) if ratio <= b), len(RATIO_BUCKETS))] += 1
            counts.ratio_sum += ratio
            if not gated:
                counts.passed += 1
                if cam.config.mode == "skip_ok" and cam.regions:
                    answered = [g.name for g, r, ok in zip(cam.regions, ratios, fits, strict=True) if r < 1 and ok]
                    if answered:  # the gate vouches for these regions: 1 in N such frames is asked whole
                        counts.answering += 1
                        if counts.answering % cam.config.audit_every == 0:
                            vouched, answered, audit = answered, [], True
                            counts.audits += 1
                    counts.regions_answered += len(answered)
            else:
                counts.gated += 1
                if cam.config.mode == "skip_ok":
                    audit = unfit or counts.gated % cam.config.audit_every == 0
                    counts.audits += audit
                    counts.skipped += not audit
        return GateLook(cam, score, gated, audit, scores if cam.regions else [], answered, worst, vouched)

    @staticmethod
    def _fits(cam: CameraGate, schema: dict[str, Any] | None, own: dict[str, Any] | None) -> bool:
        """Whether the gate's OK verdict is valid where it would stand (the bundle's schema is checked at load)."""
        return all(Draft202012Validator(s).is_valid(cam.verdict) for s in (schema, own) if s is not None)

    def _keep(self, request: InspectionRequest, look: GateLook | None) -> None:
        with self._lock:
            if len(self._looks) >= _MAX_PENDING:
                self._looks.clear()
            self._looks[id(request)] = look

    def _remember(self, result_id: str, look: GateLook) -> None:
        if not (self.heat_wanted and look.camera.config.heat_map):
            return
        with self._lock:
            if len(self._scores) >= _MAX_PENDING:
                self._scores.clear()
            self._scores[result_id] = look

    def _ok_result(self, look: GateLook, request: InspectionRequest, enc: Encoded,
                   governor: dict[str, Any] | None, inspector: FrameSource) -> Result:
        cam, model = look.camera, inspector.model_name
        total = request.capture_ms + enc.preprocess_ms + enc.encode_ms + look.score.search_ms
        timings = {"capture": round(request.capture_ms, 3), "preprocess": round(enc.preprocess_ms, 3),
                   "encode": round(enc.encode_ms, 3), "prefill": 0.0, "decode": 0.0, "total": round(total, 3)}
        result = Result(device=inspector.device_id, camera=request.camera,
                        frame=FrameInfo(request.seq, enc.width, enc.height), verdict=dict(cam.verdict),
                        text=json.dumps(cam.verdict, separators=(",", ":")), model=model, timings_ms=timings,
                        prompt=request.prompt or inspector.default_prompt, governor=governor,
                        source={"engine": "gate", "endpoint": None, "model": model,
                                "score": round(look.score.score, 6)})
        if look.regions and isinstance(enc, RegionsEncoded):  # each region answered OK by the gate
            text = json.dumps(cam.verdict, separators=(",", ":"))
            result.regions = [dataclasses.replace(judge(spec, dict(cam.verdict), text, cam.nok_field),
                                                  engine="gate").to_dict() for spec, _ in enc.regions]
        result.gate = look.field()
        self._remember(result.id, look)
        return result


def _overlay_regions(image: np.ndarray, look: GateLook, frame: tuple[int, int]) -> np.ndarray:
    """Each region's heat map over its box: in the frame the gate saw, or in the full frame the camera's
    `roi` was cut from (evidence.full_frame)."""
    roi = look.camera.gate.context.region
    if image.shape[:2] == (frame[1], frame[0]):
        ox, oy = 0, 0
    elif roi is not None and (roi[2], roi[3]) == frame and image.shape[0] >= roi[1] + roi[3] \
            and image.shape[1] >= roi[0] + roi[2]:
        ox, oy = roi[0], roi[1]
    else:
        return image  # not a frame the gate saw
    out = image.copy()
    for g, sc in zip(look.camera.regions, look.regions, strict=True):
        x, y, w, h = g.box
        if (sc.layout.width, sc.layout.height) != (w, h):
            continue
        out[oy + y:oy + y + h, ox + x:ox + x + w] = overlay_heat(out[oy + y:oy + y + h, ox + x:ox + x + w],
                                                                 heat_map(sc), g.threshold)
    return out


def gates_for(bundle: Bundle, config: Config) -> dict[str, CameraGate | None]:
    """`load_gates` for a whole config: each camera's NOK field from its program (default `defect`), and
    the line recipes' own gates."""
    nok = {c.name: config.programs[c.program].nok_field for c in config.cameras
           if c.program is not None and c.program in config.programs}
    recipes = [(st.name, name, st.camera, r.gate) for st in config.line_io.stations
               for name, r in st.recipes.items() if r.gate is not None]
    programs = {c.name: config.programs[c.program] for c in config.cameras
                if c.program is not None and c.program in config.programs}
    for st in config.line_io.stations:  # a recipe's frames are encoded with its own program, else its station's
        for name, r in st.recipes.items():
            named = r.program or st.program
            if r.gate is not None and named is not None and named in config.programs:
                programs[f"{st.name}/{name}"] = config.programs[named]
                nok[f"{st.name}/{name}"] = config.programs[named].nok_field
    gates = load_gates(bundle, config.model, config.cameras, nok, recipes, programs)
    for st in config.line_io.stations:  # a recipe's own gate stands for the recipe's question
        for name, r in st.recipes.items():
            found = gates.get(f"{st.name}/{name}")
            if found is not None and r.prompt:
                gates[f"{st.name}/{name}"] = dataclasses.replace(found, prompt=r.prompt)
    return gates


def any_gate(config: Config) -> bool:
    return any(c.gate is not None and c.gate.mode != "off" for c in config.cameras) or any(
        r.gate is not None for st in config.line_io.stations for r in st.recipes.values())
