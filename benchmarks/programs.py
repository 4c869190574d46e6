"""What inspection programs cost, measured in one run on a GGUF + mmproj bundle (the 0.5b-shape pair
of `realistic_pair.py` on a CPU):

1. per-frame time of a camera whose program has one reference against a camera with none: the same
   frames, interleaved (plain, reference, plain, ...), each a whole `Inspector.inspect` (encode,
   prefill, verdict), the encoder cache off so each frame is encoded for each camera. The reference
   is encoded at load and its KV decoded once (the first frame), then reused;
2. a repeated API image: the same JPEG sent `--requests` times to a running daemon's
   `POST /api/v1/infer`; each result's `timings_ms.encode` and the encoder cache's hit rate
   (`/api/v1/status`, `inspection.encoder_cache`);
3. regions: a frame (2 x 2 crops of the frame size) asked as four regions in one batch against the same
   frame asked as one region (its top-left crop), interleaved, encoder cache off; its time to the first
   token is from the call to the moment every region has its first token (the regions' encodes, then
   their prefill), measured where the parallel sequences pick it. The frame is done when its longest
   answer is, so the answers' lengths are reported beside the times (one region's; the longest of four).
   `regions_compact` asks the same with each region's schema a boolean and an enum (a screw present or
   not, as a region of a real program asks), so the answers' lengths vary little and the ratio shows
   the batching rather than random weights' longest free-text answer;
4. image token budgets: the same frame under three `image_tokens.max` (the bundle's ceiling, a half and a
   quarter of it), interleaved, encoder cache off: per-frame ms and image tokens at each;
5. a clip of 4 frames (spacing 0) against a single frame, interleaved, encoder cache on as in the
   daemon: each clip is the last four frames of a sliding window, so three of its four are cache hits.
6. `regions_stream`: the regions' ratio as a camera's stream sees it, through a running Daemon's
   two-stage worker (frame N+1's crops encoded while frame N is generated), frames fed as a continuous
   camera feeds them; per-frame ms (the stream's time over its frames) and each frame's latency, the two
   cameras (one region, four) in turns of 8 frames (`--stream-frames` each), each region's schema the
   compact one.

Every ratio comes from one run (the parts interleaved frame by frame, so load shifts hit both sides).

    python benchmarks/programs.py BUNDLE [--frames 12] [--requests 100] [--threads 2] [--gpu-layers 0]
        [--parts reference,api,regions,regions_compact,regions_stream,budgets,clip] [--json OUT]
        [--variants lanes1,lanes4,lanes4-unified] [--decode-profile]

`--variants`: regions and regions_compact once per model setting (encoder lanes, KV cache), each its own
Inspector, the variants interleaved frame by frame so one run compares them; `--decode-profile`: each
llama_decode of their measured frames timed (synchronized), by kind (image embeddings, tokens) and rows.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def pct(values: list[float], q: float) -> float:
    return round(sorted(values)[min(len(values) - 1, int(q * len(values)))], 1)


def frames(n: int, seed: int, size: int = 336) -> list[np.ndarray]:
    from edge_runtime.core.samples import part_image

    return [part_image(seed + i, size, size, defect=i % 3 == 0) for i in range(n)]


def reference_cost(bundle: str, n: int, threads: int, tmp: Path, gpu_layers: int = 0) -> dict[str, Any]:
    """Per-frame ms of a camera with one reference against one with none, interleaved on the same frames."""
    import cv2

    from edge_runtime.config import CameraConfig, Config, ProgramConfig, ReferenceConfig
    from edge_runtime.inference.model_source import open_inspector

    ref = tmp / "golden.png"
    cv2.imwrite(str(ref), frames(1, seed=900)[0])
    cfg = Config(device_id="bench")
    cfg.model.threads = threads
    cfg.model.gpu_layers = gpu_layers
    cfg.model.encoder_cache_mb = 0  # both cameras see the same frames: each must be encoded, not a hit
    cfg.cameras = [CameraConfig(name="plain", source="x.png"), CameraConfig(name="ref", source="x.png", program="p")]
    cfg.programs = {"p": ProgramConfig(references=[ReferenceConfig(image=ref, caption="golden OK sample")])}
    inspector = open_inspector(cfg, bundle)
    out: dict[str, Any] = {"bundle": inspector.bundle.name, "threads": threads, "frames": n}
    try:
        times: dict[str, list[float]] = {"plain": [], "ref": []}
        ttft: dict[str, list[float]] = {"plain": [], "ref": []}
        tokens: dict[str, list[int]] = {"plain": [], "ref": []}
        for cam in ("plain", "ref"):  # the first of each: the reference's KV, buffers (not counted)
            inspector.inspect(frames(1, seed=800)[0], camera=cam)
        for frame in frames(n, seed=1):
            for cam in ("plain", "ref"):
                t0 = time.perf_counter()
                result = inspector.inspect(frame, camera=cam)
                times[cam].append((time.perf_counter() - t0) * 1000)
                t = result.timings_ms
                ttft[cam].append(t["preprocess"] + t["encode"] + t["prefill"])
                tokens[cam].append(len(result.text))
        for cam in times:
            out[cam] = {"p50_ms": pct(times[cam], 0.5), "p90_ms": pct(times[cam], 0.9),
                        "ttft_p50_ms": pct(ttft[cam], 0.5), "answer_chars_mean": round(statistics.mean(tokens[cam]), 1)}
        out["ratio_p50"] = round(out["ref"]["p50_ms"] / out["plain"]["p50_ms"], 3)
        out["ratio_ttft_p50"] = round(out["ref"]["ttft_p50_ms"] / out["plain"]["ttft_p50_ms"], 3)
        program = inspector.program_of("ref")
        assert program is not None
        out["reference_tokens"] = len(program.references[0].encoded.embeds)
    finally:
        inspector.close()
    return out


BATCH_SIZE: int | None = None  # --batch-size: model.batch_size of every part's Inspector (None: the default)
KV_CACHE: str | None = None  # --kv-cache: model.batch_kv_cache (None: the default, per_sequence)
ENCODER_LANES: int | None = None  # --encoder-lanes: model.encoder_lanes (None: the default, 1)
COMPACT_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["defect", "category"],
                  "properties": {"defect": {"type": "boolean"},
                                 "category": {"enum": ["none", "missing_screw", "loose_screw"]}}}


def _inspector(bundle: str, threads: int, gpu_layers: int, cache_mb: int, programs: dict[str, Any],
               cameras: dict[str, str | None], encoder_lanes: int | None = None, kv_cache: str | None = None) -> Any:
    """An Inspector of `bundle` with these programs and cameras (camera name -> program name).
    `encoder_lanes`, `kv_cache`: a variant's (--variants) settings, over ENCODER_LANES and KV_CACHE."""
    from edge_runtime.config import CameraConfig, Config, ProgramConfig
    from edge_runtime.inference.model_source import open_inspector

    cfg = Config(device_id="bench")
    cfg.model.threads = threads
    cfg.model.gpu_layers = gpu_layers
    cfg.model.encoder_cache_mb = cache_mb
    if BATCH_SIZE is not None:
        cfg.model.batch_size = BATCH_SIZE
    kv_cache = kv_cache if kv_cache is not None else KV_CACHE
    encoder_lanes = encoder_lanes if encoder_lanes is not None else ENCODER_LANES
    if kv_cache is not None:
        cfg.model.batch_kv_cache = kv_cache  # type: ignore[assignment]
    if encoder_lanes is not None:
        cfg.model.encoder_lanes = encoder_lanes
    cfg.programs = {name: ProgramConfig.model_validate(p) for name, p in programs.items()}
    cfg.cameras = [CameraConfig(name=cam, source="x.png", program=prog) for cam, prog in cameras.items()]
    return open_inspector(cfg, bundle)


