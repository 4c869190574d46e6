"""Verdict agreement between four cameras as parallel sequences and one at a time, and where they part.

Usage: python benchmarks/parallel_agreement.py BUNDLE_DIR [CONFIG.yaml]
For each frame: same text?, the first token where the two paths differ, and the one-at-a-time
path's logit gap between its token and the batched path's token there (a near-tie means the
batched kernels' rounding decided it, not a bug in the sequence bookkeeping). The KV layout of the
batch context is the config's `model.batch_kv_cache` (unified, or one stream per sequence).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

import edge_runtime.inference.engines  # noqa: F401  # onnxruntime first, then llama_cpp
from edge_runtime.cli.bench import bench_images
from edge_runtime.config import load_config
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.core.images import decode_image
from edge_runtime.inference.inspector import Inspector


def main() -> None:
    bundle = load_bundle(Path(sys.argv[1]))
    settings = load_config(Path(sys.argv[2]) if len(sys.argv) > 2 else None).model
    ins = Inspector(bundle, settings.model_copy(update={"fast_forward": False}), "bench")
    try:
        items = [ins.sequence(ins.default_prompt, ins.encode(decode_image(d))) for d in bench_images(4)]
        single = [ins.generate(*it, ins.grammar, ins.max_tokens) for it in items]
        ins.language.generate_batch(items, ins.grammar, ins.max_tokens)  # warm the batch context
        t0 = time.perf_counter()
        batched = ins.language.generate_batch(items, ins.grammar, ins.max_tokens)
        elapsed = time.perf_counter() - t0
        one = sum(g.decode_ms for g in single) / 1000
        print(f"generation: {sum(g.tokens for g in batched) / batched[0].decode_ms * 1000:.0f} tok/s as 4 parallel "
              f"sequences ({elapsed * 1000:.0f} ms with prefill) vs {sum(g.tokens for g in single) / one:.0f} tok/s "
              "one at a time")
        same = 0
        for i, (s, b) in enumerate(zip(single, batched, strict=True)):
            if s.text == b.text:
                same += 1
                print(f"frame {i}: same ({s.tokens} tokens)")
                continue
            sb = b.token_ids
            k = next((j for j in range(min(len(s.token_ids), len(sb))) if s.token_ids[j] != sb[j]), -1)
            prefix, image, suffix = items[i]
            logits = ins.language.prompt_logits(prefix, image, list(suffix) + s.token_ids[:max(k, 0)])
            gap = float(logits[s.token_ids[k]] - logits[sb[k]]) if k >= 0 else float("nan")
            print(f"frame {i}: differ at token {k}; one-at-a-time logit of its token minus the batched "
                  f"path's token there: {gap:.4f}\n"
                  f"  single : {s.text!r}\n  batched: {b.text!r}")
        print(f"same verdicts {same}/4 (fast_forward off, greedy)")
        first_token_logits(ins, items)
    finally:
        ins.close()


def first_token_logits(ins: Inspector, items: list) -> None:  # type: ignore[type-arg]
    """Logits after each prompt: the one-at-a-time context against the parallel-sequence context.
    Each prompt is prefilled alone in both, so a difference here comes from the contexts (unified KV
    cache, shared-prefix copy, cache size), not from several sequences sharing a decode step."""
    lm = ins.language
    for copy_prefix in (True, False):
        parallel = lm.parallel.prompt_logits(items, copy_prefix=copy_prefix)
        diffs = [float(np.abs(par - lm.prompt_logits(*item)).max()) for par, item in zip(parallel, items, strict=True)]
        print(f"first-token logits, parallel context ({'prefix copied' if copy_prefix else 'prefix per seq'})"
              f" vs one at a time: max |diff| per frame {[round(d, 5) for d in diffs]}")


if __name__ == "__main__":
    main()
