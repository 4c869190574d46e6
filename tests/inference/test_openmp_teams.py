"""No OpenMP team outlives the native work that started it, except the inspection worker's: llama.cpp's
CPU backend and libmtmd's CPU encoder compute with OpenMP, libgomp keeps a team for every thread that
ran a parallel region until that thread exits, and a second live team made the worker's decodes 1.4x
slower (docs/benchmarks.md, "One OpenMP team"). Each check runs in its own process, where the threads
it counts are its own."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.support.tiny_pairs import TinyPair, write_pair_bundle

_THREADS = 3  # llama.cpp's threads: an OpenMP team of the calling thread and 2 more

_COUNT = """
import os, sys, threading, time
import numpy as np
import edge_runtime.inference.engines  # onnxruntime, then llama_cpp
from edge_runtime.config import Config
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.model_source import open_inspector

def threads():  # once none has ended for half a second: a dead thread's team ends a moment after it
    count, since = len(os.listdir("/proc/self/task")), time.monotonic()
    while time.monotonic() - since < 0.5:
        time.sleep(0.05)
        now = len(os.listdir("/proc/self/task"))
        if now != count:
            count, since = now, time.monotonic()
    return count

cfg = Config(device_id="t")
cfg.model.threads = THREADS
cfg.model.path = sys.argv[1]
"""

_LOAD = _COUNT + """
start = threads()
opened = open_inspector(cfg, None)  # warms up: a decode on THREADS threads
after_open = threads()
direct = Inspector(load_bundle(sys.argv[1]), cfg.model, "t")  # the same load on this thread, which lives on
print(after_open - start, threads() - after_open)
"""

_ENCODE = _COUNT + """
cfg.model.warmup = False
ins = open_inspector(cfg, None)
frame = np.random.default_rng(0).integers(0, 255, (96, 128, 3), dtype=np.uint8)
encoded, done = threading.Event(), threading.Event()

def stage():  # the encode stage: a thread that encodes and lives on
    ins.encode(frame)
    encoded.set()
    done.wait()

before = threads()
worker = threading.Thread(target=stage)
worker.start()
encoded.wait()
print(threads() - before - 1)  # the stage's own thread is not a team
done.set()
"""


def _run(script: str, bundle: Path) -> list[int]:
    out = subprocess.run([sys.executable, "-c", script.replace("THREADS", str(_THREADS)), str(bundle)],
                         capture_output=True, text=True, timeout=300, check=True).stdout.split()
    return [int(x) for x in out]


def test_loading_the_model_leaves_no_openmp_team_behind(demo_dir: Path) -> None:
    opened, direct = _run(_LOAD, demo_dir)
    # Both loads start the same engines' threads (ONNX Runtime's pool lives with its session); the load
    # on the main thread also leaves that thread's OpenMP team: the _THREADS - 1 threads it started.
    assert direct - opened == _THREADS - 1, (
        f"open_inspector left {opened} threads, a load on the main thread {direct}: "
        "the loading thread's OpenMP team outlived the load")


def test_an_image_encoded_by_libmtmd_on_the_cpu_leaves_no_openmp_team_on_the_encoding_thread(
        tiny_pairs: Callable[[str], TinyPair], tmp_path: Path) -> None:
    bundle = write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp_path / "pair")
    (extra,) = _run(_ENCODE, bundle)
    assert extra == 0, f"the encode stage's thread kept {extra} more threads: its OpenMP team outlived the encode"
