"""Verdicts per second of the daemon on a stream of mostly good parts: `gate.mode: skip_ok` against
the language model answering every frame (`off`), with every defective part checked to reach it.

The stream is generated (tests/support/parts.py): `--frames` parts, 1 in `--defect-every` defective
(scratch, stain and missing hole in turn, at sizes the gate is measured to catch: docs/inspection.md).
A bank is fitted on `--train` other good parts; its threshold is the largest score of `--holdout`
further good parts (what `gate fit` chooses without labelled data). Each mode then runs the same
frames through one Daemon started from its config (`cameras[].gate` in skip_ok; journal and evidence
on; the encoder cache, MQTT, API and governor off), in turns of `--chunk` frames (off: the gates taken
out), so the load of a shared machine falls on both alike; `--inflight` requests queued at a time as
a camera's scheduler keeps the queue fed. An escape is a defective frame answered by the gate
(`source.engine: gate`); on this set it must be 0.

With `--tiles N` the camera's inspection program cuts each frame into N tiles side by side: the bank
is fitted by `gate fit --camera` (one section per tile), skip_ok answers a frame whose every tile is
under its threshold and asks the language model only about the tiles over theirs; a defect whose tile
the gate answered counts as an escape too.

    python benchmarks/gate_stream.py [--model DIR] [--frames 400] [--defect-every 20] [--audit-every 50] [--tiles 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from pathlib import Path
from typing import Any

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import edge_runtime.inference.engines  # noqa: E402,F401 - onnxruntime, then llama_cpp (see engines.py)

# The demo schema requires every field: the gated OK verdict is configured whole (gate.verdict).
OK_VERDICT = {"defect": False, "category": "none", "confidence": 1.0, "notes": "surface clean"}
DEFECTS = (("scratch", 40), ("stain", 20), ("missing_hole", 14))  # kind, size in px of a 224 frame


def stream(frames: int, defect_every: int, size: int) -> list[tuple[np.ndarray, str | None, Any]]:
    """The frames in order with the defect drawn on each (None: a good part) and its box (x, y, w, h)."""
    from tests.support.parts import clean_part, defective_part

    out: list[tuple[np.ndarray, str | None, Any]] = []
    for i in range(frames):
        if i % defect_every == defect_every - 1:
            kind, px = DEFECTS[(i // defect_every) % len(DEFECTS)]
            image, defect = defective_part(50_000 + i, kind, px * size // 224, size, size)  # type: ignore[arg-type]
            out.append((image, kind, defect.box))
        else:
            out.append((clean_part(20_000 + i, size, size), None, None))
    return out


def fit_tiles(config: Any, model: str, bank: Path, train: int, holdout: int, size: int, tmp: Path,
              max_patches: int | None = None) -> dict[str, Any]:
    """`gate fit --camera line` on good parts: one bank section per tile, each with its held-out threshold."""
    from edge_runtime.evaluation.gate_fit import FitOptions, fit_gate
    from edge_runtime.inference.anomaly.bank import read_headers
    from tests.support.parts import clean_part

    folder = tmp / "ok"
    folder.mkdir()
    for s in range(train + holdout):
        cv2.imwrite(str(folder / f"part-{s:04d}.png"), clean_part(s, size, size))
    bound = {} if max_patches is None else {"max_patches": max_patches}
    fit_gate(config, FitOptions(images=folder, out=bank, model=model, camera="line", **bound,
                                holdout=holdout / (train + holdout), max_images=train + holdout, progress=False))
    headers = read_headers(bank)
    return {"train": train, "holdout": holdout, "tiles": len(headers),
            "threshold": [round(h.threshold.value or 0.0, 6) for h in headers],
            "bank_patches": [h.vectors.patches for h in headers]}


def fit(config: Any, model: str, bank: Path, train: int, holdout: int, size: int,
        max_patches: int | None = None) -> dict[str, Any]:
    """Fit a bank on good parts and set its threshold to the held-out good parts' largest score."""
    from edge_runtime.evaluation.gate_fit import in_memory_gate
    from edge_runtime.inference.anomaly import gate_context, patch_features, write_bank
    from edge_runtime.inference.anomaly.bank import BankThreshold
    from edge_runtime.inference.anomaly.fit import bank_header, fit_bank
    from edge_runtime.inference.model_source import open_inspector
    from tests.support.parts import clean_part

    inspector = open_inspector(config, model)
    try:
        context = gate_context(inspector.bundle, inspector.settings)
        feats = [patch_features(inspector.encode(clean_part(s, size, size)), context) for s in range(train)]
        result = fit_bank(feats) if max_patches is None else fit_bank(feats, max_patches)
        header = bank_header(result, context, feats[0])
        gate = in_memory_gate(result, context, header)
        gate.search_threads = config.cameras[0].gate.search_threads
        held = [gate.score(inspector.encode(clean_part(10_000 + s, size, size))).score for s in range(holdout)]
    finally:
        inspector.close()
    threshold = max(held) * (1 + 1e-6)  # every held-out good part under it, as `gate fit` does
    header = header.model_copy(update={"threshold": BankThreshold(
        value=threshold, method="holdout-max", note=f"largest of {holdout} held-out good parts")})
    write_bank(bank, header, result.vectors)
    return {"train": train, "holdout": holdout, "threshold": round(threshold, 6),
            "bank_patches": result.vectors.shape[0]}


