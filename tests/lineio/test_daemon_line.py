"""Line I/O inside the real daemon: the demo bundle (ONNX Runtime + llama.cpp), a video camera, the
journal; the station is triggered as a protocol adapter would, and a killed daemon comes back with
its FIFO (the OPC UA client there is asyncua: test_opcua.py covers the independent one)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, ProgramConfig, TriggerConfig, parse_config
from edge_runtime.config.line_io import LineIOConfig
from edge_runtime.core.errors import ConfigError
from edge_runtime.core.samples import write_sample_video
from edge_runtime.lineio.metrics import line_io_metrics
from edge_runtime.lineio.passwords import hash_password
from edge_runtime.lineio.signals import LineOutcome, Signals
from tests.support.mjpeg import free_port
from tests.support.opcua_peer import client_certificate, trust
from tests.support.waiting import wait_for

# Two recipes whose rules decide regardless of what the random-weight model says.
RECIPES = {"pass": {"nok_when": [{"field": "verdict.confidence", "lt": -1}]},
           "reject": {"nok_when": [{"field": "verdict.confidence", "gt": -1}], "prompt": "Reject it?"}}


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sample_video(tmp_path_factory.mktemp("video") / "parts.avi", frames=60)


@pytest.fixture
def daemon(tmp_path: Path, demo_dir: Path, video: Path) -> Iterator[Daemon]:
    cfg = Config(device_id="line-1", data_dir=tmp_path)
    cfg.model.path = demo_dir
    cfg.model.threads = 2
    cfg.api.enabled = False
    cfg.cameras = [CameraConfig(name="cam", source=str(video), fps=30, trigger=TriggerConfig(mode="on_demand"))]
    cfg.line_io = LineIOConfig.model_validate({"stations": [{
        "name": "st1", "camera": "cam", "result_deadline_ms": 60_000, "heartbeat_ms": 100,
        "nok_when": [{"field": "verdict.defect", "equals": True}], "recipes": RECIPES}]})
    d = Daemon(cfg)
    d.start()
    yield d
    d.stop()


@pytest.mark.parametrize("recipe,expected", [("pass", LineOutcome.OK), ("reject", LineOutcome.NOK)])
def test_a_line_trigger_is_captured_inspected_journaled_and_reported(daemon: Daemon, recipe: str,
                                                                     expected: LineOutcome) -> None:
    assert daemon.line_io is not None
    station = daemon.line_io.stations[0]
    wait_for(lambda: station.signals().ready, timeout=30, what="the station ready (model warm, camera up)")
    seen: list[tuple[float, Signals]] = []
    station.watch(lambda s: seen.append((time.monotonic(), s)))
    t0 = time.monotonic()
    seq = station.trigger("PART-9", recipe)
    wait_for(lambda: station.signals().result_valid, timeout=60, what="ResultValid")
    s = station.signals()
    assert (s.inspection_seq, s.part_id, s.recipe, s.result) == (seq, "PART-9", recipe, expected)
    acquired = next(t for t, x in seen if x.acquisition_done and x.inspection_seq == seq)
    valid = next(t for t, x in seen if x.result_valid)
    assert t0 <= acquired < valid  # the part may move long before the verdict
    rows = sqlite3.connect(daemon.config.journal_path()).execute(
        "SELECT station, part_id, recipe, body FROM results WHERE part_id = 'PART-9'").fetchall()
    assert len(rows) == 1 and rows[0][:3] == ("st1", "PART-9", recipe)
    job = daemon.line_io.jobs.job("st1", seq)
    assert job is not None and job["result_id"] is not None and job["result"] == int(expected)
    if recipe == "reject":
        assert '"prompt":"Reject it?"' in rows[0][3]
    assert station.ack_result(seq)
    status = daemon.status()["line_io"]["stations"][0]
    assert status["signals"]["result_valid"] is False and status["counters"]["acks"] == 1
    line_status = daemon.status()["line_io"]
    assert line_status["threads"]["line-jobs-writer"] == {"alive": True, "restarts": 0}
    assert daemon.status()["threads"]["line-jobs-writer"] == {"alive": True, "restarts": 0}  # with the others
    assert line_status["job_store"] == {"fault": None}
    samples = {(m.name, tuple(sorted(x.labels.items()))): x.value
               for m in line_io_metrics(daemon.status()["line_io"]) for x in m.samples}
    outcome = "ok" if expected == LineOutcome.OK else "nok"
    assert samples[("edge_line_triggers", (("station", "st1"),))] == 1
    assert samples[("edge_line_acks", (("station", "st1"),))] == 1
    assert samples[("edge_line_results", (("result", outcome), ("station", "st1")))] == 1


BOLT: dict[str, Any] = {"type": "object", "additionalProperties": False, "required": ["present", "torque_ok"],
        "properties": {"present": {"type": "boolean"}, "torque_ok": {"type": "boolean"}}}
SEAL: dict[str, Any] = {"type": "object", "additionalProperties": False, "required": ["label", "gap_mm"],
        "properties": {"label": {"enum": ["intact", "torn", "missing"]},
                       "gap_mm": {"type": "integer", "minimum": 0, "maximum": 9}}}


def test_each_recipe_selects_its_schema_and_its_rule_reads_that_verdict(tmp_path: Path, demo_dir: Path,
                                                                         video: Path) -> None:
    """Two recipes with different verdict schemas on one station: each verdict is generated under, and
    valid against, its recipe's schema (not the bundle's), is journaled with its recipe, and the station
    decides it by the recipe's rule on those fields."""
    seal_file = tmp_path / "seal.json"
    seal_file.write_text(json.dumps(SEAL))
    cfg = Config(device_id="line-1", data_dir=tmp_path)
    cfg.model.path = demo_dir
    cfg.model.threads = 2
    cfg.api.enabled = False
    cfg.cameras = [CameraConfig(name="cam", source=str(video), fps=30, trigger=TriggerConfig(mode="on_demand"))]
    cfg.line_io = LineIOConfig.model_validate({"stations": [{
        "name": "st1", "camera": "cam", "result_deadline_ms": 120_000, "heartbeat_ms": 100,
        "nok_when": [{"field": "verdict.defect", "equals": True}],
        "recipes": {"bolt": {"schema": BOLT, "nok_when": [{"field": "verdict.present", "equals": False}]},
                    "seal": {"schema": str(seal_file), "prompt": "Is the seal intact?",
                             "nok_when": [{"field": "verdict.label", "in": ["torn", "missing"]}]}}}]})
    daemon = Daemon(cfg)
    daemon.start()
    try:
        assert daemon.line_io is not None
        station = daemon.line_io.stations[0]
        wait_for(lambda: station.signals().ready, timeout=60, what="the station ready (model warm, camera up)")
        db = sqlite3.connect(daemon.config.journal_path())
        for recipe, schema, nok in (("bolt", BOLT, lambda v: v["present"] is False),
                                    ("seal", SEAL, lambda v: v["label"] in ("torn", "missing"))):
            seq = station.trigger(f"P-{recipe}", recipe)
            wait_for(lambda: station.signals().result_valid, timeout=120, what=f"ResultValid of {recipe}")
            rows = db.execute("SELECT recipe, body FROM results WHERE part_id = ?", (f"P-{recipe}",)).fetchall()
            assert len(rows) == 1 and rows[0][0] == recipe
            verdict = json.loads(rows[0][1])["verdict"]
            assert list(Draft202012Validator(schema).iter_errors(verdict)) == [], (recipe, verdict)
            assert set(verdict) == set(schema["properties"]), f"{recipe}: not the bundle's verdict: {verdict}"
            s = station.signals()
            assert (s.inspection_seq, s.recipe) == (seq, recipe)
            assert s.result == (LineOutcome.NOK if nok(verdict) else LineOutcome.OK), (recipe, verdict, s)
            assert station.ack_result(seq)
    finally:
        daemon.stop()


