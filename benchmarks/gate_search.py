"""The gate's nearest-neighbour search alone, by BLAS: faiss-cpu's flat L2 index (its wheel bundles its own
OpenBLAS) against the same exact search as numpy matrix products (numpy's wheel bundles a newer OpenBLAS),
at bank sizes and thread counts, with what each OpenBLAS says the CPU is (threadpoolctl, when installed).

Why: on the H200's host one faiss thread searched a 1,000-patch bank of 2,050-wide vectors in 40 ms
(docs/benchmarks.md) where CPU-2's AMD cores take 6 ms, so the question is the BLAS, not the search.
`--coretype X` runs the faiss side again in a child process with OPENBLAS_CORETYPE=X (OpenBLAS reads it
once, at load), which tells a kernel chosen for the wrong CPU from a slow CPU.

    python benchmarks/gate_search.py [--width 2050] [--queries 144] [--banks 1000,10000] [--threads 1,4,16]
        [--coretype SkylakeX,Haswell]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def blas_info() -> list[dict[str, Any]]:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return [{"note": "threadpoolctl not installed"}]
    return [{k: i.get(k) for k in ("internal_api", "version", "architecture", "num_threads", "filepath")}
            for i in threadpool_info()]


def numpy_nearest(queries: np.ndarray, bank: np.ndarray, norms: np.ndarray, block: int = 1024) -> np.ndarray:
    """Exact L2 distance of each query to its nearest bank row: |q|^2 - 2 q.b + |b|^2 in blocks of bank rows."""
    best = np.full(len(queries), np.inf, dtype=np.float32)
    for s in range(0, len(bank), block):
        d = norms[s:s + block][None, :] - 2.0 * (queries @ bank[s:s + block].T)
        np.minimum(best, d.min(axis=1), out=best)
    return np.sqrt(np.maximum(best + (queries * queries).sum(axis=1), 0.0))


def timed(fn: Any, repeats: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return round(float(np.median(times)), 2)


def measure(width: int, queries: int, banks: list[int], threads: list[int], sides: list[str], repeats: int
            ) -> dict[str, Any]:
    import faiss

    rng = np.random.default_rng(0)
    q = rng.standard_normal((queries, width)).astype(np.float32)
    out: dict[str, Any] = {}
    for n in banks:
        bank = rng.standard_normal((n, width)).astype(np.float32)
        norms = (bank * bank).sum(axis=1)
        index = faiss.IndexFlatL2(width)
        index.add(bank)
        ref = np.sqrt(np.maximum(index.search(q, 1)[0][:, 0], 0))
        row: dict[str, Any] = {"max_abs_diff": float(np.abs(numpy_nearest(q, bank, norms) - ref).max())}
        reps = max(2, repeats * 1000 // n)

        def by_numpy(bank: np.ndarray = bank, norms: np.ndarray = norms) -> np.ndarray:
            return numpy_nearest(q, bank, norms)

        for t in threads:
            if "faiss" in sides:
                faiss.omp_set_num_threads(t)
                row[f"faiss_t{t}_ms"] = timed(lambda index=index: index.search(q, 1), reps)
            if "numpy" in sides:
                try:
                    from threadpoolctl import threadpool_limits
                except ImportError:
                    if t == threads[0]:
                        row["numpy_default_threads_ms"] = timed(by_numpy, reps)
                    continue
                with threadpool_limits(t, user_api="blas"):
                    row[f"numpy_t{t}_ms"] = timed(by_numpy, reps)
        out[str(n)] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=2050, help="vector width (3b-shape pair: 2,050)")
    ap.add_argument("--queries", type=int, default=144, help="patches per frame")
    ap.add_argument("--banks", default="1000,10000")
    ap.add_argument("--threads", default="1,4,16")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--sides", default="faiss,numpy")
    ap.add_argument("--coretype", default="", help="also run faiss under OPENBLAS_CORETYPE=each of these")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    threads = [t for t in (int(x) for x in args.threads.split(",")) if t <= cores] or [1]
    banks = [int(x) for x in args.banks.split(",")]
    sides = args.sides.split(",")
    import faiss  # noqa: F401 - loaded first, so threadpoolctl lists its OpenBLAS too

    report: dict[str, Any] = {"cpu": cpu_name(), "cores": cores, "coretype_env": os.environ.get("OPENBLAS_CORETYPE"),
                              "width": args.width, "queries": args.queries, "blas": blas_info(),
                              "results": measure(args.width, args.queries, banks, threads, sides, args.repeats)}
    for core in filter(None, args.coretype.split(",")):
        child = subprocess.run([sys.executable, __file__, "--width", str(args.width), "--queries", str(args.queries),
                                "--banks", args.banks, "--threads", args.threads, "--repeats", str(args.repeats),
                                "--sides", "faiss"], env={**os.environ, "OPENBLAS_CORETYPE": core},
                               capture_output=True, text=True, timeout=600)
        report[f"coretype_{core}"] = json.loads(child.stdout) if child.returncode == 0 else child.stderr[-2000:]
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
