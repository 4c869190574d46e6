"""What the anomaly gate costs per frame, against what the encoder costs, measured in one run.

For a bundle (the demo's ONNX encoder, or a GGUF + mmproj pair such as the 0.5b-shape one of
`realistic_pair.py`): synthetic good parts (tests/support/parts.py) are encoded, a bank is fitted
from them, and banks of each size in `--sizes` are made from those real patch vectors (repeated with
a little noise where the parts give fewer patches than the size: the search's cost depends on the
bank's size and width, not on where its vectors came from). Then, frame by frame and interleaved, the
encoder's time (`Inspector.encode`) and the gate's (`AnomalyGate.score`: features, the search, the
score) at each bank size. Also per size: the memory the search holds and the time to load the bank.

    python benchmarks/gate.py [--model DIR] [--frames 20] [--sizes 1000,10000,100000] [--size 224]
        [--search-threads 1,4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def pct(values: list[float], q: float) -> float:
    return round(sorted(values)[min(len(values) - 1, int(q * len(values)))], 3)


def bank_of(vectors: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """n rows: the real vectors, then copies of them with a little noise (a real bank's spread)."""
    if n <= vectors.shape[0]:
        return vectors[np.random.default_rng(seed).choice(vectors.shape[0], n, replace=False)]
    rng = np.random.default_rng(seed)
    extra = vectors[rng.integers(0, vectors.shape[0], n - vectors.shape[0])]
    noise = rng.normal(0, 0.01, extra.shape).astype(np.float32)
    noise[:, -2:] = 0  # the place columns stay on the grid
    return np.concatenate([vectors, extra + noise]).astype(np.float32)


def run(model: str | None, frames: int, sizes: list[int], size: int, train: int, threads: int,
        gpu_layers: int = 0, search_threads: tuple[int, ...] = (1,)) -> dict[str, Any]:
    from edge_runtime.config import Config
    from edge_runtime.inference.anomaly import AnomalyGate, gate_context, patch_features, write_bank
    from edge_runtime.inference.anomaly.fit import bank_header, fit_bank
    from edge_runtime.inference.anomaly.search import index_bytes
    from edge_runtime.inference.model_source import open_inspector
    from tests.support.parts import clean_part, defective_part

    cfg = Config(device_id="bench")
    cfg.model.threads, cfg.model.warmup, cfg.model.gpu_layers = threads, False, gpu_layers
    inspector = open_inspector(cfg, model)
    out: dict[str, Any] = {"bundle": inspector.bundle.name, "kind": inspector.bundle.kind, "frame": f"{size}x{size}",
                           "threads": threads, "gpu_layers": gpu_layers}
    try:
        context = gate_context(inspector.bundle, inspector.settings)
        feats = [patch_features(inspector.encode(clean_part(s, size, size)), context) for s in range(train)]
        fit = fit_bank(feats, max_patches=10**9)
        header = bank_header(fit, context, feats[0])
        out |= {"patches_per_frame": feats[0].layout.patches, "width": int(fit.vectors.shape[1]),
                "grid": feats[0].layout.grid(), "fit_images": train}
        images = [clean_part(1000 + i, size, size) if i % 2 else
                  defective_part(2000 + i, "stain", size // 10, size, size)[0] for i in range(frames)]
        gates: dict[int, Any] = {}
        loads: dict[int, float] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for n in sizes:
                vectors = bank_of(fit.vectors, n)
                path = Path(tmp) / f"{n}.bank"
                h = header.model_copy(update={"vectors": header.vectors.model_copy(update={"patches": n})})
                write_bank(path, h, vectors)
                t0 = time.perf_counter()
                gates[n] = AnomalyGate.load(path, context, 8 << 30)
                loads[n] = time.perf_counter() - t0
        runs = [(n, t) for n in sizes for t in search_threads]  # gate.search_threads of each bank
        inspector.encode(images[0])  # the first encode allocates
        enc_ms: list[float] = []
        gate_ms: dict[tuple[int, int], list[float]] = {r: [] for r in runs}
        for img in images:
            t0 = time.perf_counter()
            enc = inspector.encode(img)
            enc_ms.append((time.perf_counter() - t0) * 1000)
            for n, t in runs:  # right after the encode it is measured against: the same load on the machine
                gates[n].search_threads = t
                t0 = time.perf_counter()
                gates[n].score(enc)
                gate_ms[(n, t)].append((time.perf_counter() - t0) * 1000)
        enc50 = statistics.median(enc_ms)
        out["encode_ms"] = {"p50": round(enc50, 2), "p95": pct(enc_ms, 0.95)}
        rows = []
        for n, t in runs:
            row = {"bank_patches": n, "search_threads": t, "memory_mib": round(index_bytes(n, out["width"]) / 2**20, 1),
                   "load_s": round(loads[n], 2), "gate_ms_p50": round(statistics.median(gate_ms[(n, t)]), 3),
                   "gate_ms_p95": pct(gate_ms[(n, t)], 0.95),
                   "share_of_encode": round(statistics.median(gate_ms[(n, t)]) / enc50, 4)}
            rows.append(row)
        out["banks"] = rows
    finally:
        inspector.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="bundle folder (default: the demo bundle)")
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--sizes", default="1000,10000,100000", help="bank sizes in patches")
    ap.add_argument("--size", type=int, default=224, help="the parts' frame size (square)")
    ap.add_argument("--train", type=int, default=40, help="good parts encoded for the bank's vectors")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--search-threads", default="1", help="gate.search_threads to measure, comma-separated "
                    "(each bank at each, interleaved frame by frame)")
    ap.add_argument("--gpu-layers", type=int, default=0, help="model.gpu_layers (-1: every layer and the mmproj "
                    "on the GPU)")
    args = ap.parse_args()
    out = run(args.model, args.frames, [int(s) for s in args.sizes.split(",")], args.size, args.train, args.threads,
              args.gpu_layers, tuple(int(t) for t in args.search_threads.split(",")))
    print(json.dumps(out, indent=2))
    print(f"\n{out['bundle']} ({out['kind']}), {out['frame']} frames, {out['patches_per_frame']} patches of "
          f"{out['width']} values; encoder p50 {out['encode_ms']['p50']} ms")
    for r in out["banks"]:
        print(f"  bank {r['bank_patches']:>7} patches ({r['memory_mib']} MiB, load {r['load_s']} s), "
              f"{r['search_threads']} search thread(s): "
              f"gate {r['gate_ms_p50']} ms p50 = {r['share_of_encode']:.1%} of the encoder")


if __name__ == "__main__":
    main()
