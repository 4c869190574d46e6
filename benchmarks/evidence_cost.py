"""What keeping evidence costs per inspection: milliseconds on the inspection thread and bytes on disk.

1. The store alone, per frame size (JPEG encode + sha256 + thumbnail + fsync'd atomic writes + SQLite
   row), on camera-like frames (the sample video's parts, scaled, with sensor noise).
2. The daemon on the demo bundle, the same frames inspected with evidence on and off (A/B,
   interleaved): the difference of the inspection time as the journal sees it.

    python benchmarks/evidence_cost.py --frames 100 --inspections 40
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

SIZES = [(320, 240), (640, 480), (1280, 720), (1920, 1080)]


def camera_frames(tmp: Path, width: int, height: int, n: int) -> list[np.ndarray]:
    from edge_runtime.core.samples import write_sample_video

    cap = cv2.VideoCapture(str(write_sample_video(tmp / f"v{width}.avi", frames=min(n, 60))))
    rng = np.random.default_rng(0)
    frames = []
    while len(frames) < n:
        ok, frame = cap.read()
        if not ok:
            cap.set(cv2.CAP_PROP_POS_FRAMES, 0)
            continue
        big = cv2.resize(frame, (width, height), interpolation=cv2.INTER_LINEAR).astype(np.int16)
        noise = rng.normal(0, 3, big.shape).astype(np.int16)  # sensor noise: real frames never repeat
        frames.append(np.clip(big + noise, 0, 255).astype(np.uint8))
    cap.release()
    return frames


def pct(values: list[float], q: float) -> float:
    return round(sorted(values)[min(len(values) - 1, int(q * len(values)))], 2)


def store_cost(tmp: Path, n: int) -> list[dict[str, object]]:
    from edge_runtime.config import EvidenceConfig
    from edge_runtime.verdicts.evidence import EvidenceStore

    rows = []
    for width, height in SIZES:
        frames = camera_frames(tmp, width, height, n)
        store = EvidenceStore(EvidenceConfig(), tmp / f"ev{width}", tmp / f"j{width}.sqlite3")
        ms, sizes = [], []
        for i, frame in enumerate(frames):
            t0 = time.perf_counter()
            link = store.save(frame, f"r{i}", {"defect": True})
            ms.append((time.perf_counter() - t0) * 1000)
            assert link is not None
            sizes.append(link["bytes"])
        disk = store.used_bytes() / len(frames)
        rows.append({"frame": f"{width}x{height}", "n": n, "ms_p50": pct(ms, 0.5), "ms_p95": pct(ms, 0.95),
                     "image_bytes_mean": round(statistics.mean(sizes)), "disk_bytes_mean": round(disk)})
        store.close()
    return rows


def daemon_ab(tmp: Path, n: int) -> dict[str, object]:
    from edge_runtime_models.demo import build_demo_bundle

    from edge_runtime.app.daemon import Daemon
    from edge_runtime.config import Config

    bundle = build_demo_bundle(tmp / "bundle")
    frames = camera_frames(tmp, 640, 480, n)
    totals: dict[bool, list[float]] = {True: [], False: []}
    cfg = Config(device_id="bench", data_dir=tmp / "data")
    cfg.model.path, cfg.model.threads = bundle, 2
    cfg.mqtt.enabled = cfg.api.enabled = cfg.governor.enabled = False
    cfg.evidence.keep_passes = 1
    daemon = Daemon(cfg)
    daemon.start()
    try:
        store = daemon.verdicts.evidence
        for i, frame in enumerate(frames):
            for keep in (True, False) if i % 2 else (False, True):  # interleaved: drift hits both
                daemon.verdicts.evidence = store if keep else None
                t0 = time.perf_counter()
                daemon.entry.submit_image(frame, journal=True).result(timeout=60)
                totals[keep].append((time.perf_counter() - t0) * 1000)
    finally:
        daemon.verdicts.evidence = store
        daemon.stop()
    on, off = statistics.median(totals[True]), statistics.median(totals[False])
    return {"frame": "640x480", "n": n, "inspection_ms_p50_with": round(on, 1),
            "inspection_ms_p50_without": round(off, 1), "difference_ms": round(on - off, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--inspections", type=int, default=40)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = {"store": store_cost(Path(tmp), args.frames), "daemon": daemon_ab(Path(tmp), args.inspections)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
