"""One evaluation: read the dataset, run every variant (bundle x prompt), measure, compare, report."""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_runtime.config import CameraConfig
from edge_runtime.config.schema import Config
from edge_runtime.core.errors import EdgeRuntimeError
from edge_runtime.core.result import utc_now
from edge_runtime.evaluation import confidence as conf
from edge_runtime.evaluation.compare import compare
from edge_runtime.evaluation.dataset import Dataset, open_dataset
from edge_runtime.evaluation.defect import DefectRule, default_defect, parse_defect, rule_defect
from edge_runtime.evaluation.metrics import Pair, defect_metrics, field_metrics, latency_metrics, region_metrics
from edge_runtime.evaluation.report import write_atomic, write_html, write_json
from edge_runtime.evaluation.runner import EVAL_CAMERA, RunLog, run_variant, variant_key
from edge_runtime.inference.model_source import open_inspector, resolve_bundle

log = logging.getLogger(__name__)
EVALUATIONS_KEPT = 50
MAX_MODELS = 8
MAX_PROMPTS_BYTES = 1 << 20
MAX_PROMPTS = 16
MAX_PROMPT_CHARS = 4000


@dataclass
class EvalOptions:
    """What `edge-runtime eval` was asked (see cli/eval.py for each option's meaning)."""

    dataset: Path | None
    out: Path
    models: list[str | None] = field(default_factory=lambda: [None])
    prompts: list[str | None] = field(default_factory=lambda: [None])
    from_journal: bool = False
    camera: str | None = None
    limit: int | None = None
    defect: str | None = None
    defect_rule: str | None = None
    target_escape: float = 0.005
    confidence_field: str = "verdict.confidence"
    class_field: str | None = None
    progress: bool = True
    gate: Path | None = None  # a bank of `gate fit`: measured on the first --model (gate_eval.py)
    gate_threshold: float | None = None
    program: str | None = None  # inspect each image under this program of the config (its regions, references)


