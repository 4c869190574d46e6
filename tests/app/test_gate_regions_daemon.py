"""The anomaly gate on a program's regions in the running daemon (issue 42): the demo bundle (ONNX
encoder, llama.cpp), a bank fitted by `gate fit --camera` on the camera's two-region program, the real
journal and evidence store. In skip_ok a good part is answered by the gate with every region's OK; a
part with a defect in one region is asked about that region only; the evidence shows each region's
heat map."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from edge_runtime.api.metrics import StatusCollector
from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, ProgramConfig, TriggerConfig
from edge_runtime.config.gate import GateConfig
from edge_runtime.core.inspection_queue import InspectionRequest
from edge_runtime.evaluation.gate_fit import FitOptions, fit_gate
from tests.inference.test_gate_regions import HALVES, OK, stained
from tests.support.parts import clean_part


def belt(gate: GateConfig | None = None) -> CameraConfig:
    return CameraConfig(name="belt", source="/tmp", kind="folder", program="halves", gate=gate,
                        trigger=TriggerConfig(mode="on_demand"))


@pytest.fixture(scope="module")
def bank(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("gate-regions-daemon")
    for s in range(40):
        cv2.imwrite(str(tmp / f"part-{s:02d}.png"), clean_part(s))
    cfg = Config(device_id="t", programs={"halves": ProgramConfig.model_validate(HALVES)}, cameras=[belt()])
    cfg.model.threads = 2
    out = tmp / "halves.bank"
    fit_gate(cfg, FitOptions(images=tmp, out=out, model=str(demo_dir), camera="belt", progress=False))
    return out


@pytest.fixture
def daemon(bank: Path, demo_dir: Path, tmp_path: Path) -> Iterator[Daemon]:
    cfg = Config(device_id="line-1", data_dir=tmp_path, programs={"halves": ProgramConfig.model_validate(HALVES)})
    cfg.model.path = demo_dir
    cfg.model.threads = 2
    cfg.api.enabled = cfg.mqtt.enabled = False
    cfg.evidence.keep_passes = 1
    cfg.evidence.draw_regions = False  # only the gate's heat maps change the kept image
    cfg.cameras = [belt(GateConfig(mode="skip_ok", bank=str(bank), verdict=OK, audit_every=1000))]
    d = Daemon(cfg)
    d.start()
    yield d
    d.stop()


def kept(daemon: Daemon, result_id: str) -> np.ndarray:
    assert daemon.verdicts.evidence is not None
    found = daemon.verdicts.evidence.lookup(result_id)
    assert found is not None
    image = cv2.imread(str(found.path))
    assert image is not None
    return image.astype(int)


def test_skip_ok_on_regions_journals_the_gates_ok_and_asks_only_the_region_over_its_threshold(
        daemon: Daemon) -> None:
    good = daemon.inspections.submit(InspectionRequest(clean_part(800), "belt")).result(60)
    assert good.source["engine"] == "gate" and good.verdict == OK
    assert [(r["name"], r["outcome"], r.get("engine")) for r in good.regions or []] == [
        ("left", "ok", "gate"), ("right", "ok", "gate")]
    frame = stained(801, "left")
    asked = daemon.inspections.submit(InspectionRequest(frame, "belt")).result(60)
    assert asked.source["engine"] != "gate" and asked.timings_ms["decode"] > 0  # the language model answered
    left, right = asked.regions or [{}, {}]
    assert "engine" not in left and right.get("engine") == "gate" and right["verdict"] == OK
    assert asked.gate is not None and [r["answered"] for r in asked.gate["regions"]] == [False, True]
    rows = {r["id"]: r for r in daemon.journal.query(camera="belt", limit=10)}
    assert rows[good.id]["source"]["engine"] == "gate" and rows[asked.id]["regions"][1]["engine"] == "gate"
    hot = np.abs(kept(daemon, asked.id) - frame.astype(int)).sum(axis=2) > 90  # over the JPEG's own changes
    assert hot[:, :112].sum() > 100 and hot[:, 112:].sum() < hot[:, :112].sum() / 10  # the stained half's heat map
    counts = daemon.gates.counts()["belt"]
    assert (counts.skipped, counts.passed, counts.regions_answered) == (1, 1, 1)
    status = daemon.status()["gate"]["belt"]
    assert status["regions_answered"] == 1 and [r["name"] for r in status["regions"]] == ["left", "right"]
    registry = CollectorRegistry()
    registry.register(StatusCollector(daemon.status))
    assert 'edge_gate_regions_answered_total{camera="belt"} 1.0' in generate_latest(registry).decode()
