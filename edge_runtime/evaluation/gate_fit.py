"""`edge-runtime gate fit`: a bank from good parts' images, a held-out check, a threshold.

The good images come from a folder or from the journal (results technicians reviewed as OK, with
their kept evidence). Everything is bounded before it costs: the folder is listed by name only (no
stat, no decode) up to `MAX_LISTED` entries, `--max-images` of them are chosen evenly over the sorted
names, each is read through `core/images.py` (bytes and declared pixels checked first), and all of
them are read once and their sizes checked before the model loads.

One frame size per bank: the encoder stretches every frame to its input, so a frame of another size
or shape puts the part at another scale, and its patches would be judged against the wrong good
patches. An image of another size is refused (one line naming it), not resized. With `--camera`, the
camera's `roi` is cut from each image as capture cuts it (an image already of the crop's size is
taken as cut).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edge_runtime.config import CameraConfig
from edge_runtime.config.schema import Config
from edge_runtime.core.batch import Encoded
from edge_runtime.core.errors import EdgeRuntimeError, ImageError
from edge_runtime.core.images import read_image_file
from edge_runtime.evaluation.dataset import IMAGE_SUFFIXES, Sample
from edge_runtime.evaluation.runner import Progress
from edge_runtime.inference.anomaly.bank import BankPart, BankThreshold, LoadedBank, write_banks
from edge_runtime.inference.anomaly.features import GateContext, PatchFeatures, for_part, gate_context, patch_features
from edge_runtime.inference.anomaly.fit import (
    DEFAULT_MAX_PATCHES,
    DEFAULT_POSITION_WEIGHT,
    FitResult,
    bank_header,
    fit_bank,
)
from edge_runtime.inference.anomaly.gate import AnomalyGate
from edge_runtime.inference.anomaly.regions import frame_ratios, has_regions, program_budget
from edge_runtime.inference.anomaly.search import PatchIndex
from edge_runtime.inference.regions import RegionsEncoded

log = logging.getLogger(__name__)
MAX_LISTED = 200_000  # folder entries looked at; a folder of millions costs no more than this
MAX_IMAGES = 5_000
MIN_IMAGES = 3  # two to fit (the typical distance compares halves) and one held out


@dataclass
class FitOptions:
    """What `edge-runtime gate fit` was asked (cli/gate.py says what each means)."""

    images: Path | None
    out: Path
    model: str | None = None
    camera: str | None = None
    from_journal: bool = False
    max_images: int = 500
    max_patches: int = DEFAULT_MAX_PATCHES
    position_weight: float = DEFAULT_POSITION_WEIGHT
    holdout: float = 0.2
    seed: int = 0
    labelled: Path | None = None
    max_escape: float | None = None
    defect: str | None = None
    progress: bool = True


@dataclass
class FitReport:
    """What was made and what it showed; `notes` are the lines a user must read."""

    out: Path
    header: Any
    held_out: dict[str, Any]
    labelled: dict[str, Any] | None
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    headers: list[Any] = field(default_factory=list)  # every section's (one per region of a program)


def list_images(folder: Path, max_images: int) -> tuple[list[Path], int, bool]:
    """Up to `max_images` image files of `folder`, evenly spread over the sorted names; also how many
    were found and whether the listing stopped at MAX_LISTED entries. Names only: nothing is opened."""
    if not folder.is_dir():
        raise EdgeRuntimeError(f"{folder}: no such folder of good images")
    names: list[str] = []
    stopped = False
    try:
        with os.scandir(folder) as it:
            for seen, entry in enumerate(it):
                if seen >= MAX_LISTED:
                    stopped = True
                    break
                if not entry.name.startswith(".") and Path(entry.name).suffix.lower() in IMAGE_SUFFIXES:
                    names.append(entry.name)
    except OSError as exc:
        raise EdgeRuntimeError(f"{folder}: cannot be listed ({exc.strerror or exc})") from None
    if not names:
        raise EdgeRuntimeError(f"{folder}: no image file in it ({', '.join(sorted(IMAGE_SUFFIXES))})")
    names.sort()
    found = len(names)
    if found > max_images:
        picks = np.linspace(0, found - 1, max_images).round().astype(int)
        names = [names[i] for i in sorted(set(picks.tolist()))]
    return [folder / n for n in names], found, stopped


def cut(frame: np.ndarray, roi: tuple[int, int, int, int] | None, path: Path | str) -> np.ndarray:
    """The camera's crop of `frame`, as capture cuts it; an image already the crop's size is taken as cut."""
    if roi is None:
        return frame
    x, y, w, h = roi
    fh, fw = frame.shape[:2]
    if (fw, fh) == (w, h):
        return frame
    if x < 0 or y < 0 or x + w > fw or y + h > fh:
        raise EdgeRuntimeError(f"{path}: {fw}x{fh} does not hold the camera's roi [{x}, {y}, {w}, {h}]")
    return frame[y:y + h, x:x + w]


class FrameReader:
    """Reads images under the config's image limits, cut to the crop, all of one size."""

    def __init__(self, config: Config, roi: tuple[int, int, int, int] | None) -> None:
        self.limits = config.images
        self.roi = roi
        self.size: tuple[int, int] | None = (roi[2], roi[3]) if roi else None
        self.first: Path | str | None = None

    def read(self, path: Path) -> np.ndarray:
        """The frame, or ImageError (unreadable: left out) or EdgeRuntimeError (another size: refused)."""
        lim = self.limits
        frame = cut(read_image_file(path, lim.max_pixels, lim.min_side, int(lim.max_file_mb * 2**20)), self.roi, path)
        size = (frame.shape[1], frame.shape[0])
        if self.size is None:
            self.size, self.first = size, path
        elif size != self.size:
            since = f"as {self.first} is" if self.first else "the camera's roi"
            raise EdgeRuntimeError(f"{path}: {size[0]}x{size[1]}, but the bank's frames are {self.size[0]}x"
                                   f"{self.size[1]} ({since}): one bank holds frames of one size; crop or "
                                   "resize them all alike, or fit a bank per size")
        return frame


