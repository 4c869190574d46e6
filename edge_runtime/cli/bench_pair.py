"""`edge-runtime bench` on a GGUF + mmproj bundle (format 2): our stages against the raw engine.

Raw = libmtmd and llama.cpp alone on the same prompt: `mtmd_helper_eval_chunks` (tokenize, encode,
decode every chunk of one sequence from position 0) and llama.cpp's own grammar+greedy sampler chain
for as many tokens as ours produced. Ours = `Inspector.encode` (libmtmd's preprocessing + the mmproj)
then our prefill (prefix reuse on) and generation (llguidance, forced tokens).
"""

from __future__ import annotations

import resource
import statistics
import time
from typing import Any

import cv2

from edge_runtime.core.errors import InferenceError
from edge_runtime.core.images import decode_image
from edge_runtime.inference.encoding import MediaEncoded
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.handles import Sampler
from edge_runtime.inference.llm.model import LanguageModel


def percentiles(values: list[float]) -> dict[str, float]:
    """p50, p95 and mean of one stage's timings (ms), for both benches' reports."""
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"p50": round(statistics.median(ordered), 3), "p95": round(p95, 3),
            "mean": round(statistics.fmean(ordered), 3)}


def forced_tokens(gen: Any) -> int:
    """Tokens of a verdict that the grammar forced rather than the model chose (fast-forward's, counted
    as they are taken: a step may also take a draft model's guesses, so steps do not tell)."""
    return int(gen.forced)


def run_pair_bench(inspector: Inspector, report: Any, images: list[bytes], bar: Any, energy: Any = None) -> Any:
    """Fill `report` (cli/bench.BenchReport) for a format-2 bundle; the caller adds throughput/parallel."""
    assert inspector.mtmd is not None
    stages: dict[str, list[float]] = {k: [] for k in ("decode_image", "preprocess", "encode", "prefill",
                                                       "generate", "total")}
    raw_prompt, raw_gen_tps, raw_free_tps, ours_prompt = [], [], [], []
    prompt_tps, gen_tps, gen_tokens, forced, energies = [], [], [], [], []
    gen = None
    for i, data in enumerate(images):
        raw_first = i % 2 == 1
        t0 = time.perf_counter()
        frame = decode_image(data)
        t1 = time.perf_counter()
        if raw_first:
            raw = raw_mtmd(inspector, frame, inspector.grammar, inspector.max_tokens)
        t1b = time.perf_counter()
        enc = inspector.encode(frame)
        prefix, image, suffix = inspector.sequence(inspector.default_prompt, enc)
        gen = inspector.generate(prefix, image, suffix, inspector.grammar, inspector.max_tokens)
        t3 = time.perf_counter()
        inspector.parse_verdict(gen)
        if not raw_first:
            raw = raw_mtmd(inspector, frame, inspector.grammar, inspector.max_tokens)
        raw_prompt.append(raw[0])
        raw_gen_tps.append(raw[1])
        raw_free_tps.append(raw_mtmd(inspector, frame, None, max(1, gen.tokens))[1])
        ours_prompt.append(enc.encode_ms + enc.preprocess_ms + gen.prefill_ms)
        for key, value in (("decode_image", (t1 - t0) * 1000), ("preprocess", enc.preprocess_ms),
                           ("encode", enc.encode_ms), ("prefill", gen.prefill_ms), ("generate", gen.decode_ms),
                           ("total", (t1 - t0 + t3 - t1b) * 1000)):
            stages[key].append(value)
        prompt_tps.append((gen.prompt_tokens - gen.prefix_reused) / max(1e-9, gen.prefill_ms / 1000))
        gen_tps.append(gen.tokens / max(1e-9, gen.decode_ms / 1000))
        gen_tokens.append(gen.tokens)
        forced.append(forced_tokens(gen))
        if energy is not None and (e := energy(t0, t3)) is not None:
            energies.append(e)
        bar(3)
    assert gen is not None
    report.stages_ms = {k: percentiles(v) for k, v in stages.items()}
    report.tokens = {"prompt_tokens": gen.prompt_tokens, "prompt_tok_s": round(statistics.median(prompt_tps), 1),
                     "gen_tokens_mean": round(statistics.fmean(gen_tokens), 1),
                     "forced_share": round(sum(forced) / max(1, sum(gen_tokens)), 3),
                     "gen_tok_s": round(statistics.median(gen_tps), 1),
                     "engine": inspector.language.constraint_engine}
    if energies:
        report.energy_j_per_inspection = round(statistics.fmean(energies), 4)
    report.raw = {"encode_ms_p50": round(statistics.median(raw_prompt), 3),  # helper: encode + prompt decode
                  "prefill_ms_p50": round(statistics.median(raw_prompt), 3),
                  "gen_tok_s": round(statistics.median(raw_gen_tps), 1),
                  "gen_tok_s_unconstrained": round(statistics.median(raw_free_tps), 1)}
    report.ratios = {
        # throughput of the whole prompt (image encode + decode): mtmd_helper_eval_chunks' time / ours
        "encode_throughput_ours_vs_raw": round(statistics.median(raw_prompt) / statistics.median(ours_prompt), 3),
        "generation_throughput_ours_vs_raw": round(report.tokens["gen_tok_s"] / report.raw["gen_tok_s"], 3),
        "generation_ours_vs_raw_unconstrained": round(
            report.tokens["gen_tok_s"] / report.raw["gen_tok_s_unconstrained"], 3),
    }
    report.prefix_cache = _prefix_reuse(inspector, images[0])
    report.peak_rss_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return report