def use_numpy_search(threads: int) -> None:
    """`--search numpy`: the bank's nearest neighbours by numpy's matrix product (its own, newer OpenBLAS,
    its threads set once for the process by threadpoolctl) in place of faiss's: the same exact search
    (benchmarks/gate_search.py), to tell on a machine whether faiss's bundled OpenBLAS is what a gated
    frame waits for."""
    from gate_search import numpy_nearest
    from threadpoolctl import threadpool_limits

    from edge_runtime.inference.anomaly import search

    threadpool_limits(threads, user_api="blas")  # numpy's OpenBLAS: the search is its only big user here

    add = search.PatchIndex.add

    def keep(self: Any, vectors: np.ndarray) -> None:
        add(self, vectors)
        rows = np.ascontiguousarray(vectors, dtype=np.float32)
        self.np_bank = rows if not hasattr(self, "np_bank") else np.concatenate([self.np_bank, rows])
        self.np_norms = (self.np_bank * self.np_bank).sum(axis=1)

    def nearest(self: Any, queries: np.ndarray, threads: int = 1) -> np.ndarray:
        return numpy_nearest(np.ascontiguousarray(queries, dtype=np.float32), self.np_bank, self.np_norms)

    search.PatchIndex.add = keep  # type: ignore[method-assign]
    search.PatchIndex.nearest = nearest  # type: ignore[method-assign]