def good_images(config: Config, opts: FitOptions, schema: dict[str, Any]) -> tuple[list[Path], list[str]]:
    """The good images to fit on, and the notes about how they were chosen."""
    notes: list[str] = []
    if opts.from_journal:
        from edge_runtime.evaluation.defect import default_defect, parse_defect
        from edge_runtime.evaluation.journal import journal_dataset

        rule = parse_defect(opts.defect) if opts.defect else default_defect(schema)
        ds = journal_dataset(config, schema, opts.camera)
        paths = [s.image for s in ds.samples if rule.holds(s.expected) is False]
        if not paths:
            raise EdgeRuntimeError(f"no result reviewed as OK with a kept evidence image in the journal"
                                   f"{' for camera ' + opts.camera if opts.camera else ''} "
                                   f"({len(ds.samples)} reviewed with an image; see evidence.keep_passes)")
        if len(paths) > opts.max_images:
            picks = np.linspace(0, len(paths) - 1, opts.max_images).round().astype(int)
            paths = [paths[i] for i in sorted(set(picks.tolist()))]
        notes.append(f"{len(paths)} results reviewed as OK from the journal (their evidence images)")
        return paths, notes
    if opts.images is None:
        raise EdgeRuntimeError("give a folder of good images, or --from-journal")
    paths, found, stopped = list_images(opts.images, opts.max_images)
    if stopped:
        notes.append(f"{opts.images} holds more than {MAX_LISTED} entries: only the first {MAX_LISTED} were looked at")
    if len(paths) < found:
        notes.append(f"{found} images in {opts.images}: {len(paths)} chosen evenly by name (--max-images)")
    return paths, notes