def raw_mtmd(inspector: Inspector, frame: Any, grammar: str | None, max_tokens: int) -> tuple[float, float]:
    """(prompt ms, generated tok/s) of libmtmd's helper path + llama.cpp's sampler chain alone."""
    mtmd, lm = inspector.mtmd, inspector.language
    assert mtmd is not None
    p = inspector.bundle.manifest.prompt
    text = p.template.format(system=p.system, image=mtmd.marker, prompt=inspector.default_prompt)
    rgb = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
    lm.forget_prefix(clear=True)
    t0 = time.perf_counter()
    with mtmd.tokenize(text, [rgb], add_special=True) as chunks:
        mtmd.eval_chunks(lm.ctx, chunks, 0, 0, lm.n_batch)
    prompt_ms = (time.perf_counter() - t0) * 1000
    tps = raw_sampling(lm, grammar, max_tokens)
    lm.forget_prefix(clear=True)
    return prompt_ms, tps


def raw_sampling(lm: LanguageModel, grammar: str | None, max_tokens: int) -> float:
    """Tokens/s of llama.cpp's own grammar + greedy chain from the prefilled context (no grammar: greedy
    alone, exactly `max_tokens` tokens, end-of-generation ones included): the raw side of both benches."""
    with Sampler.chain() as chain:
        if grammar is not None:
            chain.add(Sampler.grammar(lm.vocab, grammar))
        chain.add(Sampler.greedy())
        t1 = time.perf_counter()
        produced = 0
        for _ in range(max(1, max_tokens)):
            token = chain.sample(lm.ctx)
            if grammar is not None and lm.vocab.is_eog(token):
                break
            produced += 1
            try:
                lm.ctx.decode_next(token)
            except InferenceError:  # the context is full: the timing so far stands
                break
        elapsed = time.perf_counter() - t1
    return produced / elapsed if elapsed > 0 else 0.0


def _prefix_reuse(inspector: Inspector, data: bytes) -> dict[str, float]:
    """Time to first token with a ~200-token system text re-read vs reused, on this bundle's template."""
    instructions = " ".join(["Check the weld seam, the bolt holes, the surface finish and the edges."] * 12)
    enc = inspector.encode(decode_image(data))
    assert isinstance(enc, MediaEncoded)
    prefix, image, suffix = inspector.sequence(inspector.default_prompt, enc, system=instructions)
    lm = inspector.language
    runs: dict[bool, list[float]] = {True: [], False: []}
    saved = lm.reuse_prefix
    try:
        for reuse in (False, True, False, True, False, True):
            lm.reuse_prefix = reuse
            lm.generate(prefix, image, suffix, inspector.grammar, 1)  # primes the cache
            runs[reuse].append(lm.generate(prefix, image, suffix, inspector.grammar, 1).prefill_ms)
    finally:
        lm.reuse_prefix = saved
    cold, warm = statistics.median(runs[False]), statistics.median(runs[True])
    return {"fixed_prompt_tokens": len(prefix), "ttft_ms_reread": round(cold, 3), "ttft_ms_reused": round(warm, 3),
            "speedup": round(cold / warm, 2) if warm else 0.0}
