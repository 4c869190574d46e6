"""`edge-runtime bench`: per-stage timings of the real inspector, and ratios against the raw engines.

In one run it measures: our pipeline per stage (decode image, preprocess, encode, prefill,
generate) with p50/p95; the same model through ONNX Runtime and llama-cpp-python alone on the same
tensors and tokens; prefix-cache reuse against re-reading a long fixed prompt; and sustained
inspections/s sequentially and with the encoder of frame N+1 overlapped with generation of frame N.
"""

from __future__ import annotations

import json
import resource
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from edge_runtime.cli.bench_pair import forced_tokens, percentiles, raw_sampling, run_pair_bench
from edge_runtime.core.batch import Encoded
from edge_runtime.core.images import decode_image
from edge_runtime.core.samples import part_image
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.feed import ImagePart
from edge_runtime.inference.llm.model import LanguageModel
from edge_runtime.inference.llm.picker import GREEDY
from edge_runtime.inference.llm.runtime import engine_info


@dataclass
class BenchReport:
    machine: dict[str, Any]
    model: dict[str, Any]
    frames: int
    stages_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    tokens: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, float] = field(default_factory=dict)
    ratios: dict[str, float] = field(default_factory=dict)
    throughput: dict[str, float] = field(default_factory=dict)
    prefix_cache: dict[str, float] = field(default_factory=dict)
    peak_rss_mb: float = 0.0
    energy_j_per_inspection: float | None = None

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2)


def bench_images(count: int) -> list[bytes]:
    """Fixed, varied JPEGs (same bytes on every run)."""
    out = []
    for i in range(count):
        _, buf = cv2.imencode(".jpg", part_image(i, 640, 480, defect=i % 3 == 0), [cv2.IMWRITE_JPEG_QUALITY, 90])
        out.append(buf.tobytes())
    return out


def machine_info() -> dict[str, Any]:
    import os
    import platform

    import onnxruntime as ort

    from edge_runtime.core.cpuinfo import read_cpuinfo

    cpu = read_cpuinfo()  # names the cores on ARM too (no `model name` there); platform.processor() is empty
    return {"cpu": cpu.describe() if cpu else platform.machine(), "arch": platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(), "onnxruntime": ort.__version__,
            **engine_info(),
            "date": time.strftime("%Y-%m-%d")}


