"""The anomaly gate in the running daemon (issue 42, phase 2): a real demo bundle (ONNX encoder,
llama.cpp), a bank fitted on synthetic good parts, a folder camera, the real journal."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from edge_runtime.api.metrics import StatusCollector
from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, TriggerConfig
from edge_runtime.config.gate import GateConfig
from edge_runtime.config.line_io import LineIOConfig
from edge_runtime.config.mqtt import MqttConfig
from edge_runtime.core.bundle.manifest import Bundle
from edge_runtime.core.errors import EdgeRuntimeError
from edge_runtime.core.inspection_queue import InspectionRequest
from edge_runtime.inference.anomaly import gate_context, patch_features, write_bank
from edge_runtime.inference.anomaly.fit import bank_header, fit_bank
from edge_runtime.inference.anomaly.loading import GateLoadError
from edge_runtime.inference.inspector import Inspector
from edge_runtime.lineio.signals import LineOutcome
from tests.delivery.test_mqtt import Subscriber
from tests.inference.test_anomaly_gate import _bundle_with_another_encoder
from tests.support.broker import Broker
from tests.support.browser import chromium
from tests.support.file_daemon import daemon_from_file
from tests.support.parts import clean_part
from tests.support.waiting import wait_for

OK = {"defect": False, "category": "none", "confidence": 1, "notes": "surface clean"}
# A request schema under which the language model can only call the part NOK (a recipe's own schema).
NOK_SCHEMA = {"type": "object", "properties": {"defect": {"const": True}, "category": {"enum": ["scratch"]}},
              "required": ["defect", "category"], "additionalProperties": False}


@pytest.fixture(scope="module")
def bank(inspector: Inspector, demo_bundle: Bundle, tmp_path_factory: pytest.TempPathFactory) -> Path:
    context = gate_context(demo_bundle, inspector.settings)
    feats = [patch_features(inspector.encode(clean_part(s)), context) for s in range(12)]
    fit = fit_bank(feats)
    path = tmp_path_factory.mktemp("gate") / "parts.bank"
    write_bank(path, bank_header(fit, context, feats[0]), fit.vectors)
    return path


@pytest.fixture(scope="module")
def ok_dir(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo bundle under a verdict schema whose `defect` can only be false, so the model's answers
    are OKs whatever its random weights prefer (NOK_SCHEMA's mirror): the audits compare like with like."""
    folder = Path(shutil.copytree(demo_dir, tmp_path_factory.mktemp("ok") / "demo", copy_function=os.link))
    manifest = folder / "bundle.yaml"
    data = yaml.safe_load(manifest.read_text())
    data["verdict_schema"]["properties"]["defect"] = {"const": False}
    manifest.unlink()  # a link to the demo's own: write a file of its own
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    return folder


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("parts")
    for s in range(6):
        cv2.imwrite(str(folder / f"part-{s:02d}.png"), clean_part(100 + s))
    return folder


def camera(parts: Path, gate: GateConfig | None, name: str = "belt", mode: str = "interval") -> CameraConfig:
    return CameraConfig(name=name, source=str(parts), kind="folder", fps=20, gate=gate,
                        trigger=TriggerConfig(mode=mode, interval_s=0.05))


def config(tmp_path: Path, demo_dir: Path, *cameras: CameraConfig) -> Config:
    cfg = Config(device_id="line-1", data_dir=tmp_path)
    cfg.model.path = demo_dir
    cfg.model.threads = 2
    cfg.api.enabled = False
    cfg.mqtt.enabled = False
    cfg.cameras = list(cameras)
    return cfg


@pytest.fixture
def run_daemon() -> Iterator[Callable[..., Daemon]]:
    """`start(cfg)`, or `start(cfg, path)` for a daemon running `cfg` that reloads from the file the test wrote
    at `path`; each is stopped when the test ends."""
    started: list[Daemon] = []
    with ExitStack() as from_files:
        def start(cfg: Config, path: Path | None = None) -> Daemon:
            if path is not None:
                return from_files.enter_context(daemon_from_file(path, running=cfg)).daemon
            daemon = Daemon(cfg)
            started.append(daemon)
            daemon.start()
            return daemon

        yield start
        for d in started:
            d.stop()


def rows(daemon: Daemon, camera: str = "belt") -> list[dict[str, Any]]:
    return daemon.journal.query(camera=camera, limit=500)


