"""Issue 41 on a GPU: where a frame of four regions spends what one region does not, below the Result's
stage timings. On one Inspector of a GGUF + mmproj pair with `--lanes` libmtmd contexts (model.encoder_lanes):

1. `alone`: one crop on one lane, split into libmtmd's tokenize (its resize and patching, on the host) and
   `mtmd_encode_chunk` (the vision graph), each wall time and the calling thread's CPU time;
2. `lanes`: `--lanes` crops at once, one per lane: when each lane starts and ends, from the common start
   (the same crops as 1, so the sum of 1 against the span of 2 says how far the lanes overlap);
3. `overlap`: a one-region inspection of an already encoded crop (prefill and generation on the language
   model), alone and while another lane encodes crops back to back, and that encode alone and beside the
   inspection: whether the encoder and the language model share the GPU (if they overlap, prefilling a
   region while the next crop encodes would save time; if they only take turns, it would not).

Each measurement alternates with the others round by round, `--rounds` times, after `--warmup` rounds.
The crops are different random pixels every time, so no encode is a cache hit.

libmtmd's own set-up lines (graph splits, flash attention, operators its GPU backend lacks) are kept in the
JSON (`libmtmd_setup`). `--kernel-profile N` then records the GPU's kernels (torch.profiler, CUPTI: every
kernel of the process, ggml's included) over N crops alone, N rounds of a crop per lane and N inspections:
how long the GPU was busy (the union of the kernels' spans) against the wall time, the kernels per crop and
the costliest kernels. It runs last and in the same process, after the figures above are written (torch
is imported only then).

    python benchmarks/encode_overlap.py /tmp/models/pair3b --gpu-layers -1 --threads 8 --lanes 4 --rounds 20 \
        --kernel-profile 5
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

CROP = 336  # 144 image tokens on Qwen2.5-VL (benchmarks/programs.py's regions)


SETUP_LINE = re.compile(r"graph splits|flash attention|unsupported|compute buffer|WARNING|backend", re.I)


class SetupLines(logging.Handler):
    """libmtmd's log lines that say how its graph runs (kept, at most 60)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        if SETUP_LINE.search(line) and len(self.lines) < 60:
            self.lines.append(line)


def p50(xs: list[float]) -> float:
    return round(statistics.median(xs), 2) if xs else float("nan")


