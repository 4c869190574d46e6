"""The model loads on a thread that ends with the load, so the OpenMP team that llama.cpp's CPU backend
starts for the load's warm-up does not outlive it beside the team of the inspection worker, which made
every decode of the daemon 1.4x slower (docs/benchmarks.md, "One OpenMP team")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_THREADS = 3  # llama.cpp's threads: an OpenMP team of the calling thread and 2 more

_SCRIPT = f"""
import os, sys, time
import edge_runtime.inference.engines  # onnxruntime, then llama_cpp
from edge_runtime.config import Config
from edge_runtime.core.bundle import load_bundle
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.model_source import open_inspector

def threads():
    # once none has ended for half a second: a dead thread's OpenMP team ends a moment after it
    count, since = len(os.listdir("/proc/self/task")), time.monotonic()
    while time.monotonic() - since < 0.5:
        time.sleep(0.05)
        now = len(os.listdir("/proc/self/task"))
        if now != count:
            count, since = now, time.monotonic()
    return count

cfg = Config(device_id="t")
cfg.model.threads = {_THREADS}
cfg.model.path = sys.argv[1]
start = threads()
passing = open_inspector(cfg, None)  # warms up: a decode on {_THREADS} threads
after_open = threads()
direct = Inspector(load_bundle(sys.argv[1]), cfg.model, "t")  # the same load on this thread, which lives on
after_direct = threads()
print(after_open - start, after_direct - after_open)
"""


def test_loading_the_model_leaves_no_openmp_team_behind(demo_dir: Path) -> None:
    out = subprocess.run([sys.executable, "-c", _SCRIPT, str(demo_dir)], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    opened, direct = int(out[0]), int(out[1])
    # Both loads start the same engines' threads (ONNX Runtime's pool lives with its session); the load
    # on the main thread also leaves that thread's OpenMP team: the _THREADS - 1 threads it started.
    assert direct - opened == _THREADS - 1, (
        f"open_inspector left {opened} threads, a load on the main thread {direct}: "
        "the loading thread's OpenMP team outlived the load")