def quiesce(daemon: Daemon) -> None:
    """Cameras stopped and every frame the gate looked at journaled."""
    for rig in daemon.rigs.values():
        rig.stop()
    counts = daemon.gates.counts()
    wait_for(lambda: all(c.gated + c.passed + c.errors == len(rows(daemon, name)) for name, c in counts.items()),
             what="every scored frame journaled", timeout=30)


# Overlapped, stage 1 answers a gated frame right after its encode; without, stage 2 encodes and answers it.
@pytest.mark.parametrize("overlap", [True, False])
def test_skip_ok_answers_a_gated_frame_without_the_model_like_a_model_ok_and_audits_one_in_n(
        run_daemon: Callable[..., Daemon], tmp_path: Path, ok_dir: Path, bank: Path, parts: Path,
        overlap: bool) -> None:
    gate = GateConfig(mode="skip_ok", bank=str(bank), threshold=100.0, audit_every=3, verdict=OK)
    cfg = config(tmp_path, ok_dir, camera(parts, gate))
    cfg.inspection.overlap_stages = overlap
    # No passing image kept: evidence.keep_passes samples passes, so which record had one was luck
    cfg.evidence.keep_passes = 0
    daemon = run_daemon(cfg)
    wait_for(lambda: len(rows(daemon)) >= 9, what="9 results", timeout=60)
    quiesce(daemon)
    got = rows(daemon)
    counts = daemon.gates.counts()["belt"]
    gated = [r for r in got if r["source"]["engine"] == "gate"]
    audits = [r for r in got if r["source"]["engine"] == "edge"]
    assert len(gated) + len(audits) == len(got) == counts.gated
    assert counts.audits == len(audits) == counts.gated // 3 and counts.skipped == len(gated)
    assert all(r["gate"]["audit"] and r["gate"]["gated"] and "disagree" in r["gate"] for r in audits)
    g, m = gated[0], audits[0]
    assert g["verdict"] == OK and g["timings_ms"]["prefill"] == g["timings_ms"]["decode"] == 0
    assert g["source"]["score"] == g["gate"]["score"] < g["gate"]["threshold"] == 100.0
    assert g["gate"]["mode"] == "skip_ok" and not g["gate"]["audit"]
    # Field by field, the gated OK is the record a model OK is, but for who answered and what it cost.
    assert set(g) == set(m) and set(g["verdict"]) == set(m["verdict"])
    differ = {"id", "ts", "journal_seq", "frame", "timings_ms", "energy_j", "text", "verdict", "source", "gate"}
    assert {k: g[k] for k in set(g) - differ} == {k: m[k] for k in set(m) - differ}
    assert g["frame"]["width"] == m["frame"]["width"] == 224 and g["verdict"]["defect"] == m["verdict"]["defect"]
    # The counts reach /api/v1/status, the MQTT telemetry message and /metrics.
    status = daemon.status()["gate"]["belt"]
    assert (status["gated"], status["audits"], status["skipped"]) == (counts.gated, counts.audits, counts.skipped)
    assert status["histogram"]["count"] == counts.gated and status["histogram"]["buckets"][-1][1] == counts.gated
    assert daemon.telemetry()["gate"]["belt"]["audits"] == counts.audits
    json.dumps(daemon.status(), allow_nan=False)  # strict JSON for REST
    registry = CollectorRegistry()
    registry.register(StatusCollector(daemon.status))
    text = generate_latest(registry).decode()
    assert f'edge_gate_decisions_total{{camera="belt",decision="gated"}} {float(counts.gated)}' in text
    assert f'edge_gate_audits_total{{camera="belt"}} {float(counts.audits)}' in text
    assert f'edge_gate_score_ratio_count{{camera="belt"}} {float(counts.gated)}' in text


def test_annotate_scores_every_frame_and_the_model_answers_each(
        run_daemon: Callable[..., Daemon], tmp_path: Path, demo_dir: Path, bank: Path, parts: Path) -> None:
    gate = GateConfig(mode="annotate", bank=str(bank), threshold=100.0)
    daemon = run_daemon(config(tmp_path, demo_dir, camera(parts, gate), camera(parts, None, "plain")))
    wait_for(lambda: len(rows(daemon)) >= 3 and len(rows(daemon, "plain")) >= 1, what="results", timeout=60)
    quiesce(daemon)
    got = rows(daemon)
    assert all(r["source"]["engine"] == "edge" and r["gate"]["mode"] == "annotate" and r["gate"]["gated"]
               and not r["gate"]["audit"] for r in got)
    assert daemon.gates.counts()["belt"].skipped == 0
    assert all("gate" not in r for r in rows(daemon, "plain"))  # a camera without a gate: the JSON as before