def test_a_station_on_an_unknown_camera_is_a_config_error(tmp_path: Path, demo_dir: Path) -> None:
    cfg = Config(device_id="line-1", data_dir=tmp_path)
    cfg.model.path = demo_dir
    cfg.api.enabled = False
    cfg.line_io = LineIOConfig.model_validate({"stations": [{
        "name": "st1", "camera": "nope", "nok_when": [{"field": "verdict.defect", "equals": True}]}]})
    with pytest.raises(ConfigError, match=r"line_io.stations.0.camera: no camera named 'nope'"):
        Daemon(cfg)


CONFIG = """\
device_id: kill-1
data_dir: {data}
model: {{path: {bundle}, threads: 2}}
api: {{enabled: false}}
cameras:
  - name: cam
    source: {video}
    trigger: {{mode: on_demand}}
line_io:
  stations:
    - name: st1
      camera: cam
      result_deadline_ms: 60000
      nok_when: [{{field: verdict.confidence, gt: -1}}]
  opcua:
    enabled: true
    port: {port}
    pki_dir: {pki}
    users: [{{name: plc, password_hash: "{hash}"}}]
"""


async def _opcua(endpoint: str, cert: Path, key: Path, actions: list[tuple[str, Any]]) -> list[Any]:
    from asyncua import Client, ua

    client = Client(endpoint, timeout=10)
    client.application_uri = "urn:test:kill-plc"
    await client.set_security_string(f"Basic256Sha256,SignAndEncrypt,{cert},{key}")
    client.set_user("plc")
    client.set_password("secret")
    out: list[Any] = []
    async with client:
        idx = await client.get_namespace_index("urn:edge-runtime:lineio")
        obj = await client.nodes.objects.get_child([f"{idx}:EdgeRuntime", f"{idx}:st1"])
        for op, arg in actions:
            if op == "start":
                out.append(await obj.call_method(f"{idx}:StartSingleJob", arg, ""))
            elif op == "ack":
                out.append(await obj.call_method(f"{idx}:ResultAck", ua.Variant(arg, ua.VariantType.UInt32)))
            elif op == "read":
                out.append({n: await (await obj.get_child(f"{idx}:{n}")).read_value() for n in arg})
            elif op == "wait_valid":
                node = await obj.get_child(f"{idx}:ResultValid")
                end = time.monotonic() + arg
                while not await node.read_value():
                    assert time.monotonic() < end, "no ResultValid"
                    await asyncio.sleep(0.05)
    return out


