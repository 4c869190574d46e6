"""`edge-runtime gate fit | show | score`: the anomaly gate's bank, made, checked and tried
(docs/inspection.md, "The anomaly gate")."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from edge_runtime.config.schema import Config
from edge_runtime.core.errors import EdgeRuntimeError

HEAT_MAP_SUFFIXES = (".png", ".jpg", ".jpeg")
MAX_PATCHES_CAP = 1_000_000


def add_gate_parser(p: Any, sub: Any) -> None:
    """Register `gate …` on the main parser `p` (cli/main.py's Parser)."""
    gate = p.command(sub, "gate", help="the anomaly gate: fit a bank of good parts' patch features, check it, try it")
    gsub = gate.add_subparsers(dest="gate_command", required=True, metavar="ACTION")
    fit = p.command(gsub, "fit", help="fit a bank from good parts' images (or reviewed OK results) and choose "
                    "its threshold")
    fit.add_argument("images", metavar="DIR_OF_OK_IMAGES", help="folder of good parts' images (with "
                     "--from-journal: leave out, give OUT only)")
    fit.add_argument("out", metavar="OUT", nargs="?", help="the bank file to write (replaced atomically)")
    fit.add_argument("--model", metavar="DIR", help="bundle folder (default: config, then demo)")
    fit.add_argument("--camera", metavar="NAME", help="the config's camera these frames are from: its roi is "
                     "cut from each image; with --from-journal, only its results")
    fit.add_argument("--from-journal", action="store_true", help="the results technicians reviewed as OK, with "
                     "their kept evidence images, instead of a folder")
    fit.add_argument("--max-images", type=int, default=500, metavar="N",
                     help="good images used, chosen evenly by name (default 500)")
    fit.add_argument("--max-patches", type=int, default=10_000, metavar="N",
                     help="bank size: greedy coreset of the good patches down to N (default 10000; per region "
                     "with a program's regions)")
    fit.add_argument("--position-weight", type=float, default=4.0, metavar="W",
                     help="how much a patch's place counts, in typical patch distances per patch of "
                     "displacement (default 4: parts in a fixture; 0: parts anywhere in the frame)")
    fit.add_argument("--holdout", type=float, default=0.2, metavar="SHARE",
                     help="share of the good images kept out of the bank to check it (default 0.2)")
    fit.add_argument("--labelled", metavar="DATASET", help="labelled images (any eval dataset layout) to choose "
                     "the threshold from; needs the eval extra")
    fit.add_argument("--max-escape", default="0.1%", metavar="RATE",
                     help="with --labelled: the escape rate whose upper 95%% bound the threshold must meet "
                     "(default 0.1%%)")
    fit.add_argument("--defect", metavar="EXPR", help="what a defect is in the labels (default: the schema's "
                     "boolean defect field)")
    fit.add_argument("--seed", type=int, default=0, help="coreset and sampling seed (default 0)")
    fit.add_argument("--json", action="store_true", help="print the bank's header as JSON")
    fit.add_argument("--quiet", action="store_true", help="no progress bar")
    fit.set_defaults(func=cmd_gate_fit)
    show = p.command(gsub, "show", help="check a bank file (reads and hashes every value) and print its header")
    show.add_argument("bank")
    show.set_defaults(func=cmd_gate_show)
    score = p.command(gsub, "score", help="score one image against a bank (and draw its heat map)")
    score.add_argument("image")
    score.add_argument("--bank", required=True, metavar="FILE")
    score.add_argument("--model", metavar="DIR", help="bundle folder (default: config, then demo)")
    score.add_argument("--camera", metavar="NAME", help="the config's camera: its roi is cut from the image")
    score.add_argument("--heat-map", metavar="PNG", help="write the image with the heat map over it")
    score.add_argument("--max-bank-mb", type=float, default=256.0, metavar="MB",
                       help="refuse a bank needing more memory (default 256)")
    score.set_defaults(func=cmd_gate_score)


def parse_rate(text: str, what: str) -> float:
    """`0.1%` or `0.001` -> 0.001, strictly between 0 and 1."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(%?)\s*", text)
    value = float(m.group(1)) / (100 if m.group(2) else 1) if m else -1.0
    if not 0 < value < 1:
        raise EdgeRuntimeError(f"{what}: {text!r} is not a rate over 0 and under 100% (like 0.1% or 0.001)")
    return value


def cmd_gate_fit(args: argparse.Namespace, config: Config) -> int:
    from edge_runtime.evaluation.gate_fit import MAX_IMAGES, FitOptions, fit_gate

    images, out = args.images, args.out
    if args.from_journal and out is None:
        images, out = None, images
    if out is None:
        raise EdgeRuntimeError("give the bank file to write: gate fit DIR_OF_OK_IMAGES OUT")
    if not 1 <= args.max_images <= MAX_IMAGES:
        raise EdgeRuntimeError(f"--max-images must be 1 to {MAX_IMAGES}")
    if not 1 <= args.max_patches <= MAX_PATCHES_CAP:
        raise EdgeRuntimeError(f"--max-patches must be 1 to {MAX_PATCHES_CAP}")
    if not 0 <= args.position_weight <= 1000:
        raise EdgeRuntimeError("--position-weight must be 0 to 1000")
    if not 0 < args.holdout < 1:
        raise EdgeRuntimeError("--holdout must be over 0 and under 1 (a share of the good images)")
    if not 0 <= args.seed < 2**63:  # numpy's generator takes no negative seed (an internal error before)
        raise EdgeRuntimeError("--seed must be 0 or more")
    max_escape = parse_rate(args.max_escape, "--max-escape")
    if args.labelled:
        try:
            import scipy  # noqa: F401 - the exact bound (gate_threshold.py)
        except ImportError:
            raise EdgeRuntimeError("gate fit --labelled needs the eval extra: pip install 'edge-runtime[eval]'") \
                from None
    opts = FitOptions(images=Path(images) if images else None, out=Path(out), model=args.model, camera=args.camera,
                      from_journal=args.from_journal, max_images=args.max_images, max_patches=args.max_patches,
                      position_weight=args.position_weight, holdout=args.holdout, seed=args.seed,
                      labelled=Path(args.labelled) if args.labelled else None, max_escape=max_escape,
                      defect=args.defect, progress=not args.quiet and not args.json)
    report = fit_gate(config, opts)
    for line in report.skipped[:20]:
        print(f"gate fit: left out: {line}", file=sys.stderr)
    if len(report.skipped) > 20:
        print(f"gate fit: … {len(report.skipped) - 20} more left out", file=sys.stderr)
    if args.json:
        print(json.dumps(report.header.model_dump(mode="json"), indent=2))
    else:
        print(render_fit(report))
    return 0


def render_fit(report: Any) -> str:
    h = report.header
    fit, th = h.fit, h.threshold
    held = report.held_out
    lines = [*(f"note: {n}" for n in report.notes),
             f"fitted on {fit['images']} good images ({held['images']} more held out): {fit['patches_seen']} patches"
             f" -> a bank of {h.vectors.patches}{' (greedy coreset)' if fit['coreset'] else ''}, "
             f"{h.vectors.dim} values each, frames {h.layout.width}x{h.layout.height}",
             f"held-out good parts score {held['min']:.4g} to {held['max']:.4g} (median {held['p50']:.4g})"]
    if report.labelled is not None:
        lab = report.labelled
        low, high = min(lab["bad"], default=float("nan")), max(lab["good"], default=float("nan"))
        lines.append(f"labelled: {len(lab['good'])} good, {len(lab['bad'])} defective; defective parts score from "
                     f"{low:.4g}, good parts up to {high:.4g}{' (' + lab['score'] + ')' if 'score' in lab else ''}")
    shown = "none" if th.value is None else f"{th.value:.4g}"
    if report.labelled is not None and len(report.headers) > 1:  # one factor on every region's own threshold
        factor = report.labelled["threshold"]["value"]
        shown = "none" if factor is None else f"each region's held-out largest score x {factor:.4g}"
    lines.append(f"threshold {shown} ({th.method}){'' if th.supported else ' - NOT an escape claim'}")
    lines.append(f"  {th.note}")
    for r in report.headers if len(report.headers) > 1 else []:  # one section per region of the program
        rh, rt = r.fit["held_out"], r.threshold.value
        lines.append(f"region {r.part.name} {list(r.part.box)}: a bank of {r.vectors.patches} patches, frames "
                     f"{r.layout.width}x{r.layout.height}; held-out good parts {rh['min']:.4g} to {rh['max']:.4g}; "
                     f"threshold {'none' if rt is None else f'{rt:.4g}'}")
    size = report.out.stat().st_size
    lines += [f"bank: {report.out} ({size / 2**20:.1f} MiB, sha256 {h.vectors.sha256[:16]}…); encoder "
              f"{h.encoder.file} sha256 {h.encoder.sha256[:12]}… of {h.encoder.bundle}",
              "for the config (the camera's gate: section):",
              f"  gate: {{mode: annotate, bank: {report.out.resolve()}"
              + ("}" if th.value is None or len(report.headers) > 1 else f", threshold: {th.value:.6g}}}")]
    return "\n".join(lines)


def cmd_gate_show(args: argparse.Namespace, config: Config) -> int:
    from edge_runtime.inference.anomaly.bank import verify_banks

    headers = [h.model_dump(mode="json") for h in verify_banks(Path(args.bank))]
    print(json.dumps(headers[0] if len(headers) == 1 else headers, indent=2))  # a list: one per region
    return 0


def cmd_gate_score(args: argparse.Namespace, config: Config) -> int:
    from edge_runtime.evaluation.gate_fit import FrameReader, _camera
    from edge_runtime.inference.anomaly import AnomalyGate, gate_context, heat_map, overlay_heat, read_header
    from edge_runtime.inference.anomaly.regions import has_regions, load_region_gates, program_budget
    from edge_runtime.inference.model_source import open_inspector

    if not 0 < args.max_bank_mb <= 65536:
        raise EdgeRuntimeError("--max-bank-mb must be over 0 and at most 65536")
    if args.heat_map and Path(args.heat_map).suffix.lower() not in HEAT_MAP_SUFFIXES:
        raise EdgeRuntimeError(f"--heat-map {args.heat_map}: give a .png or .jpg path")  # before the model loads
    cam = _camera(config, args.camera)
    roi = cam.roi if cam is not None else None
    program = config.programs.get(cam.program) if cam is not None and cam.program else None
    bank = Path(args.bank)
    read_header(bank)  # a file that is not a bank fails before the model loads
    frame = FrameReader(config, roi).read(Path(args.image))
    config.model.warmup = False
    inspector = open_inspector(config, args.model)
    try:  # encoded as the daemon encodes this camera's frames: its program's budget and regions
        context = gate_context(inspector.bundle, inspector.settings, roi, budget=program_budget(program))
        max_bytes = int(args.max_bank_mb * 2**20)
        if program is not None and has_regions(program):
            gates = load_region_gates(str(bank), context, program, (frame.shape[1], frame.shape[0]), max_bytes)
        else:
            gates = [AnomalyGate.load(bank, context, max_bytes)]
        enc = inspector.encode_frame(cam.name if cam is not None else "", frame)
        crops = dict((spec.name, renc) for spec, renc in getattr(enc, "regions", []))
        results = [g.score(crops[g.context.part[0]] if g.context.part is not None else enc) for g in gates]
    finally:
        inspector.close()
    looks = [_look(g, r) for g, r in zip(gates, results, strict=True)]
    out: dict[str, Any] = looks[0] if len(looks) == 1 else {"gated": all(lk["gated"] for lk in looks),
                                                            "regions": looks}
    if args.heat_map:
        image = frame.copy()
        for g, r in zip(gates, results, strict=True):
            x, y, w, h = g.context.part[1] if g.context.part is not None else (0, 0, frame.shape[1], frame.shape[0])
            image[y:y + h, x:x + w] = overlay_heat(image[y:y + h, x:x + w], heat_map(r), g.threshold or r.score)
        _write_heat_map(Path(args.heat_map), image)
        out["heat_map"] = args.heat_map
    print(json.dumps(out))
    return 0


def _write_heat_map(path: Path, image: Any) -> None:
    """Encoded in memory, then written by Python: cv2.imwrite raised on a folder (an internal error) and
    only returned False on a full disk, after libpng's own line on stderr, leaving a partial file."""
    import cv2

    ok, data = cv2.imencode(path.suffix.lower(), image)
    if not ok:
        raise EdgeRuntimeError(f"--heat-map {path}: the image could not be encoded")
    try:
        with path.open("wb") as f:
            f.write(data.tobytes())
    except OSError as exc:
        if path.is_file():
            path.unlink()  # a partial image is worse than none
        raise EdgeRuntimeError(f"--heat-map {path}: cannot be written ({exc.strerror or exc})") from None


def _look(gate: Any, result: Any) -> dict[str, Any]:
    """One bank section's score of the image (a region's, with its name and box)."""
    threshold = gate.threshold
    part = gate.context.part
    box = result.worst_box()
    if box is not None and part is not None:  # a region's patch, in the image's pixels
        box = (box[0] + part[1][0], box[1] + part[1][1], box[2] + part[1][0], box[3] + part[1][1])
    return {**({"name": part[0], "box": list(part[1])} if part is not None else {}),
            "score": round(result.score, 6), "threshold": threshold,
            "gated": threshold is not None and result.score < threshold,
            "worst_patch_box": [round(v, 1) for v in box or ()] or None,
            "search_ms": round(result.search_ms, 3)}