def test_an_audit_the_model_calls_nok_is_counted_as_a_disagreement(
        run_daemon: Callable[..., Daemon], tmp_path: Path, demo_dir: Path, bank: Path) -> None:
    gate = GateConfig(mode="skip_ok", bank=str(bank), threshold=100.0, audit_every=1, verdict=OK)
    daemon = run_daemon(config(tmp_path, demo_dir, camera(tmp_path, gate, mode="on_demand")))
    result = daemon.inspections.submit(InspectionRequest(clean_part(7), "belt", schema=NOK_SCHEMA)).result(60)
    assert result.source["engine"] == "edge" and result.verdict["defect"] is True
    assert result.gate is not None and result.gate["audit"] and result.gate["disagree"]
    counts = daemon.gates.counts()["belt"]
    assert counts.disagreements == 1 and counts.last_disagreement == result.id
    assert daemon.status()["gate"]["belt"]["disagreements"] == 1


def test_a_trigger_asking_its_own_question_gets_the_models_verdict_not_the_gates_ok(
        run_daemon: Callable[..., Daemon], tmp_path: Path, ok_dir: Path, bank: Path, parts: Path) -> None:
    """The gate's OK says "like the good parts of its bank", not an answer to a client's question: a trigger
    (REST, MQTT) with a prompt of its own on a skip_ok camera whose frame the gate passes is asked of the
    model, scored and counted as an audit (as a recipe whose schema the OK does not fit). The camera's own
    question, sent or not, still gets the gate's OK."""
    gate = GateConfig(mode="skip_ok", bank=str(bank), threshold=100.0, audit_every=1000, verdict=OK)
    cam = camera(parts, gate, mode="on_demand").model_copy(update={"prompt": "Is the part clean?"})
    daemon = run_daemon(config(tmp_path, ok_dir, cam))
    wait_for(lambda: daemon.rigs["belt"].camera.slot.peek() is not None, what="a frame", timeout=30)
    trigger = daemon.device.cameras.trigger
    for prompt in (None, "Is the part clean?"):
        plain = trigger("belt", prompt).result(60)
        assert plain.source["engine"] == "gate" and plain.prompt == "Is the part clean?", plain.source
    own = trigger("belt", "Is the label upside down?").result(60)
    assert own.source["engine"] == "edge" and own.prompt == "Is the label upside down?", own.source
    assert own.gate is not None and own.gate["gated"] and own.gate["audit"] and own.gate["disagree"] is False
    counts = daemon.gates.counts()["belt"]
    assert (counts.gated, counts.skipped, counts.audits) == (3, 2, 1)


