"""What a batched generation step costs inside llama.cpp by its shape, and what a change of shape costs.

ggml-cuda replays a step as one CUDA graph only after two steps of the same shape in a row (rows,
tokens per row, outputs, KV view); a step of another shape launches every kernel again. This times
raw steps of the parallel context (llm/parallel.py; one KV stream per sequence, or --kv unified), each
synchronized:
  steady   the same shape every step: rows x tokens per row, one output per row
  churn    tokens per row alternating between t and t+1, so no two steps in a row share a shape
  reset10  the steady shape with one step of another shape every 10th step, as a camera's prefill or a
           row joining or leaving would make it
Every step rewrites the same positions (the cells after the prompt are removed), so the KV view holds.
Prints a table of p50 ms per step and the ratio to one row steady.

    python benchmarks/step_shapes.py BUNDLE_DIR [CONFIG.yaml] [--rows 1,2,4,8] [--tokens 1,2,4] [--steps 60]
                                     [--kv unified]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import edge_runtime.inference.engines  # noqa: F401  # onnxruntime first, then llama_cpp
from edge_runtime.config import load_config
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.inference.inspector import Inspector

PROMPT = 384  # tokens of each slot's prompt: an image's 256 and a question's


def step(ctx, feed, rows: int, per_row: int, base: int) -> float:  # type: ignore[no-untyped-def]
    """One decode of `rows` sequences x `per_row` tokens at positions base..; ms, synchronized."""
    batch = feed.tokens.struct
    i = 0
    for s in range(rows):
        for k in range(per_row):
            batch.token[i] = 100 + (s * 7 + k) % 50
            batch.pos[i] = base + k
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = s
            batch.logits[i] = int(k == per_row - 1)
            i += 1
    batch.n_tokens = i
    t0 = time.perf_counter()
    ctx.decode(batch)
    ctx.synchronize()
    ms = (time.perf_counter() - t0) * 1000
    for s in range(rows):
        ctx.memory_seq_rm(s, base, -1)
    return ms


def run(ctx, feed, rows: int, per_row: int, mode: str, steps: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for n in range(steps):
        t = per_row
        if mode == "churn" and n % 2:
            t = per_row + 1
        if mode == "reset10" and n % 10 == 9:
            t = per_row + 1
        times.append((t, step(ctx, feed, rows, t, PROMPT)))
    kept = [ms for t, ms in times[steps // 3:] if t == per_row or mode == "churn"]
    return statistics.median(kept)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("config", type=Path, nargs="?")
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--tokens", default="1,2,4")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--kv", choices=("per_sequence", "unified"), default="per_sequence", help="model.batch_kv_cache")
    args = ap.parse_args()
    rows_list = [int(x) for x in args.rows.split(",")]
    tokens_list = [int(x) for x in args.tokens.split(",")]
    settings = load_config(args.config).model
    with Inspector(load_bundle(args.bundle), settings.model_copy(update={"batch_kv_cache": args.kv}),
                   "bench") as ins:
        lm = ins.language
        ctx = lm.parallel._context(max(rows_list), PROMPT + 64)
        prompt = [100 + i % 50 for i in range(PROMPT)]
        for s in range(max(rows_list)):
            lm.feed.token_ids(ctx, prompt, 0, want_last_logits=False, seq=s)
        print(f"{args.bundle.name}, {args.kv} KV: ms per step inside llama_decode (synchronized), "
              f"p50 of {args.steps} steps\n"
              "rows  tokens/row  steady  churn  reset10   steady / one row steady")
        one = None
        for t in tokens_list:
            for r in rows_list:
                got = {m: run(ctx, lm.feed, r, t, m, args.steps) for m in ("steady", "churn", "reset10")}
                one = one or got["steady"]
                print(f"{r:4}  {t:10}  {got['steady']:6.2f}  {got['churn']:5.2f}  {got['reset10']:7.2f}"
                      f"   {got['steady'] / one:.2f}x", flush=True)


if __name__ == "__main__":
    main()
