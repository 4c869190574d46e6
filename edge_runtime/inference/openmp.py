"""Native compute on a thread that ends with it, so no OpenMP team outlives the work.

llama.cpp's CPU backend (and libmtmd's encoder on the CPU) computes with OpenMP: libgomp starts a team
of threads for every thread that runs a parallel region and keeps it until that thread exits. Two live
teams make each other's work slower: a decode on the inspection worker ran 1.4x slower on 2 cores
while the thread that had loaded the model lived on (2.4x with OMP_WAIT_POLICY=active), and an image
chat of a GGUF + mmproj pair 1.3x slower while the encode stage's thread kept the team of its last
encode (docs/benchmarks.md, "One OpenMP team"). The inspection worker's thread is the one that keeps
a team: it decodes every step. Everything else that computes runs through `on_passing_thread`.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def on_passing_thread(fn: Callable[..., T], *args: object, name: str = "compute") -> T:
    """fn(*args) on a new thread, joined before this returns (its exception is raised here)."""
    with ThreadPoolExecutor(1, thread_name_prefix=name) as pool:  # leaving `with` joins the thread
        return pool.submit(fn, *args).result()