def test_a_bank_of_another_encoder_refuses_start_and_config_validate_in_one_line(
        tmp_path: Path, demo_dir: Path, bank: Path, parts: Path) -> None:
    other = _bundle_with_another_encoder(demo_dir, tmp_path)
    cfg = config(tmp_path, other, camera(parts, GateConfig(mode="annotate", bank=str(bank), threshold=1.0)))
    daemon = Daemon(cfg)
    try:
        with pytest.raises(GateLoadError, match=r"cameras\.belt\.gate: .*another encoder") as err:
            daemon.start()
        assert "\n" not in str(err.value)
    finally:
        daemon.stop()
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_defaults=True)))
    proc = subprocess.run([sys.executable, "-m", "edge_runtime", "config", "validate", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "another encoder" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_corrupt_or_oversized_bank_is_one_line_and_a_bad_reload_keeps_the_running_gate(
        run_daemon: Callable[..., Daemon], tmp_path: Path, demo_dir: Path, bank: Path, parts: Path) -> None:
    corrupt = tmp_path / "corrupt.bank"
    data = bytearray(bank.read_bytes())
    data[-5] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    for gate, why in ((GateConfig(mode="annotate", bank=str(corrupt), threshold=1.0), "sha256"),
                      (GateConfig(mode="annotate", bank=str(bank), threshold=1.0, max_bank_mb=0.001), "memory")):
        daemon = Daemon(config(tmp_path, demo_dir, camera(parts, gate)))
        try:
            with pytest.raises(GateLoadError, match=why) as err:
                daemon.start()
            assert "\n" not in str(err.value) and str(err.value).startswith("cameras.belt.gate: ")
        finally:
            daemon.stop()
    good = config(tmp_path, demo_dir, camera(parts, GateConfig(mode="annotate", bank=str(bank), threshold=1.0),
                                             mode="on_demand"))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(good.model_dump(mode="json", exclude_defaults=True)))
    daemon = run_daemon(good, path)
    running = daemon.gates.cameras["belt"]
    bad = good.model_copy(deep=True)
    assert bad.cameras[0].gate is not None
    bad.cameras[0].gate.bank = str(corrupt)
    path.write_text(yaml.safe_dump(bad.model_dump(mode="json", exclude_defaults=True)))
    with pytest.raises(EdgeRuntimeError, match=r"reload refused.*sha256"):
        daemon.reload()
    assert daemon.gates.cameras["belt"] is running and daemon.config.cameras[0].gate.bank == str(bank)  # type: ignore[union-attr]


def test_the_evidence_image_carries_the_heat_map_where_the_gate_scored_high(
        run_daemon: Callable[..., Daemon], tmp_path: Path, demo_dir: Path, bank: Path) -> None:
    # A threshold far under every score: every patch is over 1.5x it, so the whole frame is coloured.
    cfg = config(tmp_path, demo_dir, camera(tmp_path, GateConfig(mode="annotate", bank=str(bank), threshold=1e-4),
                                            mode="on_demand"),
                 camera(tmp_path, GateConfig(mode="annotate", bank=str(bank), threshold=1e-4, heat_map=False),
                        name="plain", mode="on_demand"))
    cfg.evidence.keep_passes = 1
    daemon = run_daemon(cfg)
    part = clean_part(500)  # not one of the bank's parts
    kept: dict[str, np.ndarray] = {}
    for name in ("belt", "plain"):
        result = daemon.inspections.submit(InspectionRequest(part, name)).result(60)
        assert result.evidence is not None and result.gate is not None and not result.gate["gated"]
        assert daemon.verdicts.evidence is not None
        found = daemon.verdicts.evidence.lookup(result.id)
        assert found is not None
        image = cv2.imread(str(found.path))
        assert image is not None
        kept[name] = image.astype(int)
    assert np.abs(kept["plain"] - part).mean() < 5  # heat_map: false keeps the frame as captured (JPEG aside)
    assert np.abs(kept["belt"] - part).mean() > 20


def test_a_gated_ok_is_published_and_handed_to_the_line_like_a_model_ok(
        run_daemon: Callable[..., Daemon], tmp_path: Path, ok_dir: Path, bank: Path, parts: Path) -> None:
    broker = Broker(tmp_path / "broker").start()
    sub = Subscriber(broker.port, "edge/line-1/#")
    try:
        gate = GateConfig(mode="skip_ok", bank=str(bank), threshold=100.0, audit_every=2, verdict=OK)
        cfg = config(tmp_path, ok_dir, camera(parts, gate, name="cam", mode="on_demand"))
        cfg.mqtt = MqttConfig.model_validate({**cfg.mqtt.model_dump(), "enabled": True, "host": "127.0.0.1",
                                              "port": broker.port, "telemetry_interval_s": 1})
        cfg.line_io = LineIOConfig.model_validate({"stations": [{
            "name": "st1", "camera": "cam", "result_deadline_ms": 60_000, "heartbeat_ms": 100,
            "nok_when": [{"field": "verdict.defect", "equals": True}]}]})
        daemon = run_daemon(cfg)
        assert daemon.line_io is not None
        station = daemon.line_io.stations[0]
        wait_for(lambda: station.signals().ready, timeout=30, what="the station ready")
        seqs = []
        for part in ("P-1", "P-2"):  # the 1st gated frame is answered by the gate, the 2nd is audited
            seqs.append(station.trigger(part, ""))
            wait_for(lambda: station.signals().result_valid, timeout=60, what="ResultValid")
            assert station.signals().result == LineOutcome.OK
            assert station.ack_result(seqs[-1])
        by_part = {r["part_id"]: r for r in rows(daemon, "cam")}
        g, m = by_part["P-1"], by_part["P-2"]
        assert (g["source"]["engine"], m["source"]["engine"]) == ("gate", "edge") and m["gate"]["audit"]
        for seq, r in zip(seqs, (g, m), strict=True):
            job = daemon.line_io.jobs.job("st1", seq)
            assert job is not None and (job["result_id"], job["result"]) == (r["id"], int(LineOutcome.OK))
        differ = {"id", "ts", "journal_seq", "frame", "timings_ms", "energy_j", "text", "verdict", "source", "gate",
                  "part_id", "inspection_seq", "evidence"}
        assert set(g) == set(m) and {k: g[k] for k in set(g) - differ} == {k: m[k] for k in set(m) - differ}
        assert g["station"] == m["station"] == "st1"
        topic = "edge/line-1/cam/result"
        wait_for(lambda: len(sub.on(topic)) >= 2, timeout=30, what="both results on MQTT")
        published = {json.loads(p)["id"]: json.loads(p) for p in sub.on(topic)}
        assert published[g["id"]]["source"] == g["source"] and published[g["id"]]["gate"] == g["gate"]
        assert set(published[g["id"]]) == set(published[m["id"]])

        def counted() -> bool:  # a telemetry message sent after both inspections
            gates = [json.loads(p).get("gate", {}).get("cam", {}) for p in sub.on("edge/line-1/telemetry")]
            return any(g.get("skipped") == 1 and g.get("audits") == 1 for g in gates)

        wait_for(counted, timeout=30, what="telemetry with the gate's counts")
    finally:
        sub.close()
        broker.stop()


def test_the_status_page_shows_each_gated_cameras_counters(
        run_daemon: Callable[..., Daemon], tmp_path: Path, demo_dir: Path, bank: Path) -> None:
    gate = GateConfig(mode="skip_ok", bank=str(bank), threshold=100.0, audit_every=1, verdict=OK)
    cfg = config(tmp_path, demo_dir, camera(tmp_path, gate, mode="on_demand"))
    cfg.api.enabled, cfg.api.port, cfg.api.host = True, 0, "127.0.0.1"
    daemon = run_daemon(cfg)
    daemon.inspections.submit(InspectionRequest(clean_part(7), "belt", schema=NOK_SCHEMA)).result(60)
    with chromium() as browser:
        page: Any = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"http://127.0.0.1:{daemon.api.port}/")  # type: ignore[union-attr]
        page.wait_for_selector("#gate-cameras tr", timeout=15000)
        cells = page.inner_text("#gate-cameras tr").split("\t")
        assert [c.strip() for c in cells[:2]] == ["belt", "skip_ok"] and cells[6].strip() == "1"  # one audit
        assert cells[7].strip().startswith("1") and page.query_selector("#gate-cameras a") is not None
        assert errors == []