def run_bench(inspector: Inspector, frames: int = 20, progress: bool = True, energy: Any = None) -> BenchReport:
    images = bench_images(frames)
    report = BenchReport(machine_info(), inspector.bundle.describe(), frames)
    bar = _progress(frames * 3 + 6, progress)

    # 1. Our pipeline, stage by stage (the same calls the daemon makes), and right beside each
    #    stage the raw engine on the same input, alternating which goes first so neither gets the
    #    warmer caches: a bare ORT session run, and llama.cpp's own grammar+greedy sampler chain.
    stages: dict[str, list[float]] = {k: [] for k in ("decode_image", "preprocess", "encode", "prefill",
                                                       "generate", "total")}
    prompt_tps, gen_tps, gen_tokens, forced, energies = [], [], [], [], []
    raw_encode, raw_prefill, raw_gen_tps, raw_free_tps = [], [], [], []
    vision, preprocessor = inspector.vision, inspector.preprocessor
    drafted = _draft_counts(inspector)
    if vision is None or preprocessor is None:  # a GGUF + mmproj bundle: libmtmd encodes (bench_pair.py)
        run_pair_bench(inspector, report, images, bar, energy)
        report.tokens.update(_draft_share(inspector, drafted))
        report.throughput = _throughput(inspector, images)
        report.throughput.update(_parallel(inspector, images[:4]))
        bar.close()
        return report
    session = vision.session
    assert session is not None
    name_in, name_out = vision.input_name, vision.output_name
    embeds_first = None
    for i, data in enumerate(images):
        raw_first = i % 2 == 1
        t0 = time.perf_counter()
        frame = decode_image(data)
        t1 = time.perf_counter()
        pixels, grid = preprocessor.process(frame)
        t2 = time.perf_counter()
        feed = {name_in: pixels}
        if raw_first:
            raw_encode.append(_time_ms(session.run, [name_out], feed))
        t2b = time.perf_counter()
        out = vision.encode(pixels)
        t3 = time.perf_counter()
        if not raw_first:
            raw_encode.append(_time_ms(session.run, [name_out], feed))
        embeds = out.reshape(-1, out.shape[-1])
        embeds_first = embeds if embeds_first is None else embeds_first
        t3b = time.perf_counter()
        prefix, image, suffix = inspector.sequence(
            inspector.default_prompt, Encoded(embeds, frame.shape[1], frame.shape[0], 0, 0, grid))
        t3c = time.perf_counter()
        if raw_first:
            bar()
            raw = _raw_llama(inspector.language, prefix, image, suffix, inspector.grammar, inspector.max_tokens)
        t3d = time.perf_counter()
        gen = inspector.generate(prefix, image, suffix, inspector.grammar, inspector.max_tokens)
        t4 = time.perf_counter()
        inspector.parse_verdict(gen)
        if not raw_first:
            bar()
            raw = _raw_llama(inspector.language, prefix, image, suffix, inspector.grammar, inspector.max_tokens)
        raw_prefill.append(raw[0])
        raw_gen_tps.append(raw[1])
        # llama.cpp with no grammar at all, the same number of tokens: the ceiling a constraint
        # engine is measured against (forced tokens may take ours above it).
        raw_free_tps.append(_raw_llama(inspector.language, prefix, image, suffix, None, max(1, gen.tokens))[1])
        for key, value in (("decode_image", t1 - t0), ("preprocess", t2 - t1), ("encode", t3 - t2b),
                           ("prefill", gen.prefill_ms / 1000), ("generate", gen.decode_ms / 1000),
                           ("total", (t2 - t0) + (t3 - t2b) + (t3c - t3b) + (t4 - t3d))):
            stages[key].append(value * 1000)
        prompt_tps.append((gen.prompt_tokens - gen.prefix_reused) / (gen.prefill_ms / 1000))
        gen_tps.append(gen.tokens / (gen.decode_ms / 1000))
        gen_tokens.append(gen.tokens)
        forced.append(forced_tokens(gen))
        if energy is not None:
            e = energy(t0, t4)
            if e is not None:
                energies.append(e)
        bar(2)
    report.stages_ms = {k: percentiles(v) for k, v in stages.items()}
    report.tokens = {"prompt_tokens": gen.prompt_tokens, "prompt_tok_s": round(statistics.median(prompt_tps), 1),
                     "gen_tokens_mean": round(statistics.fmean(gen_tokens), 1),
                     "forced_share": round(sum(forced) / max(1, sum(gen_tokens)), 3),
                     "gen_tok_s": round(statistics.median(gen_tps), 1)}
    if energies:
        report.energy_j_per_inspection = round(statistics.fmean(energies), 4)
    report.raw = {"encode_ms_p50": round(statistics.median(raw_encode), 3),
                  "prefill_ms_p50": round(statistics.median(raw_prefill), 3),
                  "gen_tok_s": round(statistics.median(raw_gen_tps), 1),
                  "gen_tok_s_unconstrained": round(statistics.median(raw_free_tps), 1)}
    report.tokens["engine"] = inspector.language.constraint_engine
    report.tokens.update(_draft_share(inspector, drafted))
    report.ratios = {
        "encode_throughput_ours_vs_raw": round(report.raw["encode_ms_p50"] / report.stages_ms["encode"]["p50"], 3),
        "generation_throughput_ours_vs_raw": round(report.tokens["gen_tok_s"] / report.raw["gen_tok_s"], 3),
        "generation_ours_vs_raw_unconstrained": round(
            report.tokens["gen_tok_s"] / report.raw["gen_tok_s_unconstrained"], 3),
    }
    assert embeds_first is not None

    # 3. Prefix KV reuse against re-reading a long fixed prompt (~200 tokens of instructions).
    report.prefix_cache = _prefix_reuse(inspector, embeds_first)
    bar(3)

    # 4. Sustained throughput: sequential vs encode(N+1) overlapped with generate(N); four cameras'
    #    frames one at a time vs as four parallel sequences of one llama.cpp batch.
    report.throughput = _throughput(inspector, images)
    report.throughput.update(_parallel(inspector, images[:4]))
    bar(3)
    report.peak_rss_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    bar.close()
    return report


def _time_ms(fn: Any, *args: Any) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - t0) * 1000


def _raw_llama(lm: LanguageModel, prefix: list[int], image: ImagePart, suffix: list[int], grammar: str | None,
               max_tokens: int) -> tuple[float, float]:
    """llama-cpp-python alone: decode the same batches, sample with llama.cpp's grammar+greedy chain
    (no grammar: greedy alone, and exactly `max_tokens` tokens, end-of-generation tokens included)."""
    lm.forget_prefix(clear=True)  # read the whole prompt, as llama-cpp-python alone would
    t0 = time.perf_counter()
    lm.prefill(prefix, image, suffix, max_tokens)
    prefill_ms = (time.perf_counter() - t0) * 1000
    tps = raw_sampling(lm, grammar, max_tokens)
    lm.forget_prefix(clear=True)  # the KV cache no longer holds the cached prefix alone
    return prefill_ms, tps


