"""A station's FIFO after a restart, as its job store left it."""

from __future__ import annotations

from edge_runtime.config.line_io import StationConfig
from edge_runtime.lineio import recipes
from edge_runtime.lineio.signals import DEFECT_INTERRUPTED, JobStore, LineOutcome
from edge_runtime.lineio.station.job import Job


def restored_jobs(cfg: StationConfig, jobs: JobStore) -> list[Job]:
    """The FIFO as the job store left it: decided jobs wait for their ack; a job with no recorded
    outcome takes its journaled verdict if there is one, else it is ERROR (interrupted)."""
    restored: list[Job] = []
    for stored in jobs.open_jobs(cfg.name):
        job = Job(stored.seq, stored.part_id, stored.recipe, deadline=0.0, acquired=True)
        if stored.result is not None:
            job.result, job.defect_code = LineOutcome(stored.result), stored.defect_code
            job.result_id = stored.result_id
        else:
            found = jobs.journaled_result(cfg.name, stored.seq)
            outcome, code = (recipes.judge(cfg, found) if found is not None
                             else (LineOutcome.ERROR, DEFECT_INTERRUPTED))
            jobs.wait(jobs.decided(cfg.name, stored.seq, int(outcome), code, found.id if found else None))
            job.result, job.defect_code, job.result_id = outcome, code, found.id if found else None
        restored.append(job)
    return restored