def test_a_line_recipe_runs_its_own_gate_in_place_of_its_cameras(
        run_daemon: Callable[..., Daemon], tmp_path: Path, ok_dir: Path, bank: Path, parts: Path) -> None:
    own = {"mode": "skip_ok", "bank": str(bank), "threshold": 100.0, "audit_every": 1000, "verdict": OK}
    cfg = config(tmp_path, ok_dir, camera(parts, GateConfig(mode="annotate", bank=str(bank), threshold=100.0),
                                            name="cam", mode="on_demand"))
    cfg.line_io = LineIOConfig.model_validate({"stations": [{
        "name": "st1", "camera": "cam", "result_deadline_ms": 60_000, "heartbeat_ms": 100,
        "nok_when": [{"field": "verdict.defect", "equals": True}],
        "recipes": {"gated": {"gate": own}, "cameras": {}, "ungated": {"gate": {"mode": "off"}}}}]})
    daemon = run_daemon(cfg)
    assert daemon.line_io is not None
    station = daemon.line_io.stations[0]
    wait_for(lambda: station.signals().ready, timeout=30, what="the station ready")
    for recipe in ("gated", "cameras", "ungated"):
        seq = station.trigger(f"P-{recipe}", recipe)
        wait_for(lambda: station.signals().result_valid, timeout=60, what="ResultValid")
        assert station.signals().result == LineOutcome.OK and station.ack_result(seq)
    by = {r["recipe"]: r for r in rows(daemon, "cam")}
    assert by["gated"]["source"]["engine"] == "gate" and by["gated"]["gate"]["mode"] == "skip_ok"
    assert by["cameras"]["source"]["engine"] == "edge" and by["cameras"]["gate"]["mode"] == "annotate"
    assert by["ungated"]["source"]["engine"] == "edge" and "gate" not in by["ungated"]
    status = daemon.status()["gate"]
    assert status["st1/gated"]["skipped"] == 1 and status["cam"]["gated"] == 1 and "st1/ungated" not in status