def checked_frames(reader: FrameReader, paths: list[Path], skipped: list[str]) -> list[Path]:
    """Read every image once before the model loads: unreadable ones are left out (listed), one of
    another size ends the fit (EdgeRuntimeError)."""
    usable = []
    for p in paths:
        try:
            reader.read(p)
        except ImageError as exc:
            skipped.append(str(exc)[:300])
            continue
        usable.append(p)
    if len(usable) < MIN_IMAGES:
        first = f"; first problem: {skipped[0]}" if skipped else ""
        raise EdgeRuntimeError(f"{len(usable)} usable good images of {len(paths)} read: the gate needs at least "
                               f"{MIN_IMAGES} (a hundred or more to trust it){first}")
    return usable


def in_memory_gate(fit: FitResult, context: GateContext, header: Any) -> AnomalyGate:
    index = PatchIndex(fit.vectors.shape[1])
    index.add(fit.vectors)
    return AnomalyGate(LoadedBank(header, index, Path("(being fitted)")), context)


def fit_gate(config: Config, opts: FitOptions) -> FitReport:
    """Fit, check on held-out good images (and on labelled ones), choose the threshold, write OUT.

    With `--camera`, the images are encoded as the daemon encodes that camera's frames (its program's
    image_tokens budget; each region's crop when the program has regions or tiling: then one bank
    section per region, each with its own held-out threshold)."""
    from edge_runtime.inference.model_source import open_inspector, resolve_bundle

    camera = _camera(config, opts.camera)
    roi = camera.roi if camera is not None else None
    program = config.programs.get(camera.program) if camera is not None and camera.program else None
    bundle = resolve_bundle(config, opts.model)
    schema = bundle.manifest.verdict_schema
    paths, notes = good_images(config, opts, schema)
    reader = FrameReader(config, roi)
    skipped: list[str] = []
    usable = checked_frames(reader, paths, skipped)
    labelled = _labelled_samples(config, opts, schema, reader, skipped) if opts.labelled else None
    held_every = max(2, round(1 / opts.holdout)) if opts.holdout > 0 else 0
    held = [p for i, p in enumerate(usable) if held_every and i % held_every == held_every - 1]
    train = [p for i, p in enumerate(usable) if not (held_every and i % held_every == held_every - 1)]
    if not held and len(usable) >= MIN_IMAGES:  # a handful of images: still hold one out to check the bank
        held, train = usable[-1:], usable[:-1]
    if len(train) < 2 or not held:
        raise EdgeRuntimeError(f"{len(usable)} usable good images: too few to fit on and hold out (--holdout)")
    settings = config.model.model_copy(update={"warmup": False})
    config = config.model_copy(update={"model": settings})
    inspector = open_inspector(config, opts.model)
    try:
        # open_inspector loaded the config's programs: encode_frame encodes as the daemon does (budget, regions).
        context = gate_context(inspector.bundle, inspector.settings, roi, budget=program_budget(program))
        name = camera.name if camera is not None else ""
        frame_size = reader.size

        def encode(p: Path) -> list[tuple[GateContext, PatchFeatures]]:
            return sections_of(inspector.encode_frame(name, reader.read(p)), context)

        feats = list(_each(encode, train, "encoding good parts", opts.progress))
        sections = []
        for k, (ctx, first) in enumerate(feats[0]):
            fit = fit_bank([f[k][1] for f in feats], opts.max_patches, opts.position_weight, opts.seed)
            part = None if ctx.part is None else BankPart(name=ctx.part[0], box=ctx.part[1], index=k,
                                                          count=len(feats[0]), frame=frame_size or (0, 0))
            header = bank_header(fit, ctx, first, part=part, extra={
                "source": "journal" if opts.from_journal else str(opts.images), "seed": opts.seed,
                "max_patches": opts.max_patches, "position_weight_typical": opts.position_weight})
            sections.append((fit, header, in_memory_gate(fit, ctx, header)))
        del feats
        held_scores: list[list[float]] = [[] for _ in sections]
        for f in _each(encode, held, "scoring held-out parts", opts.progress):
            for k, (_, feat) in enumerate(f):
                held_scores[k].append(sections[k][2].score_features(feat).score)
        _check_held_out(held_scores, [h for _, h, _ in sections], len(held))
        # A program's frame is judged as the daemon judges it: its worst region's score over that region's
        # held-out largest score; the labelled threshold is then a factor on each region's (regions.py).
        units = [max(sc) for sc in held_scores] if has_regions(program) else [1.0]
        scored = _score_labelled([g for _, _, g in sections], units, encode, labelled, opts) if labelled else None
    finally:
        inspector.close()
    found = None
    if scored is not None:
        from edge_runtime.evaluation.gate_threshold import choose_threshold

        found = choose_threshold(scored["good"], scored["bad"], opts.max_escape or 0.001)
        scored["threshold"] = found
    written = []
    for (fit, header, _), scores, unit in zip(sections, held_scores, units, strict=True):
        held_out = _summary(scores)
        threshold = _threshold(held_out, found, unit if header.part is not None else None)
        written.append((header.model_copy(update={"threshold": threshold, "fit": {
            **header.fit, "held_out": held_out, **({"labelled": _labelled_summary(scored)} if scored else {})}}),
            fit.vectors))
    try:
        headers = write_banks(opts.out, written)
    except OSError as exc:
        raise EdgeRuntimeError(f"{opts.out}: cannot be written ({exc.strerror or exc})") from None
    return FitReport(opts.out, headers[0], headers[0].fit["held_out"], scored, skipped, notes, headers)