def run(config: Any, model: str, frames: list[tuple[np.ndarray, str | None, Any]], inflight: int, warmup: int,
        chunk: int) -> dict[str, Any]:
    """Both modes on one Daemon started from `config` (its camera's gate in skip_ok), in alternating
    chunks of `chunk` frames (off: the gates taken out; skip_ok: the ones read from the config), so a
    shared machine's changing load falls on both alike."""
    from edge_runtime.app.daemon import Daemon
    from edge_runtime.core.inspection_queue import InspectionRequest

    daemon = Daemon(config, model_dir=model)
    delivering = _timed_deliveries(daemon.worker)
    daemon.start()
    loaded = dict(daemon.gates.cameras)
    out: dict[str, dict[str, Any]] = {m: {"seconds": 0.0, "results": [], "loads": []} for m in ("off", "skip_ok")}
    try:
        def submit(i: int, image: np.ndarray) -> Future[Any]:
            return daemon.inspections.submit(InspectionRequest(image, "line", None, seq=i, journal=True))

        for i in range(warmup):  # the first verdicts allocate: not counted
            submit(-1 - i, frames[i % len(frames)][0]).result(timeout=300)
        before = _counts(daemon)
        for start in range(0, len(frames), chunk):
            for mode in ("off", "skip_ok"):
                daemon.gates.install(loaded if mode == "skip_ok" else {})
                m = out[mode]
                m["loads"].append(os.getloadavg()[0])
                # A camera's queue takes a new frame when any request ends, not only its oldest: waiting
                # for the oldest would hold gated frames behind a verdict still decoding.
                pending: dict[Future[Any], int] = {}
                done: dict[int, Any] = {}
                t0 = time.perf_counter()
                for i in range(start, min(start + chunk, len(frames))):
                    if len(pending) >= inflight:
                        finished, _ = wait(pending, timeout=300, return_when=FIRST_COMPLETED)
                        for f in finished:
                            done[pending.pop(f)] = f.result()
                    pending[submit(i, frames[i][0])] = i
                for f in list(pending):
                    done[pending.pop(f)] = f.result(timeout=300)
                m["seconds"] += time.perf_counter() - t0
                m.setdefault("deliver_ms", []).extend(delivering)
                delivering.clear()
                m["results"].extend(done[i] for i in sorted(done))
        daemon.gates.install(loaded)
        after = _counts(daemon)
    finally:
        daemon.stop()
    defective = [kind for _, kind, _ in frames]
    report: dict[str, Any] = {}
    for mode, m in out.items():
        engines = [r.source.get("engine") for r in m["results"]]
        # An escape: a defective frame answered by the gate, or the tile holding its defect answered by it.
        escapes = [i for i, (r, (_, k, box)) in enumerate(zip(m["results"], frames, strict=True))
                   if k is not None and (r.source.get("engine") == "gate" or _tile_answered(r, box))]
        scores = [(r.gate or {}).get("score") for r in m["results"]]
        defect_scores = [s for s, k in zip(scores, defective, strict=True) if k is not None and s is not None]
        report[mode] = {
            "frames": len(frames), "seconds": round(m["seconds"], 2),
            "verdicts_per_s": round(len(frames) / m["seconds"], 3),
            "load_per_chunk": [round(x, 1) for x in m["loads"]],
            "by_gate": engines.count("gate"), "by_vlm": len(frames) - engines.count("gate"),
            "defective": sum(k is not None for k in defective), "escapes": len(escapes), "escaped_frames": escapes,
            "tiles_asked": sum(1 for r in m["results"] for t in r.regions or [] if t.get("engine") != "gate"),
            "lowest_defect_score": round(min(defect_scores), 6) if defect_scores else None,
            "timings_ms": _timings(m["results"]),
            # What handing a verdict on costs (journal, evidence, sinks), by who answered: a gated frame's
            # is the gate-delivery thread's, beside stage 1; a language-model verdict's is stage 2's.
            "deliver_ms": {engine: {"mean": round(float(np.mean(picked)), 2) if picked else None,
                                    "count": len(picked)}
                           for engine, picked in (("gate", [t for t, g in m.get("deliver_ms", []) if g]),
                                                  ("vlm", [t for t, g in m.get("deliver_ms", []) if not g]))}}
    report["skip_ok"]["gate_counts"] = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    return report