def crops(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    return [rng.integers(0, 256, (CROP, CROP, 3), dtype=np.uint8) for _ in range(n)]


def encode_split(ctx: Any, rgb: np.ndarray) -> tuple[float, float, float, float]:
    """(tokenize wall, tokenize CPU, encode wall, encode CPU) ms of one crop on one libmtmd context."""
    from edge_runtime.inference.llm.mtmd import chunk_is_image

    w0, c0 = time.perf_counter(), time.thread_time()
    chunks = ctx.tokenize(ctx.marker, [rgb])
    w1, c1 = time.perf_counter(), time.thread_time()
    with chunks:
        for chunk in chunks:
            if chunk_is_image(chunk):
                ctx.encode_chunk(chunk)
    w2, c2 = time.perf_counter(), time.thread_time()
    return (w1 - w0) * 1e3, (c1 - c0) * 1e3, (w2 - w1) * 1e3, (c2 - c1) * 1e3


def encode_one(ctx: Any, rgb: np.ndarray) -> None:
    encode_split(ctx, rgb)


def at_once(jobs: list[Callable[[], None]]) -> list[tuple[float, float]]:
    """Run the jobs on threads released together: each job's (start, end) ms from the release."""
    barrier = threading.Barrier(len(jobs) + 1)
    spans: list[tuple[float, float]] = [(0.0, 0.0)] * len(jobs)
    t0 = [0.0]

    def run(i: int, job: Callable[[], None]) -> None:
        barrier.wait()
        s = time.perf_counter()
        job()
        spans[i] = ((s - t0[0]) * 1e3, (time.perf_counter() - t0[0]) * 1e3)

    threads = [threading.Thread(target=run, args=(i, j)) for i, j in enumerate(jobs)]
    for t in threads:
        t.start()
    t0[0] = time.perf_counter()
    barrier.wait()
    for t in threads:
        t.join()
    return spans


def overlap(inspector: Any, lane: Any, rng: np.random.Generator, schema: dict[str, Any]
            ) -> tuple[float, float, float, list[float]]:
    """(inspection alone, inspection beside encodes, encode alone, encodes beside the inspection) ms: an
    inspection of an already encoded crop, then one encode on `lane`, then the inspection again while `lane`
    encodes crops back to back."""
    frame = crops(rng, 1)[0][:, :, ::-1].copy()  # BGR, as a camera's
    encoded = inspector.encode(frame)

    def inspect() -> float:
        w0 = time.perf_counter()
        inspector.inspect(frame, camera="bench", encoded=encoded, schema=schema)
        return (time.perf_counter() - w0) * 1e3

    alone = inspect()
    e0 = time.perf_counter()
    encode_one(lane, crops(rng, 1)[0])
    enc_alone = (time.perf_counter() - e0) * 1e3
    stop = threading.Event()
    beside: list[float] = []

    def encode_loop() -> None:
        while not stop.is_set():
            img = crops(rng, 1)[0]
            s = time.perf_counter()
            encode_one(lane, img)
            beside.append((time.perf_counter() - s) * 1e3)

    looping = threading.Thread(target=encode_loop)
    looping.start()
    time.sleep(0.005)  # the loop's first encode under way
    with_encodes = inspect()
    stop.set()
    looping.join()
    return alone, with_encodes, enc_alone, beside


def busy_ms(spans: list[tuple[float, float]]) -> float:
    """The union of (start, end) µs spans, in ms: how long at least one kernel ran."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e > end:
            total += e - max(s, end)
            end = e
    return total / 1e3


def kernel_profile(jobs: dict[str, Callable[[], None]], n: int) -> dict[str, Any]:
    """Each job run `n` times under torch.profiler: per run, the wall ms, the ms the GPU was busy, the kernels'
    summed ms and count; and the job's ten costliest kernels by summed time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        print("kernel profile: no CUDA device for torch, skipped", file=sys.stderr)
        return {"skipped": "no CUDA device for torch"}
    torch.cuda.init()
    out: dict[str, Any] = {}
    for name, job in jobs.items():
        walls: list[float] = []
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                w = time.perf_counter()
                job()
                walls.append((time.perf_counter() - w) * 1e3)
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        spans = [(e.time_range.start, e.time_range.end) for e in kernels]
        by_name: dict[str, list[float]] = {}
        for e in kernels:
            by_name.setdefault(e.name[:90], []).append((e.time_range.end - e.time_range.start) / 1e3)
        top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:10]
        out[name] = {"wall_ms_per_run": round(sum(walls) / n, 2),
                     "gpu_busy_ms_per_run": round(busy_ms(spans) / n, 2),
                     "kernel_sum_ms_per_run": round(sum(e - s for s, e in spans) / 1e3 / n, 2),
                     "kernels_per_run": round(len(kernels) / n, 1),
                     "top": [{"kernel": k, "calls_per_run": round(len(v) / n, 1), "ms_per_run": round(sum(v) / n, 3)}
                             for k, v in top]}
        o = out[name]
        print(f"{name}: wall {o['wall_ms_per_run']} ms, GPU busy {o['gpu_busy_ms_per_run']} ms, kernels "
              f"{o['kernels_per_run']} summing {o['kernel_sum_ms_per_run']} ms", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--gpu-layers", type=int, default=-1)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--lanes", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--kernel-profile", type=int, default=0, metavar="N",
                    help="then record the GPU's kernels over N runs of each part (torch.profiler; needs torch)")
    args = ap.parse_args()
    if args.lanes < 2:
        ap.error("--lanes: at least 2 (the overlap part encodes on a lane beside the inspection's)")

    from edge_runtime.config import Config
    from edge_runtime.inference.llm import mtmd as mtmd_module
    from edge_runtime.inference.model_source import open_inspector

    setup = SetupLines()
    mtmd_log = logging.getLogger(mtmd_module.__name__)
    mtmd_log.addHandler(setup)
    mtmd_log.setLevel(logging.DEBUG)

    cfg = Config(device_id="bench")
    cfg.model.threads, cfg.model.gpu_layers = args.threads, args.gpu_layers
    cfg.model.batch_size, cfg.model.encoder_lanes = args.batch_size, args.lanes
    cfg.model.encoder_cache_mb = 0  # every encode computed
    inspector = open_inspector(cfg, args.bundle)
    lanes = inspector.encoder._contexts  # the libmtmd contexts, one per lane
    rng = np.random.default_rng(41)
    schema = {"type": "object", "additionalProperties": False, "required": ["defect", "category"],
              "properties": {"defect": {"type": "boolean"},
                             "category": {"enum": ["none", "missing_screw", "loose_screw"]}}}
    alone: dict[str, list[float]] = {"tokenize": [], "tokenize_cpu": [], "encode": [], "encode_cpu": []}
    lane_spans: list[list[tuple[float, float]]] = []
    inspect_alone: list[float] = []
    inspect_beside: list[float] = []
    enc_alone: list[float] = []
    enc_beside: list[float] = []
    try:
        for r in range(args.warmup + args.rounds):
            keep = r >= args.warmup
            # 1. one crop alone, on lane 0
            t = encode_split(lanes[0], crops(rng, 1)[0])
            # 2. a crop per lane, at once
            batch = crops(rng, len(lanes))
            spans = at_once([lambda c=c, img=img: encode_one(c, img) for c, img in zip(lanes, batch, strict=True)])
            # 3. an inspection of an encoded crop, alone and beside encodes on the last lane
            ia, ib, ea, beside = overlap(inspector, lanes[-1], rng, schema)
            if keep:
                for k, v in zip(alone, t, strict=True):
                    alone[k].append(v)
                lane_spans.append(spans)
                inspect_alone.append(ia)
                inspect_beside.append(ib)
                enc_alone.append(ea)
                enc_beside.extend(beside)
        mtmd_log.removeHandler(setup)
        out = summary(args, alone, lane_spans, inspect_alone, inspect_beside, enc_alone, enc_beside)
        out["libmtmd_setup"] = setup.lines
        write(out, args.json)
        if args.kernel_profile:
            frame = crops(rng, 1)[0][:, :, ::-1].copy()
            encoded = inspector.encode(frame)

            def one_crop() -> None:
                encode_one(lanes[0], crops(rng, 1)[0])

            def crop_per_lane() -> None:
                at_once([lambda c=c, img=img: encode_one(c, img)
                         for c, img in zip(lanes, crops(rng, len(lanes)), strict=True)])

            def inspection() -> None:
                inspector.inspect(frame, camera="bench", encoded=encoded, schema=schema)

            out["kernel_profile"] = kernel_profile(
                {"one_crop": one_crop, "crop_per_lane": crop_per_lane, "inspection": inspection}, args.kernel_profile)
            write(out, args.json)
    finally:
        inspector.close()