def test_kill_9_between_verdict_and_ack_keeps_the_result_and_does_not_repeat_the_part(
        tmp_path: Path, demo_dir: Path) -> None:
    port = free_port()
    cert, key = client_certificate(tmp_path / "plc", "urn:test:kill-plc")
    trust(tmp_path / "pki", cert)
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(data=tmp_path / "data", bundle=demo_dir, port=port, pki=tmp_path / "pki",
                                    video=write_sample_video(tmp_path / "v.avi", frames=30),
                                    hash=hash_password("secret")))
    endpoint = f"opc.tcp://127.0.0.1:{port}/edge-runtime/"

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "edge_runtime", "--config", str(config), "run"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ready() -> bool:
        try:
            return bool(asyncio.run(_opcua(endpoint, cert, key, [("read", ["Ready"])]))[0]["Ready"])
        except Exception:  # noqa: BLE001 - not up yet
            return False

    proc = start()
    try:
        wait_for(ready, timeout=90, what="the daemon's station Ready over OPC UA")
        (seq,) = asyncio.run(_opcua(endpoint, cert, key, [("start", "KILL-1"), ("wait_valid", 60)]))
        os.kill(proc.pid, signal.SIGKILL)  # the verdict is out, the PLC has not acknowledged it
        assert proc.wait(timeout=10) == -signal.SIGKILL
        proc = start()
        wait_for(ready, timeout=90, what="Ready after the restart")
        names = ["ResultValid", "InspectionSeq", "PartId", "Result", "BufferCount"]
        before, acked, after, nxt = asyncio.run(_opcua(endpoint, cert, key, [
            ("read", names), ("ack", seq), ("read", ["ResultValid", "BufferCount"]), ("start", "KILL-2")]))
        assert before == {"ResultValid": True, "InspectionSeq": seq, "PartId": "KILL-1", "Result": int(LineOutcome.NOK),
                          "BufferCount": 1}
        assert acked is True and after == {"ResultValid": False, "BufferCount": 0}
        assert nxt == seq + 1  # numbering continues: no job id is handed out twice
        db = sqlite3.connect(tmp_path / "data" / "journal.sqlite3")
        assert db.execute("SELECT COUNT(*) FROM results WHERE part_id = 'KILL-1'").fetchone()[0] == 1
        assert db.execute("SELECT COUNT(*) FROM line_jobs WHERE part_id = 'KILL-1'").fetchone()[0] == 1
        db.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_every_enabled_protocol_serves_the_stations(tmp_path: Path, demo_dir: Path) -> None:
    cfg = Config(device_id="line-2", data_dir=tmp_path)
    cfg.model.path = demo_dir
    cfg.api.enabled = False
    cfg.mqtt.enabled = False
    cfg.cameras = [CameraConfig(name="cam", source=str(tmp_path), trigger=TriggerConfig(mode="on_demand"))]
    cfg.line_io = LineIOConfig.model_validate({
        "stations": [{"name": "st1", "camera": "cam", "nok_when": [{"field": "verdict.defect", "equals": True}]}],
        "opcua": {"enabled": True, "port": free_port(), "anonymous": True},
        "modbus": {"enabled": True, "port": free_port()},
        "sparkplug": {"enabled": True},
        "gpio": {"enabled": True, "cells": [{"station": "st1", "trigger_line": 1, "ok_line": 2, "nok_line": 3}]}})
    d = Daemon(cfg)  # built, not started: no model load, no sockets
    assert d.line_io is not None
    assert [a.name for a in d.line_io.adapters] == ["opcua", "modbus", "sparkplug", "gpio"]
    assert d.line_io in d.services
    d.line_io.jobs.close()
    d.journal.close()