def _stats(times: list[float], ttft: list[float]) -> dict[str, float]:
    return {"p50_ms": pct(times, 0.5), "p90_ms": pct(times, 0.9), "ttft_p50_ms": pct(ttft, 0.5)}


def _timed(inspect: Any) -> tuple[float, float]:
    """(whole ms, ms to the first token: preprocess + encode + prefill) of one inspection."""
    t0 = time.perf_counter()
    result = inspect()
    t = result.timings_ms
    return (time.perf_counter() - t0) * 1000, t["preprocess"] + t["encode"] + t["prefill"]


def _first_tokens(inspector: Any) -> list[float]:
    """Where the parallel sequences record the moment each sequence's first token is picked (the
    regions of a frame are sequences of one batch; their Result's timings hold no first-token time)."""
    parallel = inspector.language.parallel
    picks: list[float] = []
    first_pick = parallel._first_pick

    def timed(seq: Any, row: int) -> None:
        first_pick(seq, row)
        picks.append(time.perf_counter())

    parallel._first_pick = timed
    return picks


def _counted_steps(inspector: Any) -> list[int]:
    """A one-item list counting the parallel sequences' generation steps (one `llama_decode` each): on a
    GPU a step costs its kernel launches more than its rows, so the steps a frame takes set its decode time."""
    parallel = inspector.language.parallel
    steps = [0]
    step_rows = parallel._step_rows

    def counted(running: Any, finished: Any) -> bool:
        steps[0] += 1
        return bool(step_rows(running, finished))

    parallel._step_rows = counted
    return steps