def _check_held_out(held_scores: list[list[float]], headers: list[Any], images: int) -> None:
    """EdgeRuntimeError unless every section's held-out good parts give a threshold the daemon can use (a
    finite number over 0). All of them scoring 0 means they are copies of fitted images (one photo copied,
    a still camera): such a bank tells nothing apart, and its threshold of 0 is refused at load."""
    for scores, header in zip(held_scores, headers, strict=True):
        top = max(scores)
        if math.isfinite(top) and top > 0:
            continue
        where = f"region {header.part.name}: " if header.part is not None else ""
        why = ("every one scores 0: they are copies of images the bank was fitted on (duplicated files, or a "
               "still frame), so the bank cannot tell parts apart; fit on images of distinct good parts"
               if top == 0 else "their scores are not finite numbers (the encoder's output is not)")
        raise EdgeRuntimeError(f"gate fit: {where}{images} held-out good images give no usable threshold: {why}")


def sections_of(enc: Encoded, context: GateContext) -> list[tuple[GateContext, PatchFeatures]]:
    """The gate's features of one encoded frame, per bank section: the whole frame, or each region's
    crop (a program with regions or tiling) with that region's context."""
    if not isinstance(enc, RegionsEncoded):
        return [(context, patch_features(enc, context))]
    out = []
    for spec, renc in enc.regions:
        if isinstance(renc, Exception):
            raise EdgeRuntimeError(f"region {spec.name} {list(spec.box)} of the camera's program: {renc}")
        ctx = for_part(context, spec.name, spec.box)
        out.append((ctx, patch_features(renc, ctx)))
    return out


def _each(encode: Any, paths: list[Path], label: str, progress: bool) -> Iterator[Any]:
    bar = Progress(label, len(paths), progress)
    for p in paths:
        yield encode(p)
        bar.update(1)


def _camera(config: Config, camera: str | None) -> CameraConfig | None:
    if camera is None:
        return None
    for cam in config.cameras:
        if cam.name == camera:
            return cam
    raise EdgeRuntimeError(f"--camera {camera}: no camera of that name in the config")


def _camera_roi(config: Config, camera: str | None) -> tuple[int, int, int, int] | None:
    cam = _camera(config, camera)
    return cam.roi if cam is not None else None


