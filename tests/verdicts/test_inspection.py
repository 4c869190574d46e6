"""Evidence, rules, alerts, webhooks, queries, exports and review on a running daemon (real engines,
real Mosquitto, a real webhook receiver, the REST API over HTTP)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import load_config
from edge_runtime.core.result import FrameInfo, Result
from edge_runtime.core.samples import write_sample_video
from edge_runtime.verdicts.evidence import FAULT
from tests.support.broker import Broker
from tests.support.daemon_http import trigger
from tests.support.file_daemon import daemon_from_file
from tests.support.receiver import Receiver, Subscriber
from tests.support.tmpfs import fill_disk, tmpfs
from tests.support.waiting import wait_for

TOKEN = "line-token"
PREFIX = "edge/line-1"
# The demo's random weights answer defect: true to this on every frame of the sample video.
DEFECT_PROMPT = "Inspect the aluminium part."
CONFIG = """\
device_id: line-1
data_dir: {data}
model: {{path: {bundle}, threads: 2}}
mqtt: {{host: 127.0.0.1, port: {port}}}
api: {{host: 127.0.0.1, port: 0, token: {token}}}
evidence: {{keep_passes: 1, min_free_mb: 0}}
cameras:
  - name: station-a
    source: {video}
    fps: 10
    trigger: {{mode: on_demand}}
    prompt: {defect_prompt}
rules:
  - name: defect
    when:
      - field: verdict.defect
        equals: true
    actions:
      - type: alert
      - type: webhook
        url: {hook}
        headers: {{Authorization: Bearer hook-secret}}
      - type: review
{extra}"""
REASK = """\
  - name: second-look
    when:
      - field: verdict.category
        in: [none, dent, scratch, other]
    actions:
      - type: reask
        prompt: Is a part missing?
