"""The DDI loop against a real goosebit (its own venv, made by `make test-ota`; skipped without it), no Docker:
the agent up to the swap, with the stand-in engine of test_ddi_runner. goosebit's action id is its software's, so
a release forced again (`force_update`) comes back under the id the device closed; the device must answer it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_runtime.config.ota import HawkbitConfig
from edge_runtime.ota.agent import VERSION_LABEL
from edge_runtime.ota.ddi.client import DdiClient
from edge_runtime.ota.ddi.runner import DdiSource
from edge_runtime.ota.manifest import Manifest, generate_keypair, sign
from tests.ota.goosebit import Goosebit, goosebit_python, state_of
from tests.ota.test_ddi_runner import IMAGE, Agent, Engine

DEVICE, TOKEN = "press-7", "press-7-token"


@pytest.fixture
def goosebit(tmp_path: Path) -> Iterator[Goosebit]:
    python = goosebit_python()
    if python is None:
        pytest.skip("goosebit's venv is missing: run `make test-ota` (it makes .venv-goosebit)")
    (tmp_path / "goosebit").mkdir()
    gb = Goosebit(python, tmp_path / "goosebit")
    try:
        gb.add_devices({DEVICE: TOKEN})
        yield gb
    finally:
        gb.close()


def upload(gb: Goosebit, path: Path, private: str, version: str) -> int:
    path.write_text(sign(Manifest(image=IMAGE, version=version), private).model_dump_json(exclude_none=True))
    done = subprocess.run([sys.executable, "-m", "edge_runtime", "ota", "hawkbit-upload", str(path), "--server",
                           "goosebit", "--url", gb.url, "--user", gb.user], capture_output=True, text=True,
                          env={**os.environ, "HAWKBIT_PASSWORD": gb.password}, timeout=60)
    assert done.returncode == 0, done.stderr
    return int(json.loads(done.stdout)["software"])


def test_a_release_goosebit_offers_again_under_the_closed_id_is_applied_and_answered(
        goosebit: Goosebit, tmp_path: Path) -> None:
    # On main: the forced release was never taken (ddi.json held its id as closed) and goosebit kept the device in
    # `error` with force_update set, for ever.
    private, public = generate_keypair()
    software = upload(goosebit, tmp_path / "m.json", private, "2.0.0")
    engine = Engine()

    def started() -> tuple[DdiSource, Agent]:
        agent = Agent(engine, "edge-runtime", tmp_path / "state.json", [public], lambda s: None)
        cfg = HawkbitConfig.model_validate({"url": goosebit.url, "tenant": "DEFAULT", "request_timeout_s": 10,
                                            "auth": {"target_token": TOKEN}})
        return DdiSource(DdiClient(cfg, DEVICE), agent, tmp_path / "ddi.json",
                         lambda: {"sw_version": str(agent.current_version())}, threading.Event()), agent

    def server() -> dict[str, Any]:
        device = goosebit.devices()[DEVICE]
        return {"state": state_of(device), "sw_version": device["sw_version"], "force_update": device["force_update"]}

    source, agent = started()
    source.step()  # registers (configData)
    goosebit.api("PATCH", "/devices", {"devices": [DEVICE], "software": str(software)})
    agent.outcome = "rolled_back"
    source.step()
    assert agent.swaps == 1 and server() == {"state": "error", "sw_version": "1.0.0", "force_update": False}
    source.step()  # a device in error is offered nothing
    assert agent.swaps == 1
    # The operator forces it again, and the agent restarts meanwhile: the same id, closed in ddi.json.
    goosebit.api("PATCH", "/devices", {"devices": [DEVICE], "force_update": True})
    source, agent = started()
    assert json.loads((tmp_path / "ddi.json").read_text())["action"]["id"] == str(software)
    agent.outcome = "committed"
    source.step()
    assert agent.swaps == 1 and len(engine.pulls) == 2  # installed again (this process's first swap)
    assert server() == {"state": "finished", "sw_version": "2.0.0", "force_update": False}
    # Forced once more while 2.0.0 runs: answered success at once, nothing pulled, and offered no more.
    engine._old.image.labels = {VERSION_LABEL: "2.0.0"}
    goosebit.api("PATCH", "/devices", {"devices": [DEVICE], "force_update": True})
    source.step()
    source.step()
    assert agent.swaps == 1 and len(engine.pulls) == 2
    assert server() == {"state": "finished", "sw_version": "2.0.0", "force_update": False}
    assert json.loads((tmp_path / "ddi.json").read_text())["action"]["final"] == {
        "finished": "success", "details": ["already running 2.0.0"]}