def _timed_deliveries(worker: Any) -> list[tuple[float, bool]]:
    """A list the worker's deliveries append to: (milliseconds, whether the gate answered it): the journal
    row, evidence, the sinks."""
    times: list[tuple[float, bool]] = []
    deliver = worker._deliver

    def timed(request: Any, result: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return deliver(request, result)
        finally:
            times.append(((time.perf_counter() - t0) * 1000, result.source.get("engine") == "gate"))

    worker._deliver = timed
    return times


def _timings(results: list[Any]) -> dict[str, dict[str, float]]:
    """Where a frame's time went, by who answered it: the mean of each stage of its `timings_ms`, and
    of the gate's search (`search`, in `total` with the encode)."""
    out: dict[str, dict[str, float]] = {}
    for engine in ("gate", "vlm"):
        picked = [r for r in results if (r.source.get("engine") == "gate") == (engine == "gate")]
        if picked:
            out[engine] = {k: round(float(np.mean([r.timings_ms.get(k, 0.0) for r in picked])), 1)
                           for k in ("preprocess", "encode", "prefill", "decode", "total")}
            searched = [r.gate["search_ms"] for r in picked if r.gate and "search_ms" in r.gate]
            out[engine]["search"] = round(float(np.mean(searched)), 2) if searched else 0.0
            out[engine]["frames"] = len(picked)
    return out


def _tile_answered(result: Any, box: Any) -> bool:
    """Whether the gate answered a tile that holds the centre of the defect's box."""
    if box is None:
        return False
    cx, cy = box[0] + box[2] / 2, box[1] + box[3] / 2
    return any(t.get("engine") == "gate" and t["box"][0] <= cx < t["box"][0] + t["box"][2]
               and t["box"][1] <= cy < t["box"][1] + t["box"][3] for t in result.regions or [])


def _counts(daemon: Any) -> dict[str, int]:
    counts = daemon.gates.counts().get("line")
    if counts is None:
        return {}
    return {k: v for k, v in counts.to_dict().items() if isinstance(v, int)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="bundle folder (default: the demo bundle, built in a temporary folder)")
    ap.add_argument("--frames", type=int, default=400)
    ap.add_argument("--defect-every", type=int, default=20, help="1 in N frames defective (20: 5%%)")
    ap.add_argument("--audit-every", type=int, default=50)
    ap.add_argument("--train", type=int, default=60)
    ap.add_argument("--holdout", type=int, default=30)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--inflight", type=int, default=4, help="requests queued at a time")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=100, help="frames per turn of each mode")
    ap.add_argument("--gpu-layers", type=int, default=0, help="model.gpu_layers (-1: every layer and the mmproj "
                    "on the GPU)")
    ap.add_argument("--tiles", type=int, default=1, help="the camera's program cuts each frame into N tiles "
                    "side by side, a bank section each (1: whole frames)")
    ap.add_argument("--no-evidence", action="store_true", help="evidence.enabled false in both modes")
    ap.add_argument("--max-patches", type=int, help="the bank's size bound (gate fit --max-patches; default its own)")
    ap.add_argument("--search-threads", type=int, default=1, help="gate.search_threads (cores for the search)")
    ap.add_argument("--search", choices=("faiss", "numpy"), default="faiss",
                    help="the bank's search: the daemon's (faiss) or numpy's matrix product (use_numpy_search)")
    args = ap.parse_args()
    if args.search == "numpy":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        use_numpy_search(args.search_threads)

    from edge_runtime.config import CameraConfig, Config, ProgramConfig, TriggerConfig
    from edge_runtime.config.gate import GateConfig

    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        model = args.model
        if model is None:
            from edge_runtime_models.demo import build_demo_bundle

            model = str(build_demo_bundle(tmp / "demo"))
        frames = stream(args.frames, args.defect_every, args.size)
        still = tmp / "still.png"
        cv2.imwrite(str(still), frames[0][0])
        bank = tmp / "line.bank"
        programs = {} if args.tiles <= 1 else {"tiles": ProgramConfig.model_validate(
            {"tiling": {"rows": 1, "cols": args.tiles, "overlap": 0}})}
        program = "tiles" if programs else None
        base = Config(device_id="gate-stream", data_dir=tmp / "fit", programs=programs,
                      cameras=[CameraConfig(name="line", source=str(still), program=program)])
        base.model.warmup, base.model.gpu_layers = False, args.gpu_layers
        base.cameras[0].gate = GateConfig(mode="off", search_threads=args.search_threads)
        fitted = fit_tiles(base, model, bank, args.train, args.holdout, args.size, tmp, args.max_patches) \
            if programs else fit(base, model, bank, args.train, args.holdout, args.size, args.max_patches)
        out: dict[str, Any] = {"model": model, "frame": f"{args.size}x{args.size}",
                               "defective_share": round(1 / args.defect_every, 4), "inflight": args.inflight,
                               "audit_every": args.audit_every, "evidence": not args.no_evidence,
                               "search_threads": args.search_threads, "search": args.search,
                               "fit": fitted, "modes": {}}
        cfg = Config(device_id="gate-stream", data_dir=tmp / "data", programs=programs)
        cfg.mqtt.enabled = cfg.api.enabled = cfg.governor.enabled = False
        cfg.evidence.enabled = not args.no_evidence
        # Both modes see the same frames: cached embeddings would spare the second mode its encodes.
        cfg.model.encoder_cache_mb = 0
        cfg.model.gpu_layers = args.gpu_layers
        gate = GateConfig(mode="skip_ok", bank=str(bank), audit_every=args.audit_every, verdict=OK_VERDICT,
                          search_threads=args.search_threads)
        cfg.cameras = [CameraConfig(name="line", source=str(still), trigger=TriggerConfig(mode="on_demand"),
                                    gate=gate, program=program)]
        out["modes"] = run(cfg, model, frames, args.inflight, args.warmup, args.chunk)
    modes = out["modes"]
    out["speedup"] = round(modes["skip_ok"]["verdicts_per_s"] / modes["off"]["verdicts_per_s"], 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