def write(out: dict[str, Any], path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)


def summary(args: argparse.Namespace, alone: dict[str, list[float]], lane_spans: list[list[tuple[float, float]]],
            inspect_alone: list[float], inspect_beside: list[float], enc_alone: list[float],
            enc_beside: list[float]) -> dict[str, Any]:
    ends = [max(e for _s, e in spans) for spans in lane_spans]
    out: dict[str, Any] = {
        "machine": f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", "lanes": args.lanes,
        "rounds": args.rounds,
        "alone_p50_ms": {k: p50(v) for k, v in alone.items()},
        "lanes_p50_ms": {"span": p50(ends),
                         "starts": [p50([s[i][0] for s in lane_spans]) for i in range(args.lanes)],
                         "ends": [p50([s[i][1] for s in lane_spans]) for i in range(args.lanes)]},
        "overlap_p50_ms": {"inspection_alone": p50(inspect_alone), "inspection_beside_encodes": p50(inspect_beside),
                           "encode_alone": p50(enc_alone), "encode_beside_inspection": p50(enc_beside)},
    }
    one = out["alone_p50_ms"]["tokenize"] + out["alone_p50_ms"]["encode"]
    out["lanes_span_over_one_crop"] = round(out["lanes_p50_ms"]["span"] / one, 3)
    print(json.dumps(out, indent=1))
    a = out["alone_p50_ms"]
    o = out["overlap_p50_ms"]
    print(f"one crop: tokenize {a['tokenize']} ms (CPU {a['tokenize_cpu']}), encode {a['encode']} ms "
          f"(CPU {a['encode_cpu']}); {args.lanes} crops on {args.lanes} lanes at once: "
          f"{out['lanes_p50_ms']['span']} ms "
          f"({out['lanes_span_over_one_crop']}x one crop; lanes end at {out['lanes_p50_ms']['ends']}); "
          f"inspection {o['inspection_alone']} -> {o['inspection_beside_encodes']} ms beside encodes, "
          f"encode {o['encode_alone']} -> {o['encode_beside_inspection']} ms beside an inspection", file=sys.stderr)
    return out


if __name__ == "__main__":
    main()