def test_triggers_refused_by_a_full_queue_keep_no_frames(daemon: Daemon) -> None:
    """A trigger whose inspection the full queue refuses is an error job on the line; the frame it
    had tagged for the verdict hook must go with it (20 refused triggers held 118 MB of 1080p frames)."""
    from edge_runtime.core.errors import QueueFull
    from edge_runtime.core.inspection_queue import InspectionRequest

    assert daemon.line_io is not None
    station = daemon.line_io.stations[0]
    wait_for(lambda: station.signals().ready, timeout=30, what="the station ready")
    daemon.worker.stop()  # nothing takes from the queue any more: fill it for real
    while True:
        try:
            daemon.inspections.submit(InspectionRequest(None, "cam", job=lambda _inspector: None))
        except QueueFull:
            break
    for i in range(5):
        seq = station.trigger(f"FULL-{i}", "pass")

        def refused(seq: int = seq) -> bool:
            return station.signals().result_valid and station.signals().inspection_seq == seq
        wait_for(refused, timeout=30, what="the refused job's ERROR result")
        assert station.signals().result == LineOutcome.ERROR
        assert station.signals().defect_code == 903  # the inspection failed; the camera gave its frame (not 901)
        assert station.ack_result(seq)


def test_a_recipe_naming_a_program_is_inspected_with_that_program(tmp_path: Path, demo_dir: Path,
                                                                  video: Path) -> None:
    """A recipe's program (its tiles) is what its PLC-triggered job is inspected with, through the real
    line path; a recipe naming none keeps the camera's (here: no program, so no regions)."""
    cfg = Config(device_id="line-1", data_dir=tmp_path)
    cfg.model.path = demo_dir
    cfg.model.threads = 2
    cfg.api.enabled = False
    cfg.programs = {"halves": ProgramConfig(tiling={"rows": 1, "cols": 2})}
    cfg.cameras = [CameraConfig(name="cam", source=str(video), fps=30, trigger=TriggerConfig(mode="on_demand"))]
    cfg.line_io = LineIOConfig.model_validate({"stations": [{
        "name": "st1", "camera": "cam", "result_deadline_ms": 120_000, "heartbeat_ms": 100,
        "nok_when": [{"field": "verdict.defect", "equals": True}],
        "recipes": {"tiled": {"program": "halves"}, "whole": {}}}]})
    daemon = Daemon(cfg)
    daemon.start()
    try:
        assert daemon.line_io is not None
        station = daemon.line_io.stations[0]
        wait_for(lambda: station.signals().ready, timeout=60, what="the station ready (model warm, camera up)")
        db = sqlite3.connect(daemon.config.journal_path())
        for recipe, regions in (("tiled", ["tile_r1_c1", "tile_r1_c2"]), ("whole", None)):
            seq = station.trigger(f"P-{recipe}", recipe)
            wait_for(lambda: station.signals().result_valid, timeout=120, what=f"ResultValid of {recipe}")
            rows = db.execute("SELECT recipe, body FROM results WHERE part_id = ?", (f"P-{recipe}",)).fetchall()
            assert len(rows) == 1 and rows[0][0] == recipe
            body = json.loads(rows[0][1])
            got = [r["name"] for r in body["regions"]] if body["regions"] is not None else None
            assert got == regions, (recipe, body)
            assert station.signals().inspection_seq == seq
            assert station.ack_result(seq)
    finally:
        daemon.stop()


@pytest.mark.parametrize("where,program,message", [
    ("recipe", "nope", r"line_io.stations.st1.recipes.r1.program: no program 'nope' under programs:"),
    ("station", "nope", r"line_io.stations.st1.program: no program 'nope' under programs:"),
    ("recipe", "clip4", r"line_io.stations.st1.recipes.r1.program: program 'clip4' asks about a clip of 4 frames"),
])
def test_a_recipe_or_station_naming_an_unusable_program_is_one_line(where: str, program: str, message: str) -> None:
    station = "    - name: st1\n      camera: cam\n      nok_when: [{field: verdict.defect, equals: true}]\n"
    if where == "station":
        station += f"      program: {program}\n"
    station += "      recipes:\n        r1: {" + (f"program: {program}" if where == "recipe" else "") + "}\n"
    text = ("programs:\n  clip4:\n    clip: {frames: 4, spacing_s: 0.5}\n"
            "cameras:\n  - {name: cam, source: x.png}\nline_io:\n  stations:\n" + station)
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    assert "\n" not in str(caught.value)
    assert re.search(message, str(caught.value)), str(caught.value)
