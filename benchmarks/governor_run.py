"""Hold a power budget with the real daemon: measure unthrottled power, then run under a budget.

Runs the daemon in-process on a generated video camera in continuous mode, with the governor on the
auto-detected sensor (NVML on an NVIDIA GPU machine). Phase 1 has no budget and measures what the
device draws; phase 2 sets the budget to idle + `fraction` x (busy - idle) and records the governor.
Prints a JSON summary; with --out, also writes the sampled trace as JSONL.

    python benchmarks/governor_run.py --model DIR --gpu-layers -1 --seconds 60 --out trace.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import edge_runtime.inference.engines  # noqa: F401 - onnxruntime, then llama_cpp (see engines.py)
from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, GovernorConfig, TriggerConfig
from edge_runtime.core.samples import write_sample_video


def run_phase(model: str, gpu_layers: int, seconds: float, budget: float | None, data: Path,
              trace: list[dict], replay: Path | None = None) -> dict:
    cfg = Config(device_id="gov-bench", data_dir=data)
    cfg.model.path, cfg.model.gpu_layers = Path(model), gpu_layers
    cfg.mqtt.enabled = False
    cfg.api.enabled = False
    cfg.governor = GovernorConfig(max_power_w=budget, interval_s=0.5, power_window_s=5, step_down_after_s=2,
                                  recover_after_s=10, **({"sensor": "replay", "replay_file": replay} if replay else {}))
    cfg.cameras = [CameraConfig(name="cam", source=str(write_sample_video(data / "v.avi")), fps=30,
                                trigger=TriggerConfig(mode="continuous"))]
    daemon = Daemon(cfg)
    daemon.start()
    powers, levels = [], []
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            time.sleep(0.5)
            g = daemon.status()["governor"] or {}
            sample = {"t": round(time.monotonic() - t0, 2), "budget_w": budget, "power_w": g.get("power_w"),
                      "level": g.get("level"), "temps": g.get("temperatures"),
                      "inspected": daemon.pipeline.delivered}
            trace.append(sample)
            if g.get("power_w") is not None:
                powers.append(g["power_w"])
            levels.append(g.get("level"))
        inspected = daemon.pipeline.delivered
    finally:
        daemon.stop()
    avg = round(statistics.fmean(powers), 1) if powers else None
    return {"budget_w": budget, "seconds": seconds, "power_avg_w": avg,
            "power_max_w": max(powers) if powers else None, "inspections_per_s": round(inspected / seconds, 2),
            "levels_seen": sorted({lv for lv in levels if lv}), "sensor": g.get("sensor"),
            "level_changes": g.get("changes")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--gpu-layers", type=int, default=-1)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--fraction", type=float, default=0.5, help="budget between idle (0) and busy (1) power")
    ap.add_argument("--idle-w", type=float, help="idle power; default: measured before phase 1")
    ap.add_argument("--out")
    ap.add_argument("--replay", type=Path, help="a recorded sensor trace (JSONL/CSV) instead of the machine's sensor")
    args = ap.parse_args()
    trace: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        from edge_runtime.power.sensors import detect_sensor
        sensor = detect_sensor("replay", args.replay) if args.replay else detect_sensor()
        idle = args.idle_w
        if idle is None:
            readings = []
            for _ in range(6):
                readings.append(sensor.read().total_power_w or 0.0)
                time.sleep(0.5)
            idle = statistics.fmean(readings)
        sensor.close()
        free = run_phase(args.model, args.gpu_layers, args.seconds / 2, None, Path(tmp) / "a", trace, args.replay)
        busy = free["power_avg_w"] or idle
        budget = round(idle + args.fraction * (busy - idle), 1)
        if budget <= 0:
            sys.exit(f"governor_run: no power reading on this machine (sensor {sensor.name}); "
                     "run it where NVML, jtop or sysfs report power, or pass --replay TRACE")
        held = run_phase(args.model, args.gpu_layers, args.seconds, budget, Path(tmp) / "b", trace, args.replay)
    summary = {"idle_w": round(idle, 1), "unthrottled": free, "governed": held,
               "held": held["power_avg_w"] is not None and held["power_avg_w"] <= budget}
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text("".join(json.dumps(s) + "\n" for s in trace))


if __name__ == "__main__":
    main()
