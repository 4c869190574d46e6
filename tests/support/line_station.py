"""A real `Station` on a real job store (SQLite) for the protocol tests; only the camera and the model
stand aside: each trigger's frame is taken at once and the verdict is the one the test gives."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from edge_runtime.config.line_io import StationConfig
from edge_runtime.core.result import FrameInfo, Result
from edge_runtime.lineio.recipes import tagged
from edge_runtime.lineio.signals import JobRequest
from edge_runtime.lineio.station import Station
from edge_runtime.verdicts.line_jobs import LineJobs


class Line:
    """One station with `verdict(seq, defect)` to finish a job, or `auto` to finish every job at once."""

    def __init__(self, tmp: Path, name: str = "st1", auto: Callable[[JobRequest], bool | None] | None = None,
                 regions: Callable[[JobRequest], list[dict[str, Any]] | None] | None = None, **cfg: Any) -> None:
        settings = {"name": name, "camera": "cam", "nok_when": [{"field": "verdict.defect", "equals": True}],
                    "heartbeat_ms": 1000, "result_deadline_ms": 5000, **cfg}
        self.cfg = StationConfig.model_validate(settings)
        self.jobs = LineJobs(tmp / f"{name}-jobs.sqlite3")
        self.auto = auto
        self.regions = regions  # an inspection program's per-region verdicts of a job's result
        self.pending: dict[int, tuple[JobRequest, Future[Result]]] = {}
        self._lock = threading.Lock()
        self.station = Station(self.cfg, self.jobs, self._start)

    def _start(self, job: JobRequest, on_acquired: Callable[[], None]) -> Future[Result]:
        future: Future[Result] = Future()
        on_acquired()
        with self._lock:
            self.pending[job.seq] = (job, future)
        if self.auto is not None:
            defect = self.auto(job)
            if defect is not None:
                self.verdict(job.seq, defect)
        return future

    def verdict(self, seq: int, defect: bool) -> None:
        """The model's verdict for job `seq` (defect true is NOK by this station's rule)."""
        with self._lock:
            job, future = self.pending.pop(seq)
        result = Result(device="test", camera=job.camera, frame=FrameInfo(seq, 64, 64),
                            verdict={"defect": defect, "category": "scratch" if defect else "none"},
                            text="", model="stand-in", timings_ms={"total": 1.0}, prompt="",
                            regions=self.regions(job) if self.regions is not None else None)
        future.set_result(tagged(result, job))

    def start(self) -> Line:
        self.station.start()
        return self

    def stop(self) -> None:
        self.station.stop()
        self.jobs.close()