def _quadrants(side: int, schema: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The 2 x 2 quadrants of a `side` x `side` frame as program regions, each under `schema` (None: the bundle's)."""
    half = side // 2
    return [{"name": f"q{i}", "box": [x, y, half, half], **({"verdict_schema": schema} if schema else {})}
            for i, (x, y) in enumerate([(0, 0), (half, 0), (0, half), (half, half)])]


VARIANT = re.compile(r"lanes([1-9][0-9]*)(-unified)?")


def parse_variants(text: str) -> list[tuple[str, int, str]]:
    """`lanes1,lanes4,lanes4-unified` -> [(name, model.encoder_lanes, model.batch_kv_cache)]; ValueError
    on anything else (a name not `lanes<N>` with an optional `-unified`, or a name twice)."""
    out: list[tuple[str, int, str]] = []
    for name in text.split(","):
        m = VARIANT.fullmatch(name.strip())
        if not m:
            raise ValueError(f"{name.strip()!r} is not lanes<N> or lanes<N>-unified (N >= 1)")
        if any(name.strip() == v[0] for v in out):
            raise ValueError(f"{name.strip()!r} given twice")
        out.append((name.strip(), int(m.group(1)), "unified" if m.group(2) else "per_sequence"))
    return out


def _decode_profiler() -> tuple[list[tuple[str, int, float]], Any]:
    """Every `Feed.decode` (one llama_decode: prefill chunks, image embeddings, generation steps) timed
    with the GPU synchronized after it, appended as (kind: "image" rows of embeddings or "tokens", rows,
    ms) to the returned list (the caller clears it per inspection); the second item puts Feed.decode back.
    Patched on the class (every inspector's feed); the product's Feed.profile is left alone."""
    from edge_runtime.inference.llm.feed import Feed

    log: list[tuple[str, int, float]] = []
    plain = Feed.decode

    def profiled(self: Any, ctx: Any, batch: Any) -> None:
        rows, kind = int(batch.n_tokens), "image" if batch.embd else "tokens"
        t0 = time.perf_counter()
        plain(self, ctx, batch)
        ctx.synchronize()
        log.append((kind, rows, (time.perf_counter() - t0) * 1000))

    Feed.decode = profiled  # type: ignore[method-assign]

    def restore() -> None:
        Feed.decode = plain  # type: ignore[method-assign]

    return log, restore


def _decode_table(per_frame: list[list[tuple[str, int, float]]]) -> dict[str, Any]:
    """Per distinct (kind, rows) of the frames' decodes: calls per frame (mean), one call's ms (p50 over
    the calls), its ms per frame (p50 over the frames, 0 where a frame had none); and the frame's
    decode ms in all (p50)."""
    keys = sorted({(k, r) for calls in per_frame for k, r, _ in calls}, key=lambda x: (x[0], -x[1]))
    table: dict[str, Any] = {}
    for kind, rows in keys:
        ms = [m for calls in per_frame for k, r, m in calls if (k, r) == (kind, rows)]
        table[f"{kind}:{rows}"] = {
            "calls_per_frame": round(len(ms) / len(per_frame), 2), "call_p50_ms": pct(ms, 0.5),
            "frame_ms_p50": pct([sum(m for k, r, m in calls if (k, r) == (kind, rows)) for calls in per_frame], 0.5)}
    return {"by_kind_rows": table, "calls_per_frame": round(sum(map(len, per_frame)) / len(per_frame), 1),
            "decode_ms_frame_p50": pct([sum(m for _, _, m in calls) for calls in per_frame], 0.5)}


def regions_cost(bundle: str, n: int, threads: int, gpu_layers: int, side: int,
                 schema: dict[str, Any] | None = None, variants: list[tuple[str, int, str]] | None = None,
                 decode_profile: bool = False) -> dict[str, Any]:
    """Per-frame ms of four regions (the 2 x 2 quadrants) in one batch against one region (a quadrant),
    and the time to the frame's first tokens: from the call to the first region's first token
    (`ttft_first`) and to the last region's (`ttft_p50_ms`: every region has begun its answer).
    `schema`: every region's verdict schema (None: the bundle's).
    `variants` (--variants): (name, encoder lanes, KV cache) each with its own Inspector, every frame run
    one region then four on each variant in turn (the starting variant rotating frame by frame), so load
    drift falls on all alike; each variant's figures under out["variants"][name], the top-level ones the
    first variant's. `decode_profile`: each llama_decode of the measured frames timed (synchronized) and
    tabled by kind and rows per variant and camera (out[...]["decode_profile"]); the syncs are in the times."""
    half = side // 2
    quads = _quadrants(side, schema)
    runs: list[tuple[str, int | None, str | None]] = [("", None, None)]
    if variants:
        runs = [(name, lanes, kv) for name, lanes, kv in variants]
    out: dict[str, Any] = {"frames": n, "frame": f"{side}x{side}", "region": f"{half}x{half}"}
    inspectors: dict[str, Any] = {}
    restore: Any = None
    try:
        for name, lanes, kv in runs:
            inspectors[name] = _inspector(bundle, threads, gpu_layers, 0,
                                          {"one": {"regions": quads[:1]}, "four": {"regions": quads}},
                                          {"one": "one", "four": "four"}, encoder_lanes=lanes, kv_cache=kv)
        for inspector in inspectors.values():
            for cam in ("one", "four"):  # buffers, the parallel slots (not counted)
                inspector.inspect(frames(1, seed=800, size=side)[0], camera=cam)
        decodes: list[tuple[str, int, float]] | None = None
        if decode_profile:
            decodes, restore = _decode_profiler()
        picks = {name: _first_tokens(i) for name, i in inspectors.items()}
        steps = {name: _counted_steps(i) for name, i in inspectors.items()}

        def per_cam() -> dict[str, dict[str, list[Any]]]:
            return {name: {"one": [], "four": []} for name in inspectors}

        times, ttft, first = per_cam(), per_cam(), per_cam()
        longest = per_cam()  # the frame's longest answer (characters)
        stepped = per_cam()  # generation steps per frame
        decoded = per_cam()  # each frame's decodes (kind, rows, ms), with --decode-profile
        parts: dict[str, dict[str, dict[str, list[float]]]] = {
            name: {"one": {}, "four": {}} for name in inspectors}  # the Result's timings, by stage
        names = list(inspectors)
        for f, frame in enumerate(frames(n, seed=11, size=side)):
            for name in names[f % len(names):] + names[:f % len(names)]:
                inspector = inspectors[name]
                for cam in ("one", "four"):
                    picks[name].clear()
                    steps[name][0] = 0
                    if decodes is not None:
                        decodes.clear()
                    t0 = time.perf_counter()
                    result = inspector.inspect(frame, camera=cam)
                    times[name][cam].append((time.perf_counter() - t0) * 1000)
                    if decodes is not None:
                        decoded[name][cam].append(list(decodes))
                    longest[name][cam].append(max(len(r["text"]) for r in result.regions or [{"text": result.text}]))
                    assert len(picks[name]) == (1 if cam == "one" else 4), picks[name]
                    first[name][cam].append((min(picks[name]) - t0) * 1000)
                    ttft[name][cam].append((max(picks[name]) - t0) * 1000)
                    stepped[name][cam].append(steps[name][0])
                    for stage in ("preprocess", "encode", "prefill", "decode"):
                        parts[name][cam].setdefault(stage, []).append(result.timings_ms[stage])
        if restore is not None:
            restore()
            restore = None
        found: dict[str, dict[str, Any]] = {}
        for name, inspector in inspectors.items():
            v: dict[str, Any] = {}
            for cam in ("one", "four"):
                v[cam] = {**_stats(times[name][cam], ttft[name][cam]), "ttft_first_p50_ms": pct(first[name][cam], 0.5),
                          "longest_answer_chars_mean": round(statistics.mean(longest[name][cam]), 1),
                          "steps_mean": round(statistics.mean(stepped[name][cam]), 1),
                          "stages_p50_ms": {stage: pct(x, 0.5) for stage, x in parts[name][cam].items()}}
                if decode_profile:
                    v[cam]["decode_profile"] = _decode_table(decoded[name][cam])
            v["schema"] = "compact" if schema else "bundle"
            v["batch_size"] = inspector.settings.batch_size
            v["kv_cache"] = inspector.settings.batch_kv_cache
            v["encoder_lanes"] = inspector.settings.encoder_lanes
            v["ratio_p50"] = round(v["four"]["p50_ms"] / v["one"]["p50_ms"], 3)
            v["ratio_ttft_p50"] = round(v["four"]["ttft_p50_ms"] / v["one"]["ttft_p50_ms"], 3)
            v["region_tokens"] = len(inspector.encode(frames(1, seed=5, size=half)[0]).embeds)
            found[name] = v
        out.update(found[names[0]])
        if variants:
            out["variants"] = found
    finally:
        if restore is not None:
            restore()
        for inspector in inspectors.values():
            inspector.close()
    return out


def regions_stream(bundle: str, n: int, threads: int, gpu_layers: int, side: int, tmp: Path,
                   schema: dict[str, Any] | None = None, chunk: int = 8) -> dict[str, Any]:
    """Per-frame ms of a camera's stream of frames asked as four regions against one region, through a
    running Daemon's worker (`inference/worker.py`: stage 1 encodes frame N+1's crops while stage 2
    generates frame N) fed as a continuous camera feeds it (`capture/scheduler.py`: the next frame is
    submitted once the current one is encoded; stage 2 generates the frames ready together as one batch).
    The two cameras take turns of `chunk` frames, so a shared machine's load falls on both alike;
    encoder cache off (each crop encoded), journal on."""
    from concurrent.futures import Future

    from edge_runtime.app.daemon import Daemon
    from edge_runtime.config import CameraConfig, Config, ProgramConfig, TriggerConfig
    from edge_runtime.core.inspection_queue import InspectionRequest

    half = side // 2
    quads = _quadrants(side, schema)
    cfg = Config(device_id="bench", data_dir=tmp / "stream")
    cfg.model.path = Path(bundle)
    cfg.model.threads, cfg.model.gpu_layers, cfg.model.encoder_cache_mb = threads, gpu_layers, 0
    if BATCH_SIZE is not None:
        cfg.model.batch_size = BATCH_SIZE
    if KV_CACHE is not None:
        cfg.model.batch_kv_cache = KV_CACHE  # type: ignore[assignment]
    if ENCODER_LANES is not None:
        cfg.model.encoder_lanes = ENCODER_LANES
    cfg.mqtt.enabled = cfg.api.enabled = cfg.governor.enabled = False
    cfg.programs = {"one": ProgramConfig.model_validate({"regions": quads[:1]}),
                    "four": ProgramConfig.model_validate({"regions": quads})}
    still = tmp / "still.png"
    import cv2

    cv2.imwrite(str(still), frames(1, seed=800, size=side)[0])
    cfg.cameras = [CameraConfig(name=cam, source=str(still), program=cam, trigger=TriggerConfig(mode="on_demand"))
                   for cam in ("one", "four")]
    daemon = Daemon(cfg)
    daemon.start()
    seconds = {"one": 0.0, "four": 0.0}
    latency: dict[str, list[float]] = {"one": [], "four": []}
    done = {"one": 0, "four": 0}
    try:
        for cam in ("one", "four"):  # buffers, the parallel slots (not counted)
            daemon.inspections.submit(InspectionRequest(frames(1, seed=801, size=side)[0], cam)).result(600)
        stream = frames(n, seed=41, size=side)
        for start in range(0, n, chunk):
            for cam in ("one", "four"):
                futures: list[Future[Any]] = []
                t0 = time.perf_counter()
                for seq, frame in enumerate(stream[start:start + chunk], start):
                    request = InspectionRequest(frame, cam, seq=seq, trigger="continuous")
                    submitted = time.perf_counter()
                    daemon.inspections.submit(request)
                    request.future.add_done_callback(
                        lambda _f, cam=cam, submitted=submitted: latency[cam].append(
                            (time.perf_counter() - submitted) * 1000))
                    futures.append(request.future)
                    # a continuous camera: the next frame once this one is encoded (or answered)
                    while not request.encoded.wait(0.05) and not request.future.done():
                        pass
                for future in futures:
                    result = future.result(timeout=600)
                    assert result.regions is not None and len(result.regions) == (1 if cam == "one" else 4)
                seconds[cam] += time.perf_counter() - t0
                done[cam] += len(futures)
    finally:
        daemon.stop()
    out: dict[str, Any] = {"frames": n, "frame": f"{side}x{side}", "region": f"{half}x{half}", "chunk": chunk,
                           "schema": "compact" if schema else "bundle"}
    for cam in ("one", "four"):
        out[cam] = {"per_frame_ms": round(seconds[cam] * 1000 / done[cam], 1),
                    "latency_p50_ms": pct(latency[cam], 0.5), "latency_p90_ms": pct(latency[cam], 0.9)}
    out["ratio_per_frame"] = round(out["four"]["per_frame_ms"] / out["one"]["per_frame_ms"], 3)
    out["ratio_latency_p50"] = round(out["four"]["latency_p50_ms"] / out["one"]["latency_p50_ms"], 3)
    return out


def budget_cost(bundle: str, n: int, threads: int, gpu_layers: int, side: int) -> dict[str, Any]:
    """Per-frame ms of the same frames under three image token budgets: the ceiling, a half, a quarter."""
    probe = _inspector(bundle, threads, gpu_layers, 0, {}, {})
    ceiling = probe.image_budget
    probe.close()
    budgets = {f"max{m}": m for m in (ceiling, max(1, ceiling // 2), max(1, ceiling // 4))}  # a tiny pair: fewer
    inspector = _inspector(bundle, threads, gpu_layers, 0,
                           {name: {"image_tokens": {"max": m}} for name, m in budgets.items()},
                           {name: name for name in budgets})
    out: dict[str, Any] = {"frames": n, "frame": f"{side}x{side}", "ceiling": ceiling}
    try:
        for cam in budgets:
            inspector.inspect(frames(1, seed=800, size=side)[0], camera=cam)
        times: dict[str, list[float]] = {cam: [] for cam in budgets}
        ttft: dict[str, list[float]] = {cam: [] for cam in budgets}
        for frame in frames(n, seed=21, size=side):
            for cam in budgets:
                whole, first = _timed(lambda cam=cam, frame=frame: inspector.inspect(frame, camera=cam))
                times[cam].append(whole)
                ttft[cam].append(first)
        sample = frames(1, seed=21, size=side)[0]
        for cam, m in budgets.items():
            program = inspector.program_of(cam)
            tokens = len(inspector.encode(sample, tokens=program.tokens).embeds)
            out[cam] = {**_stats(times[cam], ttft[cam]), "max": m, "image_tokens": tokens}
        low = f"max{max(1, ceiling // 4)}"
        out["ratio_p50_to_quarter"] = {cam: round(out[cam]["p50_ms"] / out[low]["p50_ms"], 3) for cam in budgets}
    finally:
        inspector.close()
    return out


def clip_cost(bundle: str, n: int, threads: int, gpu_layers: int, side: int, size: int = 4) -> dict[str, Any]:
    """Per-question ms of a clip of `size` frames (a sliding window over new frames, the encoder cache on)
    against a single frame (other new frames, so neither side gets the other's encodings)."""
    from edge_runtime.core.batch import ClipFrame

    inspector = _inspector(bundle, threads, gpu_layers, 64, {"clip": {"clip": {"frames": size, "spacing_s": 0}}},
                           {"plain": None, "clip": "clip"})
    out: dict[str, Any] = {"questions": n, "frame": f"{side}x{side}", "clip_frames": size}
    try:
        window = [ClipFrame(f, i, time.time()) for i, f in enumerate(frames(size, seed=500, size=side))]
        inspector.inspect(frames(1, seed=800, size=side)[0], camera="plain")
        inspector.inspect(window[-1].image, camera="clip", encoded=inspector.encode_frame("clip", window[-1].image,
                                                                                          window))
        times: dict[str, list[float]] = {"plain": [], "clip": []}
        ttft: dict[str, list[float]] = {"plain": [], "clip": []}
        plain, new = frames(n, seed=31, size=side), frames(n, seed=61, size=side)
        for i in range(n):
            whole, first = _timed(lambda i=i: inspector.inspect(plain[i], camera="plain"))
            times["plain"].append(whole)
            ttft["plain"].append(first)
            window = [*window[1:], ClipFrame(new[i], size + i, time.time())]
            clip = tuple(window)
            whole, first = _timed(lambda clip=clip: inspector.inspect(
                clip[-1].image, camera="clip", encoded=inspector.encode_frame("clip", clip[-1].image, clip)))
            times["clip"].append(whole)
            ttft["clip"].append(first)
        for cam in times:
            out[cam] = _stats(times[cam], ttft[cam])
        out["ratio_p50"] = round(out["clip"]["p50_ms"] / out["plain"]["p50_ms"], 3)
        out["ratio_ttft_p50"] = round(out["clip"]["ttft_p50_ms"] / out["plain"]["ttft_p50_ms"], 3)
        out["frame_tokens"] = len(inspector.encode(plain[0]).embeds)
    finally:
        inspector.close()
    return out


def repeated_image(bundle: str, requests: int, threads: int, tmp: Path, gpu_layers: int = 0) -> dict[str, Any]:
    """The same JPEG `requests` times through a real daemon's REST API."""
    import cv2

    from edge_runtime.app.daemon import Daemon
    from edge_runtime.config import Config

    cfg = Config(device_id="bench", data_dir=tmp / "data")
    cfg.model.path = Path(bundle)
    cfg.model.threads = threads
    cfg.model.gpu_layers = gpu_layers
    cfg.mqtt.enabled = False
    cfg.api.host, cfg.api.port = "127.0.0.1", 0
    daemon = Daemon(cfg)
    daemon.start()
    try:
        assert daemon.api is not None
        base = f"http://127.0.0.1:{daemon.api.port}"
        _, jpeg = cv2.imencode(".jpg", frames(1, seed=77)[0])
        body = json.dumps({"image": base64.b64encode(jpeg.tobytes()).decode()}).encode()

        def status() -> dict[str, Any]:
            with urllib.request.urlopen(f"{base}/api/v1/status", timeout=30) as resp:
                return dict(json.loads(resp.read())["inspection"]["encoder_cache"])

        before = status()
        encode_ms: list[float] = []
        for _ in range(requests):
            req = urllib.request.Request(f"{base}/api/v1/infer", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as resp:
                t = json.loads(resp.read())["timings_ms"]
            encode_ms.append(t["preprocess"] + t["encode"])
        after = status()
    finally:
        daemon.stop()
    hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
    return {"requests": requests, "hits": hits, "misses": misses, "hit_rate": round(hits / max(1, hits + misses), 3),
            "first_encode_ms": round(encode_ms[0], 1), "repeat_encode_p50_ms": pct(encode_ms[1:], 0.5),
            "repeat_encode_p90_ms": pct(encode_ms[1:], 0.9), "cache_bytes": after["bytes"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--frames", type=int, default=12)
    ap.add_argument("--requests", type=int, default=100, help="0: skip the repeated API image")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--gpu-layers", type=int, default=0, help="model.gpu_layers (-1: all layers and the mmproj)")
    ap.add_argument("--side", type=int, default=672, help="frame side of regions, budgets and clip (pixels)")
    ap.add_argument("--parts", default="reference,api,regions,budgets,clip",
                    help="which of reference, api, regions, regions_compact, regions_stream, budgets, clip to run "
                    "(comma-separated; the default leaves regions_stream out)")
    ap.add_argument("--batch-size", type=int, help="model.batch_size of the regions, budgets and clip parts "
                    "(default: the config's, 512)")
    ap.add_argument("--kv-cache", choices=("per_sequence", "unified"),
                    help="model.batch_kv_cache of the regions, budgets and clip parts (default: the config's)")
    ap.add_argument("--encoder-lanes", type=int, help="model.encoder_lanes of the regions, budgets and clip parts "
                    "(libmtmd contexts that encode a frame's crops at the same time; default: the config's, 1)")
    ap.add_argument("--stream-frames", type=int, default=32, help="frames of each camera in regions_stream "
                    "(turns of 8: a turn's first and last frames fill and drain the two stages)")
    ap.add_argument("--variants", help="regions and regions_compact only: model settings compared in one run, "
                    "frame by frame, each its own Inspector (comma-separated lanes<N> or lanes<N>-unified: "
                    "model.encoder_lanes N, model.batch_kv_cache per_sequence or unified; over --encoder-lanes "
                    "and --kv-cache), e.g. lanes1,lanes4,lanes4-unified")
    ap.add_argument("--decode-profile", action="store_true", help="regions and regions_compact: time each "
                    "llama_decode of the measured frames (GPU synchronized after each), tabled by kind (image "
                    "embeddings or tokens) and rows")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    try:
        variants = parse_variants(args.variants) if args.variants else None
    except ValueError as e:
        ap.error(f"--variants: {e}")
    parts = set(args.parts.split(","))
    unknown = parts - {"reference", "api", "regions", "regions_compact", "regions_stream", "budgets", "clip"}
    if unknown:
        ap.error(f"--parts: unknown {', '.join(sorted(unknown))}")
    global BATCH_SIZE, KV_CACHE, ENCODER_LANES
    BATCH_SIZE, KV_CACHE, ENCODER_LANES = args.batch_size, args.kv_cache, args.encoder_lanes
    from edge_runtime.core.cpuinfo import read_cpuinfo

    cpu = read_cpuinfo()
    report: dict[str, Any] = {"machine": cpu.describe() if cpu else "unknown", "cores": os.cpu_count(),
                              "load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        def ran(name: str, t0: float) -> None:  # progress on stderr: a slow part shows which it is
            print(f"programs.py: {name} done in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
            if args.json:  # what is done so far, so a run cut short by a time limit keeps its parts
                args.json.write_text(json.dumps(report, indent=2) + "\n")

        t0 = time.perf_counter()
        if "reference" in parts:
            report["reference"] = reference_cost(args.bundle, args.frames, args.threads, Path(tmp), args.gpu_layers)
        if "api" in parts and args.requests > 0:
            report["repeated_api_image"] = repeated_image(args.bundle, args.requests, args.threads, Path(tmp),
                                                          args.gpu_layers)
        ran("reference and api", t0)
        if "regions" in parts:
            t0 = time.perf_counter()
            report["regions"] = regions_cost(args.bundle, args.frames, args.threads, args.gpu_layers, args.side,
                                             variants=variants, decode_profile=args.decode_profile)
            ran("regions", t0)
        if "regions_compact" in parts:
            t0 = time.perf_counter()
            report["regions_compact"] = regions_cost(args.bundle, args.frames, args.threads, args.gpu_layers,
                                                     args.side, schema=COMPACT_SCHEMA, variants=variants,
                                                     decode_profile=args.decode_profile)
            ran("regions_compact", t0)
        if "regions_stream" in parts:
            t0 = time.perf_counter()
            report["regions_stream"] = regions_stream(args.bundle, args.stream_frames, args.threads,
                                                      args.gpu_layers, args.side, Path(tmp), schema=COMPACT_SCHEMA)
            ran("regions_stream", t0)
        if "budgets" in parts:
            t0 = time.perf_counter()
            report["budgets"] = budget_cost(args.bundle, args.frames, args.threads, args.gpu_layers, args.side)
            ran("budgets", t0)
        if "clip" in parts:
            t0 = time.perf_counter()
            report["clip"] = clip_cost(args.bundle, args.frames, args.threads, args.gpu_layers, args.side)
            ran("clip", t0)
    report["load_after"] = os.getloadavg()[0]
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
