"""How llama.cpp computes our batched steps: graphs per step, CUDA graph captures, time per step.

Serves N image verdicts at once through the inspector's parallel sequences (as N cameras ready at
the same moment), twice (the first warms up), and counts from llama.cpp's own log, per `llama_decode`
of generated tokens:
  graphs       graphs llama.cpp computed (LLAMA_BATCH_DEBUG's "added ubatch"): 1 per step is the goal
               (llm/parallel.py's module docstring)
  cuda_*       ggml-cuda's CUDA graph messages: warm-up completions (a capture), resets (a step of
               another shape after a capture), reuses of a graph llama.cpp kept
and the mean milliseconds inside `llama_decode` per step. Prints one JSON line per N.

    python benchmarks/step_graphs.py --model BUNDLE [--sequences 1,4] [--gpu-layers -1] [--fast-forward on]
                                     [--steady true|false]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LLAMA_BATCH_DEBUG", "1")  # read when a context is made: before any is
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge_runtime.config import Config
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.core.samples import part_image
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.runtime import log_to
from edge_runtime.inference.llm.sequence import Prompt

_MESSAGES = {"graphs": b"added ubatch to split", "cuda_captures": b"CUDA graph warmup complete",
             "cuda_resets": b"CUDA graph warmup reset", "cuda_reused": b"CUDA Graph id",
             "cuda_update_failed": b"CUDA graph update failed"}
_counts = dict.fromkeys(_MESSAGES, 0)
_cuda_lines = [0]  # every log line naming CUDA, the load's included: 0 means ggml-cuda's log never reached us


def _log(text: bytes) -> None:
    for name, needle in _MESSAGES.items():
        if needle in text:
            _counts[name] += 1
    if b"CUDA" in text:
        _cuda_lines[0] += 1


def serve(ins: Inspector, n: int) -> dict[str, Any]:
    """N verdicts at once; counts and times over the decodes of generated tokens (not prefills)."""
    frames = [part_image(7 + i, 640, 480, defect=i % 2 == 0)[:, :, ::-1].copy() for i in range(n)]
    prompts = [Prompt(*ins.sequence(ins.default_prompt, ins.encode(f)), ins.grammar, ins.max_tokens, tag=i)
               for i, f in enumerate(frames)]
    feed = ins.language.feed
    decode = feed.decode
    steps: list[dict[str, Any]] = []

    def counted(ctx: Any, batch: Any) -> None:
        before = dict(_counts)
        t0 = time.perf_counter()
        decode(ctx, batch)
        ms = (time.perf_counter() - t0) * 1000
        steps.append({"tokens": batch.n_tokens, "ms": ms, "image": not batch.token}
                     | {k: _counts[k] - before[k] for k in _counts})

    feed.decode = counted  # type: ignore[method-assign]
    answers: dict[int, Any] = {}
    try:
        ins.language.serve(prompts, lambda p, g: answers.__setitem__(p.tag, g), None)
    finally:
        feed.decode = decode  # type: ignore[method-assign]
    # All N start together, so every prefill comes first: each image block, then its prompt's text after
    # the image. The steps are the decodes after the last image's text.
    last_image = max(i for i, s in enumerate(steps) if s["image"])
    gen = steps[last_image + 2:]
    total = {k: sum(s[k] for s in gen) for k in _counts}
    return {"sequences": n, "steps": len(gen), "graphs_per_step": round(total["graphs"] / max(1, len(gen)), 3),
            "tokens_per_step": round(sum(s["tokens"] for s in gen) / max(1, len(gen)), 2),
            "ms_per_step": round(sum(s["ms"] for s in gen) / max(1, len(gen)), 3),
            **{k: v for k, v in total.items() if k != "graphs"},
            "tokens_per_verdict": round(sum(g.tokens for g in answers.values()) / max(1, len(answers)), 1),
            "cuda_log_lines": _cuda_lines[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="a bundle folder")
    ap.add_argument("--sequences", default="1,4", help="verdicts served at once, one run each")
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--fast-forward", choices=("on", "off"), default="on")
    ap.add_argument("--steady", choices=("true", "false"), default="false",
                    help="model.steady_steps (off by default): one token and one logit row per sequence in a "
                    "batched step")
    args = ap.parse_args()
    log_to(_log)
    cfg = Config(device_id="step-graphs")
    settings = cfg.model.model_copy(update={"warmup": False, "gpu_layers": args.gpu_layers, "threads": args.threads,
                                            "fast_forward": args.fast_forward == "on", "context_size": 4096,
                                            "steady_steps": args.steady == "true"})
    ins = Inspector(load_bundle(args.model), settings, cfg.device_id)
    try:
        for n in [int(x) for x in args.sequences.split(",")]:
            serve(ins, n)  # warm: the grammar's matcher, the parallel context, CUDA's first graphs
            print(json.dumps({"fast_forward": args.fast_forward, "steady": args.steady, "gpu_layers": args.gpu_layers}
                             | serve(ins, n)),
                  flush=True)
    finally:
        ins.close()


if __name__ == "__main__":
    main()
