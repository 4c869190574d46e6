"""Frames captured, inspected and dropped per second by the running daemon on the demo bundle.

    python benchmarks/daemon_rates.py --seconds 20 --fps 30
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import edge_runtime.inference.engines  # noqa: F401 - onnxruntime, then llama_cpp (see engines.py)
from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, TriggerConfig
from edge_runtime.core.samples import write_sample_video


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--fps", type=float, default=30)
    ap.add_argument("--cameras", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        video = write_sample_video(Path(tmp) / "v.avi", frames=300, width=640, height=480)
        cfg = Config(device_id="rates", data_dir=Path(tmp))
        cfg.mqtt.enabled = False
        cfg.api.enabled = False
        cfg.governor.enabled = False
        cfg.cameras = [CameraConfig(name=f"cam{i}", source=str(video), fps=args.fps,
                                    trigger=TriggerConfig(mode="continuous")) for i in range(args.cameras)]
        daemon = Daemon(cfg)
        daemon.start()
        time.sleep(2)  # settle
        before = {c["name"]: dict(c["frames"]) for c in daemon.status()["cameras"]}
        time.sleep(args.seconds)
        after = {c["name"]: dict(c["frames"]) for c in daemon.status()["cameras"]}
        daemon.stop()
    out = {}
    for name in after:
        out[name] = {k: round((after[name][k] - before[name][k]) / args.seconds, 2)
                     for k in ("captured", "inspected", "dropped")}
    print(json.dumps({"seconds": args.seconds, "source_fps": args.fps, "per_camera_per_s": out}))


if __name__ == "__main__":
    main()
