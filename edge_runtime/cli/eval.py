"""`edge-runtime eval DATASET`: measure bundles and prompts on labelled images (docs/evaluation.md)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from edge_runtime.config.schema import Config

MAX_ISSUE_LINES = 20


def add_eval_parser(p: Any, sub: Any) -> None:
    """Register the command on the main parser `p` (cli/main.py's Parser)."""
    ev = p.command(sub, "eval", help="measure a bundle, prompt and schema on labelled images: escape and "
                   "false-reject rates, per-field accuracy, report.html + report.json")
    ev.add_argument("dataset", nargs="?", help="dataset export folder, a folder per class, or a .jsonl/.csv "
                    "of image + expected verdict fields")
    ev.add_argument("--from-journal", action="store_true", help="the reviewed results of this device's journal")
    ev.add_argument("--camera", help="with --from-journal: only this camera")
    ev.add_argument("--model", metavar="DIR", action="append",
                    help="bundle folder; repeat to compare bundles (default: config, then demo)")
    prompts = ev.add_mutually_exclusive_group()
    prompts.add_argument("--prompt", help="inspection question (default: the bundle's)")
    prompts.add_argument("--prompts", metavar="FILE", help="compare prompts: a JSON list or one per line")
    ev.add_argument("--out", metavar="DIR", default="eval-out",
                    help="runs.jsonl (resumable), report.json, report.html (default: ./eval-out)")
    ev.add_argument("--limit", type=int, metavar="N", help="only the first N labelled images")
    ev.add_argument("--defect", metavar="EXPR", help="what a defect is, e.g. \"verdict.defect == true\" or "
                    "'verdict.category in [\"crack\", \"dent\"]' (default: the schema's boolean defect)")
    ev.add_argument("--defect-rule", metavar="NAME", help="a defect is what this config rule's conditions match")
    ev.add_argument("--target-escape", default="0.5%", metavar="RATE",
                    help="escape rate the suggested min_confidence must meet (default 0.5%%)")
    ev.add_argument("--confidence-field", default="verdict.confidence", metavar="PATH")
    ev.add_argument("--class-field", metavar="FIELD", help="folder-per-class datasets: the field the folder "
                    "names give (default: guessed from the schema)")
    ev.add_argument("--gate", metavar="BANK", help="also measure this anomaly gate bank (edge-runtime gate fit) on "
                    "the first --model: its escape and false-reject rates, the calls it saves, skip_ok's outcome")
    ev.add_argument("--gate-threshold", type=float, metavar="SCORE", help="the gate's threshold (default: the "
                    "bank's; a bank of --program's regions: a factor on every region's threshold, default 1)")
    ev.add_argument("--program", metavar="NAME", help="inspect each image under this inspection program of the "
                    "config (its regions, tiles, references); a dataset labelling `regions` is measured per region")
    ev.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    ev.add_argument("--quiet", action="store_true", help="no progress bar")
    ev.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace, config: Config) -> int:
    from edge_runtime.core.errors import EdgeRuntimeError

    try:
        from edge_runtime.evaluation.evaluate import EvalOptions, evaluate, load_prompts, parse_rate, summary
    except ImportError as exc:  # scikit-learn, scipy, matplotlib come with the eval extra
        raise EdgeRuntimeError(f"eval needs the eval extra: pip install 'edge-runtime[eval]' ({exc.name} is "
                               "missing)") from None
    if args.limit is not None and args.limit < 1:
        raise EdgeRuntimeError("--limit must be at least 1")
    if args.dataset and args.from_journal:
        raise EdgeRuntimeError("give a DATASET or --from-journal, not both")
    if args.gate_threshold is not None and not (args.gate and math.isfinite(args.gate_threshold)
                                                and args.gate_threshold > 0):
        raise EdgeRuntimeError("--gate-threshold needs --gate and a finite score over 0")
    opts = EvalOptions(
        dataset=Path(args.dataset) if args.dataset else None, out=Path(args.out),
        models=list(args.model) if args.model else [None],
        prompts=load_prompts(Path(args.prompts)) if args.prompts else [args.prompt],
        from_journal=args.from_journal, camera=args.camera, limit=args.limit, defect=args.defect,
        defect_rule=args.defect_rule, target_escape=parse_rate(args.target_escape),
        confidence_field=args.confidence_field, class_field=args.class_field, progress=not args.quiet,
        gate=Path(args.gate) if args.gate else None, gate_threshold=args.gate_threshold, program=args.program)
    report = evaluate(config, opts)
    issues = report["dataset"]["issues"]
    for line in issues[:MAX_ISSUE_LINES]:
        print(f"eval: left out: {line}", file=sys.stderr)
    if len(issues) > MAX_ISSUE_LINES:
        print(f"eval: … {len(issues) - MAX_ISSUE_LINES} more left out (report.json lists them)", file=sys.stderr)
    if args.json:
        print(json.dumps(summary(report), indent=2, ensure_ascii=False))
    else:
        print(render(report, opts.out))
    return 0


