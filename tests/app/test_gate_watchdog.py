"""A hung anomaly-gate look is seen by the pipeline's watchdog, as a hung encode or batch is."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edge_runtime.app import status as status_module
from edge_runtime.app.daemon import Daemon
from edge_runtime.config.gate import GateConfig
from edge_runtime.core.inspection_queue import InspectionRequest
from tests.app.test_gate_daemon import OK, bank, camera, config, parts, run_daemon  # noqa: F401 - fixtures
from tests.support.parts import clean_part
from tests.support.waiting import wait_for


def test_a_hung_gate_look_makes_the_pipeline_not_ready_naming_the_gate_until_it_returns(
        run_daemon: Callable[..., Daemon], tmp_path: Path, demo_dir: Path, bank: Path,  # noqa: F811
        parts: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    gate = GateConfig(mode="skip_ok", bank=str(bank), threshold=100.0, audit_every=1000, verdict=OK)
    daemon = run_daemon(config(tmp_path, demo_dir, camera(parts, gate, mode="on_demand")))
    wait_for(lambda: daemon.health()["ready"], what="the daemon ready", timeout=60)
    the_gate = daemon.gates.cameras["belt"].gate
    score, started, release = the_gate.score, threading.Event(), threading.Event()

    def hung(encoded: Any) -> Any:  # the search stuck (e.g. a BLAS thread pool deadlocked after a fork)
        started.set()
        release.wait(30)
        return score(encoded)

    monkeypatch.setattr(the_gate, "score", hung)
    monkeypatch.setattr(status_module, "STALL_S", 0.3)
    request = InspectionRequest(clean_part(40), "belt", seq=0, journal=True)
    try:
        daemon.inspections.submit(request)
        assert started.wait(30)
        wait_for(lambda: not daemon.alive(), what="the watchdog to see the hung gate")
        reasons = daemon.health()["reasons"]
        assert reasons[0].startswith("inspection stalled: the gate thread has been on one piece of work"), reasons
        assert daemon.status()["threads"]["gate"]["busy_s"] >= 0.3
    finally:
        release.set()
    assert request.future.result(60).source["engine"] == "gate"
    wait_for(daemon.alive, what="alive again")
