"""Where the time of a batched generation step goes: llama_decode against token picking.

Usage: python benchmarks/parallel_profile.py BUNDLE_DIR [CONFIG.yaml] [--cprofile]
For 1, 2, 4 and 8 cameras as parallel sequences (one KV stream per sequence, then a unified KV
cache), with the picks of a step on threads and inline (the engine's own choice: threads only for
llama.cpp's GBNF sampler on a large vocabulary), it prints generation tok/s, decode steps, and per
step the milliseconds inside llama_decode (the GPU work, synchronized) and outside it (picking the
next token of every sequence under the grammar, forced tokens, batch bookkeeping). With --cprofile
it adds the top functions of a 4-camera batch with inline picks (cProfile sees one thread only).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
from pathlib import Path

import edge_runtime.inference.engines  # noqa: F401  # onnxruntime first, then llama_cpp
from edge_runtime.cli.bench import bench_images
from edge_runtime.config import load_config
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.core.images import decode_image
from edge_runtime.inference.inspector import Inspector

SEQUENCES = (1, 2, 4, 8)


def run(ins: Inspector, items: list, repeats: int = 3) -> dict[str, float]:  # type: ignore[type-arg]
    lm = ins.language
    lm.generate_batch(items, ins.grammar, ins.max_tokens)  # warm: contexts, matchers, CUDA graphs
    tokens = steps = 0
    gen_s = decode_s = 0.0
    for _ in range(repeats):
        gens = lm.generate_batch(items, ins.grammar, ins.max_tokens)
        tokens += sum(g.tokens for g in gens)
        gen_s += gens[0].decode_ms / 1000
        steps += gens[0].steps
        decode_s += gens[0].llama_decode_ms / 1000
    return {"tok_s": tokens / gen_s, "tokens": tokens / repeats, "steps": steps / repeats,
            "gen_ms": gen_s * 1000 / repeats, "decode_ms": decode_s * 1000 / repeats}


def main() -> None:
    bundle = load_bundle(Path(sys.argv[1]))
    config = Path(sys.argv[2]) if len(sys.argv) > 2 and not sys.argv[2].startswith("--") else None
    settings = load_config(config).model
    frames = [decode_image(d) for d in bench_images(max(SEQUENCES))]
    print(f"{bundle.manifest.name}: generation of {', '.join(map(str, SEQUENCES))} cameras as parallel sequences\n"
          "kv cache     picks    cams  tok/s  tokens/cam  steps  gen ms  in llama_decode ms/step  outside ms/step")
    for kv in ("per_sequence", "unified"):
        with Inspector(bundle, settings.model_copy(update={"batch_kv_cache": kv}), "bench") as ins:
            ins.language.feed.profile = True
            items = [ins.sequence(ins.default_prompt, ins.encode(f)) for f in frames]
            base = None
            for threads in (True, False):
                ins.language.parallel.pick_threads = threads
                for n in SEQUENCES:
                    if n == 1 and not threads:
                        continue
                    r = run(ins, items[:n])
                    base = base or r["tok_s"]
                    steps = max(r["steps"], 1)
                    print(f"{kv:12} {'threads' if threads else 'inline':8} {n:4}  {r['tok_s']:6.0f}  "
                          f"{r['tokens'] / n:10.1f}  {r['steps']:5.0f}  {r['gen_ms']:6.1f}  "
                          f"{r['decode_ms'] / steps:23.2f}  {(r['gen_ms'] - r['decode_ms']) / steps:15.2f}"
                          f"   ({r['tok_s'] / base:.2f}x one camera)")
            if "--cprofile" in sys.argv and kv == "per_sequence":
                ins.language.parallel.pick_threads = False
                prof = cProfile.Profile()
                prof.enable()
                ins.language.generate_batch(items[:4], ins.grammar, ins.max_tokens)
                prof.disable()
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(14)
                print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:4000])


if __name__ == "__main__":
    main()
