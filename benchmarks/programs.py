"""What inspection programs cost, measured in one run on a GGUF + mmproj bundle (the 0.5b-shape pair
of `realistic_pair.py` on a CPU):

1. per-frame time of a camera whose program has one reference against a camera with none: the same
   frames, interleaved (plain, reference, plain, ...), each a whole `Inspector.inspect` (encode,
   prefill, verdict), the encoder cache off so each frame is encoded for each camera. The reference
   is encoded at load and its KV decoded once (the first frame), then reused;
2. a repeated API image: the same JPEG sent `--requests` times to a running daemon's
   `POST /api/v1/infer`; each result's `timings_ms.encode` and the encoder cache's hit rate
   (`/api/v1/status`, `inspection.encoder_cache`).

    python benchmarks/programs.py BUNDLE [--frames 12] [--requests 100] [--threads 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
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


def reference_cost(bundle: str, n: int, threads: int, tmp: Path) -> dict[str, Any]:
    """Per-frame ms of a camera with one reference against one with none, interleaved on the same frames."""
    import cv2

    from edge_runtime.config import CameraConfig, Config, ProgramConfig, ReferenceConfig
    from edge_runtime.inference.model_source import open_inspector

    ref = tmp / "golden.png"
    cv2.imwrite(str(ref), frames(1, seed=900)[0])
    cfg = Config(device_id="bench")
    cfg.model.threads = threads
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


def repeated_image(bundle: str, requests: int, threads: int, tmp: Path) -> dict[str, Any]:
    """The same JPEG `requests` times through a real daemon's REST API."""
    import cv2

    from edge_runtime.app.daemon import Daemon
    from edge_runtime.config import Config

    cfg = Config(device_id="bench", data_dir=tmp / "data")
    cfg.model.path = Path(bundle)
    cfg.model.threads = threads
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
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from edge_runtime.core.cpuinfo import read_cpuinfo

    cpu = read_cpuinfo()
    report: dict[str, Any] = {"machine": cpu.describe() if cpu else "unknown", "cores": os.cpu_count(),
                              "load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        report["reference"] = reference_cost(args.bundle, args.frames, args.threads, Path(tmp))
        if args.requests > 0:
            report["repeated_api_image"] = repeated_image(args.bundle, args.requests, args.threads, Path(tmp))
    report["load_after"] = os.getloadavg()[0]
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
