"""Verdict agreement between four cameras as parallel sequences and one at a time, and where they part.

Usage: python benchmarks/parallel_agreement.py BUNDLE_DIR [CONFIG.yaml]
For each frame: same text?, the first token where the two paths differ, and the one-at-a-time
path's logit gap between its token and the batched path's token there (a near-tie means the
batched kernels' rounding decided it, not a bug in the sequence bookkeeping).
"""

from __future__ import annotations

import sys
from pathlib import Path

import edge_runtime.engines  # noqa: F401  # onnxruntime first, then llama_cpp
from edge_runtime.bench import bench_images
from edge_runtime.bundle import load_bundle
from edge_runtime.config import load_config
from edge_runtime.inspector import Inspector
from edge_runtime.vision import decode_image


def main() -> None:
    bundle = load_bundle(Path(sys.argv[1]))
    settings = load_config(Path(sys.argv[2]) if len(sys.argv) > 2 else None).model
    ins = Inspector(bundle, settings.model_copy(update={"fast_forward": False}), "bench")
    try:
        items = [ins.sequence(ins.default_prompt, ins.encode(decode_image(d))) for d in bench_images(4)]
        single = [ins.generate(*it, ins.grammar, ins.max_tokens) for it in items]
        batched = ins.language.generate_batch(items, ins.grammar, ins.max_tokens)
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
    finally:
        ins.close()


if __name__ == "__main__":
    main()
