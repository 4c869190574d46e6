"""What one spelling of the JSON around a verdict's values saves, measured in one run.

Since 2026-12-04 the verdict grammar admits only json.dumps' separators (`{"a": 1, "b": [1, 2]}`);
before, llama-cpp-python's converter allowed an optional space after every token (`space ::= " "?`),
so each separator was a choice the model made in a generation step of its own. This script asks the
same frames under both grammars, interleaved frame by frame (the old one rebuilt from the new by
putting the optional spaces back), for the bundle's schema and a boolean-and-enum schema such as a
region of an inspection program asks, and reports per verdict: generation steps (`llama_decode`
calls: on a GPU a step costs its kernel launches more than its tokens), tokens, and milliseconds.

    python benchmarks/json_spelling.py [--model DIR] [--frames 8] [--threads 2] [--gpu-layers 0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BOOL_AND_ENUM = {"type": "object", "additionalProperties": False, "required": ["defect", "category"],
                 "properties": {"defect": {"type": "boolean"},
                                "category": {"enum": ["none", "missing_screw", "loose_screw"]}}}


def optional_spaces(grammar: str) -> str:
    """The grammar as the converter wrote it before: an optional space after every JSON token."""
    return (grammar.replace('": "', '":" space').replace('", "', '"," space')
            .replace('space ::= ""', 'space ::= " "?'))


def pct(values: list[float], q: float) -> float:
    return round(sorted(values)[min(len(values) - 1, int(q * len(values)))], 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="bundle folder (default: the demo bundle, built in a temporary folder)")
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=160)
    args = ap.parse_args()

    from edge_runtime.config import Config
    from edge_runtime.core.samples import part_image
    from edge_runtime.inference.llm.grammar import schema_to_grammar
    from edge_runtime.inference.model_source import open_inspector

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from edge_runtime_models.demo import build_demo_bundle

            model = str(build_demo_bundle(Path(tmp) / "demo"))
        cfg = Config(device_id="bench")
        cfg.model.threads, cfg.model.gpu_layers = args.threads, args.gpu_layers
        inspector = open_inspector(cfg, model)
        report: dict[str, Any] = {"bundle": inspector.bundle.name, "frames": args.frames, "threads": args.threads,
                                  "load_before": os.getloadavg()[0], "schemas": {}}
        try:
            question = inspector.default_prompt
            # (prefix, image, suffix) of each frame, as the daemon asks it (libmtmd's media for a pair)
            asked = [inspector.frame_sequence("api", question, inspector.encode_frame(
                "api", part_image(i, 336, 336, defect=i % 3 == 0))) for i in range(args.frames + 1)]
            schemas = {"bundle": inspector.bundle.manifest.verdict_schema, "boolean and enum": BOOL_AND_ENUM}
            for name, schema in schemas.items():
                new = schema_to_grammar(schema)
                grammars = {"optional spaces": optional_spaces(new), "one spelling": new}
                assert grammars["optional spaces"] != new
                for grammar in grammars.values():  # the first of each: buffers, the prompt's KV (not counted)
                    inspector.generate(*asked[-1], grammar, args.max_tokens)
                rows: dict[str, dict[str, list[float]]] = {k: {"steps": [], "tokens": [], "ms": []} for k in grammars}
                for sequence in asked[:-1]:
                    for kind, grammar in grammars.items():
                        t0 = time.perf_counter()
                        gen = inspector.generate(*sequence, grammar, args.max_tokens)
                        rows[kind]["ms"].append((time.perf_counter() - t0) * 1000)
                        rows[kind]["steps"].append(gen.steps)
                        rows[kind]["tokens"].append(gen.tokens)
                        json.loads(gen.text)  # both spellings are strict JSON
                out = {kind: {"steps_mean": round(statistics.mean(r["steps"]), 1),
                              "tokens_mean": round(statistics.mean(r["tokens"]), 1),
                              "p50_ms": pct(r["ms"], 0.5), "p90_ms": pct(r["ms"], 0.9)} for kind, r in rows.items()}
                out["steps_ratio"] = round(out["one spelling"]["steps_mean"] / out["optional spaces"]["steps_mean"], 3)
                out["p50_ratio"] = round(out["one spelling"]["p50_ms"] / out["optional spaces"]["p50_ms"], 3)
                report["schemas"][name] = out
        finally:
            inspector.close()
        report["load_after"] = os.getloadavg()[0]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