def _prefix_reuse(inspector: Inspector, embeds: np.ndarray) -> dict[str, float]:
    lm = inspector.language
    instructions = " ".join(["Check the weld seam, the bolt holes, the surface finish and the edges."] * 12)
    prefix = lm.tokenize(f"<|im_start|>system\n{instructions}<|im_end|>\n<|im_start|>user\n<image>")
    suffix = lm.tokenize("</image>\nDefect?<|im_end|>\n<|im_start|>assistant\n")
    runs: dict[bool, list[float]] = {True: [], False: []}
    saved = lm.reuse_prefix
    try:
        for reuse in (False, True, False, True, False, True):
            lm.reuse_prefix = reuse
            lm.generate(prefix, embeds, suffix, inspector.grammar, 1, GREEDY)  # primes the cache
            gen = lm.generate(prefix, embeds, suffix, inspector.grammar, 1, GREEDY)
            runs[reuse].append(gen.prefill_ms)
    finally:
        lm.reuse_prefix = saved
    cold, warm = statistics.median(runs[False]), statistics.median(runs[True])
    return {"fixed_prompt_tokens": len(prefix), "ttft_ms_reread": round(cold, 3), "ttft_ms_reused": round(warm, 3),
            "speedup": round(cold / warm, 2) if warm else 0.0}


def _throughput(inspector: Inspector, images: list[bytes]) -> dict[str, float]:
    def encode(data: bytes) -> Encoded:
        return inspector.encode(decode_image(data))

    def generate(enc: Encoded) -> None:
        prefix, image, suffix = inspector.sequence(inspector.default_prompt, enc)
        inspector.parse_verdict(inspector.generate(prefix, image, suffix, inspector.grammar, inspector.max_tokens))

    t0 = time.perf_counter()
    for data in images:
        generate(encode(data))
    sequential = len(images) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(encode, images[0])
        for nxt in [*images[1:], None]:
            embeds = pending.result()
            if nxt is not None:
                pending = pool.submit(encode, nxt)  # frame N+1 encodes while frame N generates
            generate(embeds)
    overlapped = len(images) / (time.perf_counter() - t0)
    return {"sequential_per_s": round(sequential, 2), "overlapped_per_s": round(overlapped, 2),
            "overlap_gain": round(overlapped / sequential, 3)}


def _parallel(inspector: Inspector, images: list[bytes]) -> dict[str, float]:
    items = [inspector.sequence(inspector.default_prompt, inspector.encode(decode_image(data))) for data in images]
    single = [inspector.generate(*item, inspector.grammar, inspector.max_tokens) for item in items]
    batched = inspector.generate_batch(items, inspector.grammar, inspector.max_tokens)
    single_tps = sum(g.tokens for g in single) / sum(g.decode_ms / 1000 for g in single)
    batched_tps = sum(g.tokens for g in batched) / (batched[0].decode_ms / 1000)
    for gen in batched:
        inspector.parse_verdict(gen)  # every parallel verdict is schema-valid
    return {"cameras": len(images), "gen_tok_s_one_at_a_time": round(single_tps, 1),
            "gen_tok_s_parallel": round(batched_tps, 1), "parallel_gain": round(batched_tps / single_tps, 2),
            "parallel_same_verdicts": sum(a.text == b.text for a, b in zip(single, batched, strict=True))}