def _labelled_samples(config: Config, opts: FitOptions, schema: dict[str, Any], reader: FrameReader,
                      skipped: list[str]) -> list[tuple[Sample, bool]]:
    """(sample, is defective) of the labelled set, each image read once now (size checked)."""
    from edge_runtime.evaluation.dataset import open_dataset
    from edge_runtime.evaluation.defect import default_defect, parse_defect

    assert opts.labelled is not None
    rule = parse_defect(opts.defect) if opts.defect else default_defect(schema)
    ds = open_dataset(opts.labelled, schema, limit=MAX_IMAGES)
    out = []
    for s in ds.samples:
        truth = rule.holds(s.expected)
        if truth is None:
            skipped.append(f"{s.id}: its label does not say whether it is defective ({rule.text})")
            continue
        try:
            reader.read(s.image)
        except ImageError as exc:
            skipped.append(str(exc)[:300])
            continue
        out.append((s, truth))
    skipped.extend(ds.issues[:100])
    if not out:
        raise EdgeRuntimeError(f"--labelled {opts.labelled}: no usable labelled image")
    return out


def _score_labelled(gates: list[AnomalyGate], units: list[float], encode: Any,
                    labelled: list[tuple[Sample, bool]], opts: FitOptions) -> dict[str, Any]:
    """Each labelled frame's score: a whole frame's own, or a program's frame's worst region's score over
    `units` (each region's held-out largest score), by the daemon's rule (regions.frame_ratios)."""
    feats = _each(encode, [s.image for s, _ in labelled], "scoring labelled parts", opts.progress)
    scores = []
    for (s, bad), f in zip(labelled, feats, strict=True):
        # f holds one (context, features) per section, in the sections' order (sections_of)
        ratios, worst = frame_ratios([g.score_features(feat).score for g, (_, feat) in zip(gates, f, strict=True)],
                                     units)
        scores.append((s.id, bad, ratios[worst]))
    out = {"good": [sc for _, bad, sc in scores if not bad], "bad": [sc for _, bad, sc in scores if bad],
           "ids": [(i, bad, sc) for i, bad, sc in scores]}
    if len(units) > 1 or gates[0].context.part is not None:
        out["score"] = "the frame's worst region: its score over that region's held-out largest score"
    return out


def _summary(scores: list[float]) -> dict[str, Any]:
    a = np.asarray(scores, np.float64)
    return {"images": int(a.size), "max": float(a.max()), "p99": float(np.percentile(a, 99)),
            "p50": float(np.percentile(a, 50)), "min": float(a.min())}


def _labelled_summary(scored: dict[str, Any]) -> dict[str, Any]:
    return {"good": len(scored["good"]), "bad": len(scored["bad"]),
            "bad_min": min(scored["bad"], default=None), "good_max": max(scored["good"], default=None),
            **({"score": scored["score"]} if "score" in scored else {})}


def _threshold(held: dict[str, Any], found: dict[str, Any] | None, unit: float | None) -> BankThreshold:
    """A section's threshold: its held-out good parts' largest score, or the labelled one; on a program's
    region `found` is a factor of that region's held-out largest score (`unit`), as its scores were."""
    if found is None:
        return BankThreshold(value=held["max"], method="held-out good parts: their largest score", supported=False,
                             note=f"every held-out good part ({held['images']}) scores at or under it (the largest "
                                  "at it, so not gated: a part is gated only under the threshold); no defective part "
                                  "was seen, so nothing is claimed about escapes: use annotate, or fit with "
                                  "--labelled DIR --max-escape RATE before skip_ok")
    value = found["value"] if found["value"] is None or unit is None else _boundary(found["value"], unit)
    scale = "" if unit is None else f" (x {unit:.4g}, this region's held-out largest score)"
    return BankThreshold(value=value, method="labelled: highest threshold whose escape bound meets the "
                         "target" if found["supported"] else "labelled: lowest defective score (claim unsupported)",
                         target_escape=found["target_escape"], supported=bool(found["supported"]),
                         note=(found["note"] + scale)[:2000])


def _boundary(factor: float, unit: float) -> float:
    """A region's threshold for a labelled `factor` on its `unit`: the least score s whose ratio s / unit
    (the fit's) is at or over `factor`. The daemon gates a score under it exactly when the fit counted its
    ratio under `factor`; factor x unit alone can round above the defective frame the claim left ungated."""
    t = factor * unit
    while t > 0 and t / unit >= factor:
        t = math.nextafter(t, 0.0)
    while t / unit < factor:
        t = math.nextafter(t, math.inf)
    return t
