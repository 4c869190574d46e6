"""The run: every sample through the real inspection path, appended to `OUT/runs.jsonl`, resumable.

Images are read through `core/images.py` (bytes and declared pixels checked before decoding), encoded
by the inspector and generated in batches of `inspection.max_batch` parallel sequences, as frames of
several cameras are. Each batch's records are written and fsynced before the next starts; a rerun
skips every (variant, image) already in the file, so a run killed at 80% continues at 80%. A record
is reused only while its image file is unchanged (size and mtime).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from edge_runtime.config.schema import ImageLimits
from edge_runtime.core.batch import BatchJob
from edge_runtime.core.errors import ImageError, InferenceError
from edge_runtime.core.images import read_image_file
from edge_runtime.core.result import Result
from edge_runtime.evaluation.dataset import Sample
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.feed import Generation

MAX_RECORD_BYTES = 256 * 1024
MAX_TEXT_CHARS = 4000


EVAL_CAMERA = "eval"  # the camera name eval's images are inspected as (under --program, its program's)


def variant_key(inspector: Inspector, prompt: str | None) -> str:
    """What decides a verdict: the bundle's files and schema, the prompt, the generation limit (and the
    inspection program, under --program)."""
    m = inspector.bundle.manifest
    ident = {"name": inspector.bundle.name, "files": m.files.model_dump(mode="json"), "schema": m.verdict_schema,
             "prompt": prompt or inspector.default_prompt, "max_tokens": inspector.max_tokens}
    program = inspector.program_of(EVAL_CAMERA)
    if program is not None and program.config is not None:  # absent without: older runs' records stay valid
        ident["program"] = program.config.model_dump(mode="json")
        # A reference replaced under the same path changes every verdict: its size and mtime count too.
        ident["references"] = [_image_stamp(r.image) for r in program.config.references]
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def _image_stamp(path: Path) -> list[int]:
    try:
        st = path.stat()
    except OSError:
        return [-1, -1]
    return [st.st_size, st.st_mtime_ns]


class RunLog:
    """`runs.jsonl`: one record per (variant key, sample id); appended and fsynced per batch."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: dict[tuple[str, str], dict[str, Any]] = {}
        self.unreadable = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            self._load()
        self._file: IO[str] = path.open("a", encoding="utf-8")

    def _load(self) -> None:
        with self.path.open("rb") as f:
            data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):  # a kill mid-write left half a line: cut it so the next append starts clean
            with self.path.open("r+b") as f:
                f.truncate(end)
        for line in data[:end].splitlines():
            if len(line) > MAX_RECORD_BYTES:
                self.unreadable += 1
                continue
            try:
                rec = json.loads(line)
                self.records[(str(rec["key"]), str(rec["id"]))] = rec
            except (ValueError, KeyError, TypeError):
                self.unreadable += 1

    def done(self, key: str, sample: Sample) -> bool:
        rec = self.records.get((key, sample.id))
        return rec is not None and rec.get("stamp") == _image_stamp(sample.image)

    def append(self, records: list[dict[str, Any]]) -> None:
        for rec in records:
            self.records[(rec["key"], rec["id"])] = rec
            self._file.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal, a line per 10% otherwise."""

    def __init__(self, label: str, total: int, enabled: bool = True, stream: IO[str] | None = None) -> None:
        self.label, self.total, self.enabled = label, total, enabled and total > 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.done = 0
        self.t0 = time.monotonic()
        self._last_decile = -1

    def update(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        elapsed = max(time.monotonic() - self.t0, 1e-6)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else 0
        frac = self.done / self.total
        if self.tty:
            bar = "#" * int(frac * 30)
            self.stream.write(f"\r{self.label} [{bar:<30}] {self.done}/{self.total} {rate:.1f} img/s "
                              f"ETA {int(eta) // 60}m{int(eta) % 60:02d}s ")
            if self.done >= self.total:
                self.stream.write("\n")
            self.stream.flush()
        elif int(frac * 10) > self._last_decile:
            self._last_decile = int(frac * 10)
            print(f"{self.label}: {self.done}/{self.total} ({frac:.0%}, {rate:.1f} img/s)", file=self.stream,
                  flush=True)


@dataclass
class RunStats:
    """What this invocation inspected (records found from an earlier run are not counted)."""

    inspected: int = 0
    reused: int = 0
    wall_s: float = 0.0

    @property
    def images_per_s(self) -> float | None:
        return self.inspected / self.wall_s if self.inspected and self.wall_s > 0 else None


def run_variant(inspector: Inspector, key: str, label: str, prompt: str | None, samples: list[Sample],
                log: RunLog, limits: ImageLimits, batch: int = 4, progress: bool = True) -> RunStats:
    """Inspect every sample not yet in `log` for this variant; returns this call's figures."""
    todo = [s for s in samples if not log.done(key, s)]
    stats = RunStats(reused=len(samples) - len(todo))
    bar = Progress(label, len(todo), progress)
    t0 = time.perf_counter()
    chunks = list(_chunks(todo, max(1, batch)))
    program = inspector.program_of(EVAL_CAMERA) is not None

    def prepare(chunk: list[Sample]) -> tuple[list[dict[str, Any]], list[tuple[Sample, BatchJob]]]:
        """Read and encode one batch (runs beside the previous batch's generation, as the daemon's
        worker overlaps encoding with generation)."""
        refused: list[dict[str, Any]] = []
        jobs: list[tuple[Sample, BatchJob]] = []
        for sample in chunk:
            try:
                frame = read_image_file(sample.image, limits.max_pixels, limits.min_side,
                                        int(limits.max_file_mb * 2**20))
            except ImageError as exc:
                refused.append({"key": key, "id": sample.id, "stamp": _image_stamp(sample.image),
                                "error": str(exc)[:500], "kind": "bad_image"})
                continue
            enc = inspector.encode_frame(EVAL_CAMERA, frame) if program else inspector.encode(frame)
            jobs.append((sample, BatchJob(enc, camera=EVAL_CAMERA, prompt=prompt, seq=len(jobs))))
        return refused, jobs

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="eval-encode") as pool:
        ahead = pool.submit(prepare, chunks[0]) if chunks else None
        for i, chunk in enumerate(chunks):
            assert ahead is not None
            records, jobs = ahead.result()
            ahead = pool.submit(prepare, chunks[i + 1]) if i + 1 < len(chunks) else None
            with _generations(inspector) as gens:
                outcomes = inspector.inspect_batch([job for _, job in jobs]) if jobs else []
            tokens = [g.tokens for g in gens] if len(gens) == len(outcomes) else [None] * len(outcomes)
            for (sample, _), out, n in zip(jobs, outcomes, tokens, strict=True):
                records.append(_record({"key": key, "id": sample.id, "stamp": _image_stamp(sample.image)}, out, n))
            log.append(records)
            stats.inspected += len(jobs)
            bar.update(len(chunk))
    stats.wall_s = time.perf_counter() - t0
    return stats


