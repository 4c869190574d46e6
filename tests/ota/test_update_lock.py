"""The update lock: the daemon's shared lock while a station has a job in flight, the agent's exclusive
one before a swap, the quiet windows, and the bound on the wait."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from edge_runtime.config import Config
from edge_runtime.lineio.ota_lock import LineJobsLock
from edge_runtime.lineio.signals import LineOutcome, Signals
from edge_runtime.ota.update_lock import LINE_BUSY, UpdateLock, window_open


def signals(busy: bool = False, buffered: int = 0) -> Signals:
    return Signals(trigger_enable=True, ready=not busy, trigger_ack=False, busy=busy, acquisition_done=False,
                   result_valid=buffered > 0, inspection_seq=1, part_id="p", recipe="", result=LineOutcome.NONE,
                   defect_code=0, heartbeat=0, fault=False, buffer_count=buffered, overrun=False)


def test_the_swap_waits_while_a_station_has_a_job_in_flight(tmp_path: Path) -> None:
    path = tmp_path / "line.lock"
    daemon, agent = LineJobsLock(path), UpdateLock(path, [], max_wait_s=60)
    try:
        daemon.changed("press", signals(busy=True))  # triggered, no verdict yet
        assert agent.blocker() == LINE_BUSY
        daemon.changed("press", signals(buffered=1))  # decided, not yet acknowledged by the line
        daemon.changed("saw", signals())
        assert agent.blocker() == LINE_BUSY
        daemon.changed("press", signals())  # acknowledged: the line is idle
        assert agent.blocker() is None  # the agent holds the lock now
        daemon.changed("press", signals(busy=True))  # a job that starts while a swap starts
        assert not daemon.held and daemon.missed == 1
    finally:
        agent.release()
        daemon.close()


def test_a_killed_daemon_does_not_block_updates(tmp_path: Path) -> None:
    path = tmp_path / "line.lock"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_SH); print('held', flush=True); time.sleep(60)"), str(path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        agent = UpdateLock(path, [], max_wait_s=60)
        assert agent.blocker() == LINE_BUSY
        holder.kill()  # kill -9 mid-job: the kernel drops its lock
        holder.wait(10)
        assert agent.blocker() is None
        agent.release()
    finally:
        holder.kill()
        holder.wait(10)
        if holder.stdout is not None:
            holder.stdout.close()


@pytest.mark.parametrize("windows,hour,minute,open_", [
    ([], 12, 0, True), (["22:00-06:00"], 23, 30, True), (["22:00-06:00"], 5, 59, True),
    (["22:00-06:00"], 6, 0, False), (["22:00-06:00"], 12, 0, False), (["12:00-13:00", "00:00-01:00"], 0, 30, True),
    (["00:00-00:00"], 9, 0, True)])
def test_the_maintenance_window_may_cross_midnight(windows: list[str], hour: int, minute: int, open_: bool) -> None:
    assert window_open(windows, datetime(2026, 12, 3, hour, minute)) is open_


def test_a_closed_window_is_reported_once_and_the_wait_is_bounded(tmp_path: Path) -> None:
    reports: list[str] = []
    lock = UpdateLock(None, ["22:00-06:00"], max_wait_s=0.3, now=lambda: datetime(2026, 12, 3, 12, 0),
                      sleep=lambda s: time.sleep(min(s, 0.05)))
    verdict = lock.acquire(reports.append, lambda: None)
    assert not verdict.ok and verdict.phase == "failed" and "outside the maintenance window" in verdict.reason
    assert reports == ["waiting for the line: outside the maintenance window (22:00-06:00)"]
    lock.on_timeout = "proceed"
    assert lock.acquire(reports.append, lambda: None).ok


def test_a_cancel_ends_the_wait(tmp_path: Path) -> None:
    lock = UpdateLock(None, ["22:00-06:00"], max_wait_s=60, now=lambda: datetime(2026, 12, 3, 12, 0),
                      sleep=lambda s: None)
    verdict = lock.acquire(lambda _: None, lambda: "cancelled by the server")
    assert (verdict.ok, verdict.phase, verdict.reason) == (False, "canceled", "cancelled by the server")


def test_the_lock_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="not 'HH:MM-HH:MM'"):
        Config.model_validate({"ota": {"maintenance_window": ["25:00-26:00"]}})
    with pytest.raises(ValueError, match="one source at a time"):
        Config.model_validate({"ota": {"hawkbit": {"url": "https://h"}, "manifest_url": "https://m/x.json"}})
    with pytest.raises(ValueError, match="not both"):
        Config.model_validate({"ota": {"hawkbit": {"url": "https://h", "auth": {"target_token": "a",
                                                                                  "gateway_token": "b"}}}})
    with pytest.raises(ValueError, match="URL path segment"):
        Config.model_validate({"ota": {"hawkbit": {"url": "https://h", "tenant": "../admin"}}})