class _progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.bar: Any = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="bench", unit="step", leave=False)

    def __call__(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _draft_counts(inspector: Inspector) -> tuple[int, int]:
    """(tokens guessed, tokens taken) by the draft model since it was loaded; (0, 0) without one."""
    drafter = inspector.language.drafter
    return (0, 0) if drafter is None else (drafter.length.proposed, drafter.length.accepted)


def _draft_share(inspector: Inspector, before: tuple[int, int]) -> dict[str, Any]:
    """What the draft model (model.draft_model) guessed during the stage timings, and how much was taken."""
    drafter = inspector.language.drafter
    if drafter is None:
        return {}
    guessed, taken = (now - then for now, then in zip(_draft_counts(inspector), before, strict=True))
    return {"draft_model": drafter.path.name, "draft_guessed": guessed, "draft_taken": taken,
            "draft_taken_share": round(taken / max(1, guessed), 3)}


def render(report: BenchReport) -> str:
    m = report.model
    encoder = (f"{m['image_tokens']} image tokens" if "image_tokens" in m
               else f"mmproj {m.get('projector')}, up to {m.get('image_max_tokens')} image tokens")
    lines = [f"edge-runtime bench — {m['name']}@{m['version']} ({m['quantization'] or 'GGUF'}, {encoder}), "
             f"{report.frames} frames, {report.machine['cores']} cores, {report.machine['date']}",
             "", f"{'stage':<14}{'p50 ms':>10}{'p95 ms':>10}"]
    for stage, v in report.stages_ms.items():
        lines.append(f"{stage:<14}{v['p50']:>10.2f}{v['p95']:>10.2f}")
    t, r, pc, tp = report.tokens, report.raw, report.prefix_cache, report.throughput
    lines += ["", f"prompt {t['prompt_tokens']} tokens at {t['prompt_tok_s']:.0f} tok/s; "
              f"generation {t['gen_tokens_mean']:.0f} tokens per verdict at {t['gen_tok_s']:.0f} tok/s"
              + (f", {t['forced_share']:.0%} of them forced by the schema's grammar" if "forced_share" in t else "")
              + (f"; draft {t['draft_model']} guessed {t['draft_guessed']}, {t['draft_taken_share']:.0%} taken"
                 if "draft_model" in t else ""),
              f"raw engines: encode p50 {r['encode_ms_p50']:.2f} ms, generation {r['gen_tok_s']:.0f} tok/s "
              f"with llama.cpp's grammar, {r['gen_tok_s_unconstrained']:.0f} tok/s unconstrained",
              f"ratios (ours/raw throughput): encoder {report.ratios['encode_throughput_ours_vs_raw']:.3f}, "
              f"generation ({t['engine']}) {report.ratios['generation_throughput_ours_vs_raw']:.3f} vs raw+grammar, "
              f"{report.ratios['generation_ours_vs_raw_unconstrained']:.3f} vs raw unconstrained",
              f"prefix reuse: {pc['fixed_prompt_tokens']}-token fixed prompt, time to first token "
              f"{pc['ttft_ms_reread']:.2f} ms re-read vs {pc['ttft_ms_reused']:.2f} ms reused ({pc['speedup']:.1f}x)",
              f"throughput: {report.throughput['sequential_per_s']:.2f}/s sequential, "
              f"{report.throughput['overlapped_per_s']:.2f}/s overlapped ({report.throughput['overlap_gain']:.2f}x)",
              f"{tp['cameras']:.0f} cameras as parallel sequences: generation {tp['gen_tok_s_parallel']:.0f} vs "
              f"{tp['gen_tok_s_one_at_a_time']:.0f} tok/s one at a time ({tp['parallel_gain']:.2f}x), same verdicts "
              f"{tp['parallel_same_verdicts']:.0f}/{tp['cameras']:.0f}",
              f"peak RSS {report.peak_rss_mb:.0f} MB"]
    if report.energy_j_per_inspection is not None:
        lines.append(f"energy {report.energy_j_per_inspection:.3f} J per inspection")
    return "\n".join(lines)


def plot(report: BenchReport, path: Path) -> Path:
    """Stage breakdown as a stacked bar (PNG, drawn with OpenCV: no plotting dependency)."""
    colors = {"decode_image": (137, 122, 108), "preprocess": (182, 89, 155), "encode": (255, 163, 74),
              "prefill": (79, 168, 47), "generate": (43, 164, 217)}
    w, h = 900, 220
    img = np.full((h, w, 3), 255, np.uint8)
    total = sum(report.stages_ms[k]["p50"] for k in colors) or 1.0
    x = 20
    for name, color in colors.items():
        width = int((w - 40) * report.stages_ms[name]["p50"] / total)
        cv2.rectangle(img, (x, 60), (x + width, 120), color, -1)
        x += width
    cv2.putText(img, f"{report.model['name']}: p50 stage breakdown, total {total:.1f} ms", (20, 35),
                cv2.FONT_HERSHEY_SIMPLEX, 0.7, (30, 30, 30), 2)
    lx = 20
    for name, color in colors.items():
        cv2.rectangle(img, (lx, 150), (lx + 18, 168), color, -1)
        label = f"{name} {report.stages_ms[name]['p50']:.1f} ms"
        cv2.putText(img, label, (lx + 24, 165), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (30, 30, 30), 1)
        lx += 24 + 9 * len(label) + 20
    cv2.imwrite(str(path), img)
    return path