@contextmanager
def _generations(inspector: Inspector) -> Iterator[list[Generation]]:
    """The generations behind one `inspect_batch` call, for their token counts (a Result carries none).
    The inspector's own `generate_batch` runs unchanged; it is only observed, and restored after."""
    seen: list[Generation] = []
    original = inspector.generate_batch

    def observed(items: Any, grammar: str | None, max_tokens: int) -> list[Generation]:
        gens = original(items, grammar, max_tokens)
        seen.extend(gens)
        return gens

    inspector.generate_batch = observed  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        del inspector.generate_batch  # the class's method again


def _record(base: dict[str, Any], out: Result | InferenceError, tokens: int | None) -> dict[str, Any]:
    if isinstance(out, InferenceError):
        return {**base, "error": str(out)[:500], "kind": "inference_error", "tokens": tokens}
    record = {**base, "verdict": out.verdict, "text": out.text[:MAX_TEXT_CHARS], "tokens": tokens,
              "timings_ms": out.timings_ms}
    if out.regions is not None:  # each region's verdict and outcome (its text is in the journal, not here)
        record["regions"] = [{"name": r["name"], "verdict": r["verdict"], "outcome": r["outcome"]}
                             for r in out.regions]
    return record


def _chunks(items: list[Sample], n: int) -> Iterator[list[Sample]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]
