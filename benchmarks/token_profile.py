"""Where the per-token microseconds go: cProfile over greedy verdict generations.

Usage: PYTHONPATH=.:tests python benchmarks/token_profile.py BUNDLE_DIR [FRAMES]
"""

from __future__ import annotations

import cProfile
import pstats
import sys
from pathlib import Path

import edge_runtime.inference.engines  # noqa: F401  # onnxruntime first, then llama_cpp
from edge_runtime.config import Config
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.inference.inspector import Inspector
from tests.support.images import synthetic_frames


def main() -> None:
    bundle = load_bundle(Path(sys.argv[1]))
    frames = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    cfg = Config(device_id="profile")
    cfg.model.threads = 2
    ins = Inspector(bundle, cfg.model, "profile")
    try:
        prefix, suffix = ins.prompt_parts(ins.default_prompt)
        embeds = [ins.encode(f).embeds for f in synthetic_frames(frames, seed=5)]
        for e in embeds[:3]:
            ins.generate(prefix, e, suffix, ins.grammar, 200)  # warm caches and matchers
        prof = cProfile.Profile()
        tokens, decode_ms = 0, 0.0
        prof.enable()
        for e in embeds:
            gen = ins.generate(prefix, e, suffix, ins.grammar, 200)
            tokens, decode_ms = tokens + gen.tokens, decode_ms + gen.decode_ms
        prof.disable()
        print(f"{tokens} tokens, {decode_ms:.0f} ms generating, {decode_ms * 1000 / tokens:.0f} µs/token (profiled)")
        pstats.Stats(prof).sort_stats("tottime").print_stats(16)
    finally:
        ins.close()


if __name__ == "__main__":
    main()