"""


@dataclass
class Line:
    daemon: Daemon
    broker: Broker
    receiver: Receiver
    subscriber: Subscriber
    config_file: Path
    data: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.daemon.api.port}"  # type: ignore[union-attr]


def write_config(path: Path, extra: str = "", **values: Any) -> None:
    path.write_text(CONFIG.format(extra=extra, token=TOKEN, defect_prompt=DEFECT_PROMPT, **values))


@pytest.fixture(scope="module")
def line(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Line]:
    tmp = tmp_path_factory.mktemp("line")
    broker = Broker(tmp / "broker").start()
    receiver = Receiver().start()
    subscriber = Subscriber(broker.port, f"{PREFIX}/#")
    values = {"data": tmp / "data", "bundle": demo_dir, "port": broker.port, "hook": receiver.url,
              "video": write_sample_video(tmp / "v.avi", frames=60)}
    config_file = tmp / "config.yaml"
    write_config(config_file, REASK, **values)
    try:
        with daemon_from_file(config_file) as started:
            daemon = started.daemon
            wait_for(lambda: daemon.rigs["station-a"].camera.slot.peek() is not None, 10, "a frame")
            wait_for(lambda: daemon.mqtt and daemon.mqtt.connected, 10, "the broker")
            yield Line(daemon, broker, receiver, subscriber, config_file, tmp / "data")
    finally:
        subscriber.close()
        receiver.stop()
        broker.stop()


def http(line: Line, path: str, body: Any = None, token: str | None = TOKEN,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(line.url + path, method="POST" if body is not None else "GET",
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def inspect(line: Line) -> Result:
    return line.daemon.entry.trigger("station-a").result(timeout=60)


def test_a_result_links_its_evidence_on_rest_and_mqtt_never_the_bytes(line: Line) -> None:
    result = inspect(line)
    status, _, body = http(line, f"/api/v1/results/{result.id}")
    evidence = json.loads(body)["evidence"]
    assert status == 200 and set(evidence) == {"uri", "sha256", "bytes", "width", "height"}
    assert evidence["uri"] == f"/api/v1/results/{result.id}/image.jpg"
    published = wait_for(lambda: [m for m in line.subscriber.on("/station-a/result") if m["id"] == result.id],
                         10, "the MQTT result")[0]
    assert published["evidence"] == evidence
    raw = json.dumps(published)
    assert len(raw) < 4096 and "base64" not in raw  # a link, not the picture


def test_the_evidence_image_and_thumbnail_are_served_by_hash(line: Line) -> None:
    result = inspect(line)
    status, headers, jpeg = http(line, f"/api/v1/results/{result.id}/image.jpg", token=None)
    assert status == 200 and headers["Content-Type"] == "image/jpeg" and jpeg[:2] == b"\xff\xd8"
    assert hashlib.sha256(jpeg).hexdigest() == result.evidence["sha256"]  # type: ignore[index]
    assert len(jpeg) == result.evidence["bytes"]  # type: ignore[index]
    status, _, thumb = http(line, f"/api/v1/results/{result.id}/thumbnail.jpg", token=None)
    assert status == 200 and thumb[:2] == b"\xff\xd8" and len(thumb) < len(jpeg)
    status, _, _ = http(line, f"/api/v1/results/{result.id}/image.jpg", token=None,
                        headers={"If-None-Match": f'"{result.evidence["sha256"]}"'})  # type: ignore[index]
    assert status == 304
    status, _, body = http(line, "/api/v1/results/nope/image.jpg")
    assert status == 404 and b"no result with that id" in body


def _replayed(line: Line, after: int, result_id: str) -> dict[str, Any]:
    """The event of `result_id` as /api/v1/events replays it to a client resuming after event `after`."""
    req = urllib.request.Request(f"{line.url}/api/v1/events?last_event_id={after}")
    with urllib.request.urlopen(req, timeout=30) as resp:
        for raw in resp:
            if raw.startswith(b"data: ") and result_id.encode() in raw:
                event: dict[str, Any] = json.loads(raw[6:])
                return event
    raise AssertionError("the event was not replayed")


def test_an_image_removed_by_hand_is_a_410_and_every_read_of_its_result_says_removed(line: Line) -> None:
    """Removed from the folder (a technician's rm): the image route said 404 while the result went on
    handing out its link (REST, inspections, exports, a replayed event)."""
    assert line.daemon.api is not None
    before = line.daemon.api.events.last_id
    result = inspect(line)
    store = line.daemon.verdicts.evidence
    assert store is not None and result.evidence is not None
    found = store.lookup(result.id)
    assert found is not None
    found.path.unlink()

    status, headers, body = http(line, f"/api/v1/results/{result.id}/thumbnail.jpg", token=None)
    assert status == 410 and headers["Content-Type"] == "application/json", (status, body)
    error = json.loads(body)["error"]
    assert error["type"] == "evidence_removed" and result.evidence["sha256"] in error["message"]
    assert "removed from the evidence folder" in error["message"] and result.id in error["message"]
    status, _, body = http(line, f"/api/v1/results/{result.id}/image.jpg", token=None)
    assert status == 410 and json.loads(body)["error"]["type"] == "evidence_removed"

    status, _, body = http(line, f"/api/v1/results/{result.id}")
    evidence = json.loads(body)["evidence"]
    assert evidence["uri"] is None and evidence["removed"]["why"] == "missing"
    assert evidence["sha256"] == result.evidence["sha256"]
    # Each says the same but for `at`: a read whose mark cannot be written within MARK_TIMEOUT_S (the journal
    # busy) answers its own `at`, and a list or export of a row not marked yet says now.
    status, _, body = http(line, "/api/v1/inspections?limit=1000", token=None)
    listed = [r for r in json.loads(body)["results"] if r["id"] == result.id]
    assert _but_at(listed[0]["evidence"]) == _but_at(evidence)
    status, _, body = http(line, "/api/v1/inspections/export.jsonl", token=None)
    exported = [json.loads(x) for x in body.splitlines() if result.id.encode() in x]
    assert _but_at(exported[0]["evidence"]) == _but_at(evidence)
    status, _, body = http(line, "/api/v1/inspections/export.csv", token=None)
    row = next(r for r in csv.DictReader(io.StringIO(body.decode())) if r["id"] == result.id)
    assert row["evidence_uri"] == ""
    assert _but_at(_replayed(line, before, result.id)["evidence"]) == _but_at(evidence)


def _but_at(evidence: dict[str, Any]) -> dict[str, Any]:
    """`evidence` without its removal's `at`, which must be an RFC 3339 UTC time with milliseconds (`utc_now`)."""
    at = evidence["removed"]["at"]
    assert isinstance(at, str) and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", at), at
    datetime.fromisoformat(at.replace("Z", "+00:00"))  # a real time, not just its shape
    return {**evidence, "removed": {k: v for k, v in evidence["removed"].items() if k != "at"}}


def test_an_image_deleted_by_retention_says_so_on_the_image_route_and_in_its_result(line: Line) -> None:
    result = inspect(line)
    store = line.daemon.verdicts.evidence
    assert store is not None
    found = store.lookup(result.id)
    assert found is not None
    with store._lock:  # as apply_retention deletes a victim
        store._delete([(found.sha256, 1)])
    status, _, body = http(line, f"/api/v1/results/{result.id}/image.jpg", token=None)
    assert status == 410
    assert "deleted by retention" in json.loads(body)["error"]["message"]
    status, _, body = http(line, f"/api/v1/results/{result.id}")
    assert json.loads(body)["evidence"]["removed"]["why"] == "retention"


def test_a_firing_rule_is_recorded_alerted_posted_and_counted(line: Line) -> None:
    result = inspect(line)  # defect: true (the camera's prompt, see CONFIG)
    assert result.verdict["defect"] is True
    names = [r["name"] for r in result.rules or []]
    assert names == ["defect", "second-look"]
    assert result.rules[0]["actions"] == ["alert", "webhook", "review"]  # type: ignore[index]
    alert = wait_for(lambda: [a for a in line.subscriber.on("/station-a/alert") if a["result_id"] == result.id],
                     10, "the MQTT alert")[0]
    assert alert["rule"] == "defect" and alert["evidence"] == result.evidence
    assert next(q for t, _, q in line.subscriber.raw() if t.endswith("/alert")) == 1  # QoS 1
    wait_for(lambda: f"{result.id}:defect:1" in line.receiver.keys(), 10, "the webhook")
    assert line.receiver.headers[f"{result.id}:defect:1"]["Authorization"] == "Bearer hook-secret"
    # The file and its WAL, read by another process: closing a file of our own on the journal would drop every
    # POSIX lock this process (the daemon's connections) holds on it, and the dataset export's process, closing
    # its connection later, would then delete the WAL and -shm from under the running daemon (SQLITE_IOERR for
    # any connection opened after that).
    stored = subprocess.run(["cat", *map(str, line.data.glob("journal.sqlite3*"))], capture_output=True,
                            check=True).stdout
    assert b"hook-secret" not in stored  # not stored with the outbox
    assert result.review and result.review["state"] == "pending"
    _, _, metrics = http(line, "/metrics", token=None)
    fired = [ln for ln in metrics.decode().splitlines() if ln.startswith('edge_rule_firings_total{rule="defect"}')]
    assert fired and float(fired[0].split()[-1]) >= 1


def test_reask_attaches_a_second_answer_about_the_same_frame(line: Line) -> None:
    result = inspect(line)
    reask = result.rules[1]["reask"]  # type: ignore[index]
    assert reask["prompt"] == "Is a part missing?"
    assert set(reask["verdict"]) == {"defect", "category", "confidence", "notes"} and reask["ms"] > 0
    assert json.loads(http(line, f"/api/v1/results/{result.id}")[2])["rules"][1]["reask"] == reask


def other_result(camera: str, defect: bool, category: str, confidence: float) -> Result:
    return Result(device="line-1", camera=camera, frame=FrameInfo(0, 8, 8), text="", model="m",
                  verdict={"defect": defect, "category": category, "confidence": confidence, "notes": ""},
                  timings_ms={"total": 1.0}, prompt="p")


def test_results_filter_and_page_by_cursor(line: Line) -> None:
    for i in range(5):
        line.daemon.journal.add(other_result("station-b", i % 2 == 0, "dent" if i % 2 == 0 else "none", 0.9))
    inspect(line)
    status, _, body = http(line, "/api/v1/inspections?camera=station-b&defect=true")
    rows = json.loads(body)["results"]
    assert status == 200 and len(rows) == 3 and all(r["verdict"]["category"] == "dent" for r in rows)
    assert len(json.loads(http(line, "/api/v1/inspections?camera=station-b&defect=false")[2])["results"]) == 2
    assert len(json.loads(http(line, "/api/v1/inspections?camera=station-b&category=dent")[2])["results"]) == 3
    pending = json.loads(http(line, "/api/v1/inspections?review=pending")[2])["results"]
    assert pending and all(r["review"]["state"] == "pending" and r["camera"] == "station-a" for r in pending)
    seen: list[str] = []
    path = "/api/v1/inspections?limit=2"
    while True:
        page = json.loads(http(line, path)[2])
        seen += [r["id"] for r in page["results"]]
        if page["next_before"] is None:
            break
        path = f"/api/v1/inspections?limit=2&before={page['next_before']}"
    assert len(seen) == len(set(seen)) == line.daemon.journal.counts()["total"]
    first = json.loads(http(line, "/api/v1/inspections?limit=1")[2])["results"][0]
    newer = json.loads(http(line, f"/api/v1/inspections?after={first['journal_seq']}")[2])["results"]
    assert newer == []


@pytest.mark.parametrize(("query", "field"), [
    ("defect=maybe", "defect"), ("before=99999999999999999999", "before"), ("limit=0", "limit"),
    ("before=%C2%B2", "before"),
    ("since=yesterday", "since"), ("review=lost", "review"), ("below=nan", "below"), ("after=-1", "after"),
])
def test_a_bad_filter_is_a_400_naming_the_field(line: Line, query: str, field: str) -> None:
    status, _, body = http(line, f"/api/v1/inspections?{query}")
    assert status == 400 and json.loads(body)["error"]["message"].startswith(f"{field}:")


def test_exports_stream_csv_and_jsonl_with_the_same_filters(line: Line) -> None:
    line.daemon.journal.add(other_result("station-c", True, "=HYPERLINK(\"x\")", 0.5))
    status, headers, body = http(line, "/api/v1/inspections/export.csv?camera=station-c", token=None)
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    assert status == 200 and headers["Content-Type"].startswith("text/csv") and len(rows) == 1
    assert rows[0]["category"].startswith("'=")  # no formula injection into a spreadsheet
    status, _, body = http(line, "/api/v1/inspections/export.jsonl?defect=true", token=None)
    lines = [json.loads(x) for x in body.decode().splitlines()]
    assert status == 200 and lines and all(x["verdict"]["defect"] is True for x in lines)
    assert len(lines) == len(json.loads(http(line, "/api/v1/inspections?defect=true&limit=1000")[2])["results"])


def test_review_writes_need_the_token_and_a_verdict_valid_against_the_schema(line: Line) -> None:
    result = inspect(line)
    path = f"/api/v1/results/{result.id}/review"
    assert http(line, path, {"action": "confirm"}, token=None)[0] == 401
    assert http(line, path, {"action": "confirm"}, token="wrong")[0] == 401
    status, _, body = http(line, path, {"action": "correct", "verdict": {**result.verdict, "category": "rust"}})
    assert status == 400 and json.loads(body)["error"]["message"].startswith("verdict.category:")
    status, _, body = http(line, path, {"action": "correct"})
    assert status == 400 and json.loads(body)["error"]["message"].startswith("verdict:")
    status, _, body = http(line, path, {"action": "approve"})
    assert status == 400 and json.loads(body)["error"]["message"].startswith("action:")
    assert http(line, "/api/v1/results/nope/review", {"action": "confirm"})[0] == 404
    schema = json.loads(http(line, "/api/v1/review/schema", token=None)[2])
    assert schema["token_required"] is True and "category" in schema["schema"]["properties"]


def test_a_correction_is_stored_with_the_result_and_published(line: Line) -> None:
    result = inspect(line)
    fixed = {"defect": False, "category": "none", "confidence": 1.0, "notes": "surface clean"}
    status, _, body = http(line, f"/api/v1/results/{result.id}/review",
                           {"action": "correct", "verdict": fixed, "note": "checked by hand"})
    assert status == 200 and json.loads(body)["review"]["state"] == "corrected"
    stored = json.loads(http(line, f"/api/v1/results/{result.id}")[2])["review"]
    assert stored["correction"] == fixed and stored["note"] == "checked by hand"
    message = wait_for(lambda: [m for m in line.subscriber.on("/station-a/review") if m["id"] == result.id],
                       10, "the review on MQTT")[0]
    assert message["review"]["correction"] == fixed and message["verdict"] == result.verdict
    assert line.daemon.verdicts.reviews.history(result.id)[-1]["state"] == "corrected"


def test_rules_reload_from_the_config_file(line: Line) -> None:
    values = {"data": line.data, "bundle": line.daemon.config.model.path, "port": line.broker.port,
              "hook": line.receiver.url, "video": line.daemon.config.cameras[0].source}
    write_config(line.config_file, "", **values)  # the second-look rule is gone
    line.daemon.reload()
    try:
        assert [r["name"] for r in inspect(line).rules or []] == ["defect"]
    finally:
        write_config(line.config_file, REASK, **values)
        line.daemon.reload()
    assert [r["name"] for r in inspect(line).rules or []] == ["defect", "second-look"]


def test_dataset_export_writes_images_with_verdict_and_correction(line: Line, tmp_path: Path) -> None:
    result = inspect(line)
    fixed = {"defect": True, "category": "scratch", "confidence": 1.0, "notes": "scratch on the face"}
    http(line, f"/api/v1/results/{result.id}/review", {"action": "correct", "verdict": fixed})
    out = tmp_path / "dataset"
    run = subprocess.run([sys.executable, "-m", "edge_runtime", "--config", str(line.config_file), "dataset",
                          "export", str(out)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["images"] >= 1
    rows = {r["id"]: r for r in map(json.loads, (out / "train" / "metadata.jsonl").read_text().splitlines())}
    row = rows[result.id]
    assert row["verdict"] == result.verdict and row["label"] == fixed and row["review_state"] == "corrected"
    image = out / "train" / row["file_name"]
    assert hashlib.sha256(image.read_bytes()).hexdigest() == result.evidence["sha256"]  # type: ignore[index]
    assert all(r["review_state"] in ("confirmed", "corrected") for r in rows.values())


def test_a_full_evidence_disk_degrades_the_device_and_heals(tmp_path: Path, demo_dir: Path) -> None:
    with tmpfs(tmp_path / "disk", "8m") as disk:
        cfg = load_config(None)
        cfg.device_id, cfg.data_dir = "full-1", tmp_path / "data"
        cfg.model.path, cfg.model.threads = demo_dir, 2
        cfg.mqtt.enabled = cfg.api.enabled = False
        cfg.evidence.path, cfg.evidence.min_free_mb = disk / "ev", 0
        daemon = Daemon(cfg)
        daemon.start()
        try:
            filler = fill_disk(disk)
            frame = np.full((64, 64, 3), 90, np.uint8)
            first = daemon.entry.submit_image(frame, journal=True).result(timeout=60)
            assert first.evidence is None and daemon.journal.get(first.id) is not None  # the verdict is kept
            health = daemon.status()["health"]
            assert health["state"] == "degraded" and FAULT in health["reasons"]
            assert health["ready"] is True  # verdicts are still journaled: /readyz stays 200
            filler.unlink()
            second = daemon.entry.submit_image(frame, journal=True).result(timeout=60)
            assert second.evidence is not None and daemon.health()["state"] == "ok"
        finally:
            daemon.stop()


@pytest.mark.parametrize(("body", "field"), [
    ("[" * 20_000 + "]" * 20_000, "body"),  # deeply nested JSON (under the 64 kB review limit)
    ('{"action": "confirm", "note": ' + '"' + "x" * 600 + '"}', "note"),
    ('"confirm"', "body"),
])
def test_a_hostile_review_body_is_a_400_naming_the_field(line: Line, body: str, field: str) -> None:
    result = inspect(line)
    req = urllib.request.Request(f"{line.url}/api/v1/results/{result.id}/review", data=body.encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    assert err.value.code == 400 and json.loads(err.value.read())["error"]["message"].startswith(f"{field}:")


def test_status_counts_reviews_by_state(line: Line) -> None:
    counts = line.daemon.status()["reviews"]
    assert counts.get("pending", 0) >= 1 and counts.get("corrected", 0) >= 1


def test_the_openapi_document_lists_the_inspection_endpoints(line: Line) -> None:
    doc = json.loads(http(line, "/api/v1/openapi.json", token=None)[2])
    for path in ("/api/v1/results/{result_id}/image.jpg", "/api/v1/results/{result_id}/thumbnail.jpg",
                 "/api/v1/inspections", "/api/v1/inspections/export.{fmt}", "/api/v1/review/schema",
                 "/api/v1/results/{result_id}/review"):
        assert path in doc["paths"], path
    assert {"evidence", "rules", "review"} <= set(doc["components"]["schemas"]["ResultModel"]["properties"])


def test_alerts_wait_in_the_journal_through_a_broker_outage(line: Line) -> None:
    line.broker.stop()
    wait_for(lambda: not line.daemon.mqtt.connected, 10, "the daemon to see the outage")  # type: ignore[union-attr]
    try:
        result = inspect(line)
        assert line.daemon.verdicts.messages.backlog() >= 1  # on disk, not in paho's memory
    finally:
        line.broker.start()
    # A fresh subscriber, subscribed before the daemon's reconnect (its backoff is 1-30 s): the restarted
    # broker kept no session, so the old subscriber could resubscribe after the alert went by.
    late = Subscriber(line.broker.port, f"{PREFIX}/#")
    try:
        assert late.subscribed.wait(10)
        alert = wait_for(lambda: [a for a in late.on("/station-a/alert") if a["result_id"] == result.id],
                         45, "the alert after the outage")  # the daemon backs off up to 30 s
    finally:
        late.close()
    assert alert[0]["rule"] == "defect"
    wait_for(lambda: line.daemon.verdicts.messages.backlog() == 0, 10, "the backlog to drain")


def test_sighup_reloads_the_rules_of_a_running_daemon(tmp_path: Path, demo_dir: Path) -> None:
    import os
    import signal

    from tests.support.mjpeg import free_port

    port = free_port()
    config = tmp_path / "config.yaml"
    base = (f"device_id: hup-1\ndata_dir: {tmp_path / 'data'}\nmodel: {{path: {demo_dir}, threads: 2}}\n"
            f"mqtt: {{enabled: false}}\napi: {{host: 127.0.0.1, port: {port}}}\ncameras:\n  - name: cam\n"
            f"    source: {write_sample_video(tmp_path / 'v.avi', frames=30)}\n    trigger: {{mode: on_demand}}\n"
            f"    prompt: {DEFECT_PROMPT}\n")
    rule = ("rules:\n  - name: {}\n    when: [{{field: verdict.defect, equals: true}}]\n"
            "    actions: [{{type: review}}]\n")
    config.write_text(base + rule.format("before-hup"))
    proc = subprocess.Popen([sys.executable, "-m", "edge_runtime", "--config", str(config), "run"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    try:
        first = wait_for(lambda: trigger(port), 60, "the daemon to answer a trigger")
        assert [r["name"] for r in first["rules"]] == ["before-hup"]
        config.write_text(base + rule.format("after-hup"))
        os.kill(proc.pid, signal.SIGHUP)
        wait_for(lambda: [r["name"] for r in (trigger(port) or {}).get("rules") or []] == ["after-hup"], 30,
                 "the reloaded rule to fire")
        assert proc.poll() is None  # a reload never ends the daemon
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()


def test_an_image_deleted_by_retention_between_lookup_and_read_is_a_410_not_a_500(line: Line) -> None:
    result = inspect(line)
    found = line.daemon.verdicts.evidence.lookup(result.id)  # type: ignore[union-attr]
    assert found is not None
    store = line.daemon.verdicts.evidence
    real_lookup = store.lookup  # type: ignore[union-attr]
    found.path.unlink()  # retention ran between the lookup and the read
    try:
        store.lookup = lambda _id: found  # type: ignore[union-attr, method-assign]
        status, _, body = http(line, f"/api/v1/results/{result.id}/image.jpg", token=None)
    finally:
        store.lookup = real_lookup  # type: ignore[union-attr, method-assign]
    assert status == 410 and b"evidence_removed" in body, (status, body)


def test_an_unusable_evidence_path_is_one_clear_error(tmp_path: Path) -> None:
    from edge_runtime.core.errors import EdgeRuntimeError

    (tmp_path / "file").write_text("not a folder")
    cfg = load_config(None)
    cfg.data_dir, cfg.evidence.path = tmp_path / "data", tmp_path / "file" / "ev"
    cfg.mqtt.enabled = cfg.api.enabled = False
    with pytest.raises(EdgeRuntimeError, match=r"^evidence.path .*/file/ev: cannot be used"):
        Daemon(cfg)


def test_an_alert_queued_before_a_kill_9_is_sent_after_the_restart(tmp_path: Path, demo_dir: Path) -> None:
    import os
    import signal

    from tests.support.mjpeg import free_port

    broker = Broker(tmp_path / "broker")  # not started: the alert cannot leave before the kill
    port = free_port()
    config = tmp_path / "config.yaml"
    config.write_text(
        f"device_id: k9\ndata_dir: {tmp_path / 'data'}\nmodel: {{path: {demo_dir}, threads: 2}}\n"
        f"mqtt: {{host: 127.0.0.1, port: {broker.port}}}\napi: {{host: 127.0.0.1, port: {port}}}\n"
        f"cameras:\n  - name: cam\n    source: {write_sample_video(tmp_path / 'v.avi', frames=30)}\n"
        "    trigger: {mode: on_demand}\n"
        f"    prompt: {DEFECT_PROMPT}\n"
        "rules:\n  - name: d\n    when: [{field: verdict.defect, equals: true}]\n    actions: [{type: alert}]\n")

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "edge_runtime", "--config", str(config), "run"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


    proc = start()
    subscriber = None
    try:
        result = wait_for(lambda: trigger(port), 60, "a triggered result")
        assert result["rules"][0]["name"] == "d"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        broker.start()
        alerts = subscriber = Subscriber(broker.port, "edge/k9/+/alert")
        proc = start()
        wait_for(lambda: [a for a in alerts.on("/cam/alert") if a["result_id"] == result["id"]], 60,
                 "the alert after the restart")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if subscriber is not None:
            subscriber.close()
        broker.stop()


def test_skipped_re_asks_are_counted_on_metrics(line: Line) -> None:
    def skipped() -> float:
        _, _, metrics = http(line, "/metrics", token=None)
        rows = [ln for ln in metrics.decode().splitlines() if ln.startswith("edge_rule_reasks_skipped_total ")]
        return float(rows[0].split()[-1])

    before = skipped()
    for _ in range(7):  # "second-look" re-asks at most 6 times a minute (the default)
        inspect(line)
    assert skipped() >= before + 1


def test_each_webhook_destination_and_the_rules_budget_show_on_metrics(line: Line) -> None:
    inspect(line)
    wait_for(lambda: line.receiver.keys(), 30, "the webhook")
    _, _, metrics = http(line, "/metrics", token=None)
    text = metrics.decode()
    origin = f'destination="http://127.0.0.1:{line.receiver.port}"'
    assert any(ln.startswith("edge_webhook_destination_pending{") and origin in ln for ln in text.splitlines())
    for name in ("edge_rule_reasks_budget_skipped_total", "edge_rule_regex_budget_exhausted_total",
                 "edge_rule_regex_timeouts_total", "edge_journal_escaped_total"):
        assert f"\n{name} " in text, name


def test_a_journal_row_whose_sha256_is_not_one_links_nothing_and_lists_and_exports_answer(
        line: Line, tmp_path: Path) -> None:
    """A row's `evidence.sha256` was made a path as it was: "/x/y" stat'd /x/y.jpg outside the evidence folder (a
    file there kept the link), and one with a NUL raised ValueError, a 500 for the list and an export cut short."""
    outside = tmp_path / "outside"
    outside.with_suffix(".jpg").write_bytes(b"\xff\xd8 not ours")
    ids = {}
    template = Result(device="d", camera="belt", frame=FrameInfo(0, 10, 10), verdict={"defect": False}, text="{}",
                      model="m@1", timings_ms={"total": 1.0}, prompt="p").to_dict()
    for name, sha in (("outside", str(outside)), ("nul", "ab\x00cd"), ("short", "ab")):
        row = dict(template, id=uuid.uuid4().hex)
        row["evidence"] = {"uri": f"/api/v1/results/{row['id']}/image.jpg", "sha256": sha, "bytes": 10,
                           "width": 10, "height": 10}
        ids[name] = row["id"]
        with sqlite3.connect(line.daemon.journal.path, timeout=30) as db:  # as an import or a bad restore writes it
            db.execute("INSERT INTO results (id, ts, created, camera, body, sent) VALUES (?, ?, ?, ?, ?, 1)",
                       (row["id"], row["ts"], time.time(), "belt", json.dumps(row)))
    for path in ("/api/v1/results?limit=1000", "/api/v1/inspections?limit=1000"):
        status, _, body = http(line, path, token=None)
        assert status == 200, (path, status, body[:300])
        listed = {r["id"]: r["evidence"] for r in json.loads(body)["results"] if r["id"] in ids.values()}
        assert set(listed) == set(ids.values())
        for evidence in listed.values():
            assert evidence["uri"] is None and evidence["removed"]["why"] == "missing", (path, evidence)
    status, _, body = http(line, "/api/v1/inspections/export.jsonl", token=None)
    exported = {r["id"]: r["evidence"] for r in map(json.loads, body.splitlines()) if r["id"] in ids.values()}
    assert status == 200 and set(exported) == set(ids.values()) and all(e["uri"] is None for e in exported.values())
    status, _, body = http(line, "/api/v1/inspections/export.csv", token=None)
    rows = [r for r in csv.DictReader(io.StringIO(body.decode())) if r["id"] in ids.values()]
    assert status == 200 and len(rows) == 3 and all(r["evidence_uri"] == "" for r in rows)
    for result_id in ids.values():  # a read of one, and its image route: no file outside the folder, no 500
        status, _, body = http(line, f"/api/v1/results/{result_id}")
        assert status == 200 and json.loads(body)["evidence"]["uri"] is None, body[:300]
        status, _, body = http(line, f"/api/v1/results/{result_id}/image.jpg", token=None)
        assert status in (404, 410), (status, body[:300])
    assert outside.with_suffix(".jpg").exists()


# Last in the module: its inspection takes one of the 6 re-asks a minute (rules_budget) the re-ask tests count on.
def test_an_image_removed_by_hand_loses_its_link_in_lists_and_exports_before_anything_reads_it(line: Line) -> None:
    """Lists and exports handed out the link of an image removed by hand (which then answered 410) until a read
    of that result or its image route found it missing and marked the row."""
    result = inspect(line)
    store = line.daemon.verdicts.evidence
    found = store.lookup(result.id) if store is not None else None
    assert found is not None and result.evidence is not None
    found.path.unlink()

    status, _, body = http(line, "/api/v1/results?limit=1000", token=None)
    assert status == 200
    [listed] = [r["evidence"] for r in json.loads(body)["results"] if r["id"] == result.id]
    status, _, body = http(line, "/api/v1/inspections?limit=1000", token=None)
    assert status == 200
    [inspected] = [r["evidence"] for r in json.loads(body)["results"] if r["id"] == result.id]
    status, _, body = http(line, "/api/v1/inspections/export.jsonl", token=None)
    assert status == 200
    [exported] = [json.loads(x)["evidence"] for x in body.splitlines() if result.id.encode() in x]
    for evidence in (listed, inspected, exported):
        assert evidence["uri"] is None and evidence["removed"]["why"] == "missing", evidence
        assert evidence["sha256"] == result.evidence["sha256"] and evidence["removed"]["at"]
    status, _, body = http(line, "/api/v1/inspections/export.csv", token=None)
    row = next(r for r in csv.DictReader(io.StringIO(body.decode())) if r["id"] == result.id)
    assert status == 200 and row["evidence_uri"] == ""
    # Said, not written: the read path took no write lock (a read of the result, or its image route, marks it).
    journaled = line.daemon.journal.get(result.id)
    assert journaled is not None and journaled["evidence"]["uri"] == f"/api/v1/results/{result.id}/image.jpg"
    status, _, body = http(line, f"/api/v1/results/{result.id}")
    assert json.loads(body)["evidence"]["removed"]["why"] == "missing"
    journaled = line.daemon.journal.get(result.id)
    assert journaled is not None and journaled["evidence"]["uri"] is None