def test_a_recipes_bank_that_does_not_fit_refuses_the_start_naming_the_recipe(
        tmp_path: Path, demo_dir: Path, bank: Path, parts: Path) -> None:
    cfg = config(tmp_path, demo_dir, camera(parts, None, name="cam", mode="on_demand"))
    cfg.line_io = LineIOConfig.model_validate({"stations": [{
        "name": "st1", "camera": "cam", "nok_when": [{"field": "verdict.defect", "equals": True}],
        "recipes": {"r1": {"gate": {"mode": "annotate", "bank": str(bank), "threshold": 1.0, "max_bank_mb": 0.001}}}}]})
    daemon = Daemon(cfg)
    try:
        with pytest.raises(GateLoadError, match=r"^line_io\.stations\.st1\.recipes\.r1\.gate: .*memory") as err:
            daemon.start()
        assert "\n" not in str(err.value)
    finally:
        daemon.stop()


def test_a_slow_delivery_of_a_gated_ok_does_not_hold_back_the_next_frames_encode(
        run_daemon: Callable[..., Daemon], tmp_path: Path, demo_dir: Path, bank: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate queues a gated OK for the delivery thread and scores the next frame meanwhile: the first
    OK's journal row is held back (a slow disk) until the second frame has been scored. On stop, the gated
    OKs still waiting for delivery are delivered, not dropped."""
    gate = GateConfig(mode="skip_ok", bank=str(bank), threshold=100.0, audit_every=1000, verdict=OK)
    daemon = run_daemon(config(tmp_path, demo_dir, camera(tmp_path, gate, mode="on_demand")))
    release = threading.Event()
    deliver = daemon.pipeline.deliver

    def slow(request: InspectionRequest, result: Any) -> Any:
        if request.seq == 0:
            assert release.wait(30), "the first OK's delivery was never released"
        if request.seq == 2:  # still waiting for delivery when the stop begins
            wait_for(daemon.worker._gated_stop.is_set, 30, "the worker's stop")
        return deliver(request, result)

    monkeypatch.setattr(daemon.worker, "deliver", slow)
    first = InspectionRequest(clean_part(8), "belt", seq=0, journal=True)
    second = InspectionRequest(clean_part(9), "belt", seq=1, journal=True)
    daemon.inspections.submit(first)
    daemon.inspections.submit(second)
    wait_for(lambda: daemon.gates.counts()["belt"].gated == 2, 30,
             "the second frame scored while the first OK's delivery is held")
    assert not first.future.done()
    release.set()
    assert first.future.result(30).source["engine"] == second.future.result(30).source["engine"] == "gate"
    wait_for(lambda: len(rows(daemon)) == 2, 10, "the first two OKs journaled")
    delivered = daemon.pipeline.delivered
    # The third OK's delivery is held until the stop begins; the fourth waits in the queue behind it.
    third = InspectionRequest(clean_part(10), "belt", seq=2, journal=True)
    fourth = InspectionRequest(clean_part(11), "belt", seq=3, journal=True)
    for request in (third, fourth):
        daemon.inspections.submit(request)
        assert request.encoded.wait(30)
    daemon.stop()
    assert third.future.result(0).source["engine"] == fourth.future.result(0).source["engine"] == "gate"
    assert daemon.pipeline.delivered == delivered + 2  # journaled (the journal is first), then the sinks


def test_the_gate_scores_a_frame_on_its_own_thread_while_stage_1_encodes_the_next(
        run_daemon: Callable[..., Daemon], tmp_path: Path, demo_dir: Path, bank: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The search (on the CPU) of frame N overlaps the encode of frame N+1 (on a GPU, where there is one):
    the first frame's score is held until the second frame has been encoded, and both are answered."""
    gate = GateConfig(mode="skip_ok", bank=str(bank), threshold=100.0, audit_every=1000, verdict=OK)
    daemon = run_daemon(config(tmp_path, demo_dir, camera(tmp_path, gate, mode="on_demand")))
    anomaly = daemon.gates.cameras["belt"].gate
    score = anomaly.score
    first = InspectionRequest(clean_part(8), "belt", seq=0, journal=True)
    second = InspectionRequest(clean_part(9), "belt", seq=1, journal=True)
    threads: list[str] = []

    def held(encoded: Any) -> Any:
        threads.append(threading.current_thread().name)
        if len(threads) == 1:
            assert second.encoded.wait(10), "the second frame was not encoded while the first was scored"
        return score(encoded)

    monkeypatch.setattr(anomaly, "score", held)
    daemon.inspections.submit(first)
    daemon.inspections.submit(second)
    assert second.encoded.wait(5), "stage 1 waited for the first frame's score before encoding the second"
    assert first.future.result(30).source["engine"] == second.future.result(30).source["engine"] == "gate"
    assert threads == ["gate", "gate"]