def parse_rate(text: str) -> float:
    """`0.5%` or `0.005` -> 0.005."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(%?)\s*", text)
    if not m:
        raise EdgeRuntimeError(f"--target-escape: {text!r} is not a rate like 0.5% or 0.005")
    value = float(m.group(1)) / (100 if m.group(2) else 1)
    if not 0 <= value < 1:
        raise EdgeRuntimeError(f"--target-escape: {text!r} must be at least 0 and under 100%")
    return value


def load_prompts(path: Path) -> list[str | None]:
    """A JSON list of prompts, or one prompt per line (blank lines and # comments skipped)."""
    try:
        raw = path.read_bytes()[:MAX_PROMPTS_BYTES + 1]
    except OSError as exc:
        raise EdgeRuntimeError(f"--prompts {path}: cannot be read ({exc.strerror or exc})") from None
    if len(raw) > MAX_PROMPTS_BYTES:
        raise EdgeRuntimeError(f"--prompts {path}: larger than 1 MiB")
    text = raw.decode("utf-8", errors="replace")
    try:
        loaded = json.loads(text)
        prompts = loaded if isinstance(loaded, list) else None
    except ValueError:
        prompts = None
    if prompts is None:
        prompts = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not prompts or len(prompts) > MAX_PROMPTS:
        raise EdgeRuntimeError(f"--prompts {path}: give 1 to {MAX_PROMPTS} prompts")
    for p in prompts:
        if not isinstance(p, str) or not p.strip() or len(p) > MAX_PROMPT_CHARS:
            raise EdgeRuntimeError(f"--prompts {path}: each prompt is a non-empty string of at most "
                                   f"{MAX_PROMPT_CHARS} characters")
    return list(prompts)


def _defect_rule(config: Config, opts: EvalOptions, schema: dict[str, Any]) -> DefectRule:
    if opts.defect and opts.defect_rule:
        raise EdgeRuntimeError("give --defect or --defect-rule, not both")
    if opts.defect_rule:
        return rule_defect(config.rules, opts.defect_rule)
    return parse_defect(opts.defect) if opts.defect else default_defect(schema)


def read_dataset(config: Config, opts: EvalOptions, schema: dict[str, Any]) -> Dataset:
    if opts.from_journal:
        from edge_runtime.evaluation.journal import journal_dataset

        return journal_dataset(config, schema, opts.camera, opts.limit)
    if opts.dataset is None:
        raise EdgeRuntimeError("give a DATASET (folder, .jsonl or .csv) or --from-journal")
    return open_dataset(opts.dataset, schema, class_field=opts.class_field, limit=opts.limit)


def evaluate(config: Config, opts: EvalOptions) -> dict[str, Any]:
    """Run the evaluation; writes OUT/runs.jsonl, OUT/report.json, OUT/report.html; returns the report."""
    if len(opts.models) > MAX_MODELS:
        raise EdgeRuntimeError(f"--model: at most {MAX_MODELS} bundles in one evaluation")
    schema = resolve_bundle(config, opts.models[0]).manifest.verdict_schema  # no engine loaded yet
    rule = _defect_rule(config, opts, schema)
    if opts.program is not None:
        check_program(config, opts.program)
    if opts.gate is not None:
        from edge_runtime.evaluation.gate_eval import check_bank
        from edge_runtime.inference.anomaly.regions import has_regions

        check_bank(opts.gate, opts.program, opts.program is not None and has_regions(config.programs[opts.program]))
    ds = read_dataset(config, opts, schema)
    if not ds.samples:
        raise EdgeRuntimeError(f"no usable labelled image in the dataset ({_counts(ds.counts)}); "
                               f"first problem: {ds.issues[0] if ds.issues else 'none'}")
    try:
        opts.out.mkdir(parents=True, exist_ok=True)
        runs = RunLog(opts.out / "runs.jsonl")
    except OSError as exc:
        raise EdgeRuntimeError(f"--out {opts.out}: cannot be used ({exc.strerror or exc})") from None
    variants: list[dict[str, Any]] = []
    verdicts: dict[str, dict[str, Any]] = {}
    pairs_of: dict[str, list[Pair]] = {}
    gate: dict[str, Any] | None = None
    try:
        for model in opts.models:
            inspector = open_inspector(config, model)
            try:
                if opts.program is not None:
                    use_program(inspector, config, opts.program)
                for prompt in opts.prompts:
                    label = f"{chr(ord('A') + len(variants))}: {inspector.model_name}"
                    key = variant_key(inspector, prompt)
                    if key in pairs_of:  # the same bundle files and prompt again: same verdicts
                        log.warning("eval: %s with this prompt was measured already; skipped", inspector.model_name)
                        continue
                    stats = run_variant(inspector, key, label, prompt, ds.samples, runs, config.images,
                                        config.inspection.max_batch, opts.progress)
                    pairs = [Pair(s, runs.records[(key, s.id)].get("verdict"), runs.records[(key, s.id)])
                             for s in ds.samples]
                    pairs_of[key] = pairs
                    verdicts[key] = {p.sample.id: p.verdict for p in pairs}
                    variants.append(_variant(label, key, model, inspector.model_name,
                                             prompt or inspector.default_prompt, pairs, rule, opts, stats,
                                             inspector.bundle.manifest.verdict_schema))
                if opts.gate is not None and gate is None and variants:
                    from edge_runtime.evaluation.gate_eval import gate_section

                    gate = gate_section(inspector, opts.gate, opts.gate_threshold, pairs_of[variants[0]["key"]],
                                        rule, config.images, opts.progress,
                                        config.programs[opts.program] if opts.program is not None else None)
            finally:
                inspector.close()
    finally:
        runs.close()
    first = variants[0]
    for kind, n in first["errors"].items():
        ds.counts[kind] += n
    for p in pairs_of[first["key"]]:
        if p.record.get("kind") == "bad_image":
            ds.issues.append(f"bad_image: {p.sample.id}: {p.record.get('error')}")
    comparisons = [{"a": first["label"], "b": v["label"],
                    **compare(pairs_of[first["key"]], pairs_of[v["key"]], rule)} for v in variants[1:]]
    report = {"generated": utc_now(), "defect_rule": rule.text, "target_escape": opts.target_escape,
              "dataset": {"path": "journal" if opts.from_journal else str(opts.dataset), "source": ds.source,
                          "samples": len(ds.samples), "issue_counts": dict(ds.counts), "issues": ds.issues[:10_000]},
              "variants": variants, "comparisons": comparisons}
    if gate is not None:
        report["gate"] = gate
    write_json(report, opts.out)
    write_atomic(opts.out / "summary.json", json.dumps(summary(report), indent=2, ensure_ascii=False) + "\n")
    register(config.data_dir, opts.out, report)
    write_html(report, {s.id: s.image for s in ds.samples}, verdicts, opts.out, config.images)
    return report


def check_program(config: Config, name: str) -> None:
    """--program names a program of the config that single images can be asked under."""
    if name not in config.programs:
        known = ", ".join(sorted(config.programs)[:8]) or "none configured"
        raise EdgeRuntimeError(f"--program {name[:64]!r}: no such program under programs: (known: {known})")
    if config.programs[name].clip is not None:
        raise EdgeRuntimeError(f"--program {name}: a clip asks about several frames; eval reads single images")


def use_program(inspector: Any, config: Config, name: str) -> None:
    """Each image is then inspected as a frame of a camera under that program (runner.EVAL_CAMERA)."""
    camera = CameraConfig(name=EVAL_CAMERA, source=EVAL_CAMERA, program=name)
    inspector.use_programs({name: config.programs[name]}, [camera], config.images)


def _variant(label: str, key: str, model: str | None, model_name: str, prompt: str, pairs: list[Pair],
             rule: DefectRule, opts: EvalOptions, stats: Any, schema: dict[str, Any]) -> dict[str, Any]:
    rows = conf.decisions(pairs, rule, opts.confidence_field)
    threshold = conf.threshold_for(rows, opts.target_escape) if rows else None
    errors = Counter(str(p.record.get("kind")) for p in pairs if p.verdict is None)
    return {
        "label": label, "key": key, "model": model or model_name, "prompt": prompt,
        "errors": dict(errors), "defect": defect_metrics(pairs, rule),
        "fields": field_metrics(pairs, schema),
        **({"regions": regions} if (regions := region_metrics(pairs, rule)) else {}),
        "latency": latency_metrics(pairs),
        "confidence": {"field": opts.confidence_field, "reliability": conf.reliability(rows),
                       "threshold": threshold,
                       "rule_snippet": (conf.rule_snippet(threshold, rule, opts.confidence_field)
                                        if threshold else None)},
        "run": {"inspected_now": stats.inspected, "reused": stats.reused, "wall_s": round(stats.wall_s, 3),
                "images_per_s": stats.images_per_s},
    }


def register(data_dir: Path, out: Path, report: dict[str, Any]) -> Path | None:
    """Keep the summary in `<data_dir>/evaluations/` (newest EVALUATIONS_KEPT), where the status page's
    Evaluations view lists it. A registry that cannot be written is a warning, not a failed eval."""
    folder = data_dir / "evaluations"
    name = re.sub(r"[^0-9A-Za-z]", "", report["generated"]) + f"-{report['variants'][0]['key'][:8]}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        write_atomic(path, json.dumps({"generated": report["generated"], "out": str(out.resolve()),
                                       **summary(report)}, ensure_ascii=False) + "\n")
        for old in sorted(p for p in folder.glob("*.json") if p.is_file())[:-EVALUATIONS_KEPT]:
            old.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("eval: the summary was not kept in %s (%s)", folder, exc.strerror or exc)
        return None
    return path


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """The few numbers a line engineer reads first (what `--json` prints)."""
    return {
        "dataset": {k: report["dataset"][k] for k in ("path", "source", "samples", "issue_counts")},
        "defect_rule": report["defect_rule"],
        "variants": [{"label": v["label"], "model": v["model"], "prompt": v["prompt"],
                      "escape": v["defect"]["escape"], "false_reject": v["defect"]["false_reject"],
                      "precision": v["defect"]["precision"], "recall": v["defect"]["recall"], "f1": v["defect"]["f1"],
                      "accuracy": {n: f["accuracy"] for n, f in v["fields"].items()}, "errors": v["errors"],
                      "latency_ms": {k: v["latency"]["total_ms"][k] for k in ("p50", "p95")},
                      "tokens_per_verdict": v["latency"]["tokens"]["mean"],
                      "min_confidence": (v["confidence"]["threshold"] or {}).get("min_confidence"),
                      "images_per_s": v["run"]["images_per_s"],
                      **({"regions": {n: {"escape": r["escape"], "false_reject": r["false_reject"],
                                          "no_verdict": r["no_verdict"]} for n, r in v["regions"].items()}}
                         if v.get("regions") else {})} for v in report["variants"]],
        "comparisons": [{k: c[k] for k in ("a", "b", "paired", "escape", "false_reject")}
                        for c in report["comparisons"]],
        **({"gate": {k: report["gate"][k] for k in ("bank", "threshold", "escape", "false_reject", "calls_saved",
                                                     "skip_ok")}} if report.get("gate") else {}),
    }


def _counts(counts: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "it is empty"