def _rate(r: dict[str, Any]) -> str:
    if r["rate"] is None:
        return "n/a (none in the dataset)"
    lo, hi = r["ci95"]
    return f"{r['rate']:.2%} ({r['count']}/{r['of']}, 95% CI {lo:.2%}-{hi:.2%})"


def render(report: dict[str, Any], out: Path) -> str:
    ds = report["dataset"]
    counts = ", ".join(f"{k} {v}" for k, v in ds["issue_counts"].items()) or "none"
    lines = [f"dataset: {ds['samples']} labelled images ({ds['source']}); left out: {counts}",
             f"defect: {report['defect_rule']}"]
    for v in report["variants"]:
        d = v["defect"]
        lines += [f"{v['label']}  (prompt: {v['prompt'][:60]})",
                  f"  escape rate        {_rate(d['escape'])}",
                  f"  false-reject rate  {_rate(d['false_reject'])}",
                  f"  precision {_f(d['precision'])}  recall {_f(d['recall'])}  F1 {_f(d['f1'])}  "
                  f"(TP {d['tp']} FP {d['fp']} FN {d['fn']} TN {d['tn']})",
                  "  accuracy  " + "  ".join(f"{n} {f['accuracy']:.1%}" for n, f in v["fields"].items()),
                  f"  latency p50 {_f(v['latency']['total_ms']['p50'])} ms  p95 {_f(v['latency']['total_ms']['p95'])}"
                  f" ms  tokens/verdict {_f(v['latency']['tokens']['mean'])}  errors {v['errors'] or 'none'}"]
        if v["run"]["images_per_s"]:
            lines.append(f"  this run: {v['run']['inspected_now']} images at {v['run']['images_per_s']:.1f} images/s "
                         f"({v['run']['reused']} from an earlier run)")
        for name, r in (v.get("regions") or {}).items():
            lines.append(f"  region {name}: escape {_rate(r['escape'])}; false-reject {_rate(r['false_reject'])}"
                         + (f"; no verdict {r['no_verdict']}" if r["no_verdict"] else ""))
        th = v["confidence"]["threshold"]
        if th and th["reachable"]:
            lines.append(f"  min_confidence {th['min_confidence']} meets escape <= {th['target']:.2%} "
                         f"(good parts held for review: {_rate(th['good_held_for_review'])})")
            if v["confidence"]["rule_snippet"]:
                lines.append("  " + v["confidence"]["rule_snippet"].rstrip().replace("\n", "\n  "))
        elif th:
            lines.append(f"  no min_confidence reaches escape <= {th['target']:.2%}: "
                         "bad parts pass with confidence 1")
    if report.get("gate"):
        lines += render_gate(report["gate"])
    for c in report["comparisons"]:
        for k in ("escape", "false_reject"):
            t = c[k]
            if t["of"]:
                lines.append(f"{c['b']} vs {c['a']}: {k} {t['b']}/{t['of']} vs {t['a']}/{t['of']}, McNemar p = "
                             f"{t['p_value']:.4f} ({'significant' if t['significant'] else 'not significant'})")
    lines.append(f"report: {out / 'report.html'}  {out / 'report.json'}")
    return "\n".join(lines)


def render_gate(g: dict[str, Any]) -> list[str]:
    s = g["skip_ok"]
    unit = f", {g['score_unit']}" if "score_unit" in g else ""
    out = [f"gate {g['bank']} at threshold {g['threshold']:.4g} ({g['threshold_source']}{unit}; "
           f"{g['scored']} images scored"
           f"{', left out: ' + ', '.join(f'{k} {v}' for k, v in g['left_out'].items()) if g['left_out'] else ''})",
           f"  gate escape rate        {_rate(g['escape'])}  (defective parts scoring under the threshold)",
           f"  gate false-reject rate  {_rate(g['false_reject'])}  (good parts flagged: they go to the model)",
           f"  language-model calls saved  {_rate(g['calls_saved'])}"]
    if g.get("not_finite"):
        out.append(f"  {g['not_finite']} images scored a non-finite number (NaN/inf: a broken encoder or bank): "
                   "counted as not gated (sent to the model), left out of the curve")
    if s["judged"]:
        alone = s["language_model_alone"]
        out += [f"  skip_ok on this set: escape {_rate(s['escape'])} (model alone {_rate(alone['escape'])})",
                f"                       false reject {_rate(s['false_reject'])} (model alone "
                f"{_rate(alone['false_reject'])})"]
    return out


def _f(x: Any) -> str:
    return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)
