"""What operators rely on: readiness and metrics that show a degraded device, and a token rotated by SIGHUP."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import requests
from flask.testing import FlaskClient

from edge_runtime.app.daemon import Daemon
from edge_runtime.core.samples import part_image, write_sample_video
from tests.api.test_api import running_daemon
from tests.support.flask_json import json_of
from tests.support.images import encode
from tests.support.waiting import wait_for

JPEG = encode(part_image(1), ".jpg")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    yield from running_daemon(tmp_path_factory.mktemp("ops"), demo_dir, results=2)


def test_readiness_is_200_while_degraded_and_503_only_when_results_cannot_be_journaled(
        client: FlaskClient, daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    assert json_of(client.get("/readyz"))["state"] == "ok"
    daemon.faults.add("offload endpoints down")  # a peer's fault: inspection and the journal go on
    try:
        ready = client.get("/readyz")
        assert ready.status_code == 200 and "Retry-After" not in ready.headers
        assert json_of(ready) == {"ready": True, "state": "degraded", "reasons": ["offload endpoints down"],
                                  "model": json_of(ready)["model"]}
        monkeypatch.setattr(daemon.journal, "full_since", time.monotonic())  # the journal cannot write
        unready = client.get("/readyz")
        assert unready.status_code == 503 and unready.headers["Retry-After"]
        assert json_of(unready)["ready"] is False and json_of(unready)["reasons"] == [
            "disk full", "offload endpoints down"]
        assert client.get("/healthz").status_code == 200  # alive all the same
        monkeypatch.undo()
        # The line's job store is the journal of line jobs: while it cannot write, the device is unready.
        writer = SimpleNamespace(fault=lambda: "the line job writer restarted 1 time(s), last 3 s ago: OSError")
        monkeypatch.setattr(daemon.report, "line_io", SimpleNamespace(jobs=writer))  # what readiness reads
        unready = client.get("/readyz")
        assert unready.status_code == 503 and json_of(unready)["ready"] is False
        assert "line_io: job store: the line job writer restarted 1 time(s)" in " ".join(json_of(unready)["reasons"])
    finally:
        daemon.faults.discard("offload endpoints down")
        monkeypatch.undo()
    assert client.get("/readyz").status_code == 200


def test_readiness_does_not_touch_the_journal(client: FlaskClient, daemon: Daemon,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def slow(*a: Any, **k: Any) -> Any:
        raise AssertionError("/readyz queried the journal")
    monkeypatch.setattr(daemon.journal, "counts", slow)
    assert client.get("/readyz").status_code == 200


def test_metrics_content_type_names_the_charset_once(client: FlaskClient) -> None:
    content_type = client.get("/metrics").headers["Content-Type"]
    assert content_type.count("charset=utf-8") == 1 and content_type.startswith("text/plain")


def test_metrics_latency_is_in_seconds(client: FlaskClient, daemon: Daemon) -> None:
    text = client.get("/metrics").get_data(as_text=True)
    assert "edge_stage_latency_ms" not in text
    count = float(text.split('edge_stage_latency_seconds_count{stage="total"} ')[1].split()[0])
    total = float(text.split('edge_stage_latency_seconds_sum{stage="total"} ')[1].split()[0])
    assert count >= 1 and 0 < total / count < 30  # seconds per inspection, not milliseconds


def test_metrics_expose_readiness_and_degraded_reasons(client: FlaskClient, daemon: Daemon) -> None:
    assert "edge_runtime_ready 1.0" in client.get("/metrics").get_data(as_text=True)
    daemon.faults.add("offload endpoints down")
    try:
        text = client.get("/metrics").get_data(as_text=True)
        # degraded by a peer's fault, still ready: what /readyz answers
        assert 'edge_runtime_degraded{reason="offload endpoints down"} 1.0' in text and "edge_runtime_ready 1.0" in text
    finally:
        daemon.faults.discard("offload endpoints down")


def test_metrics_render_thread_restarts_when_status_has_them(client: FlaskClient, daemon: Daemon,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    real = daemon.status
    monkeypatch.setattr(daemon, "status", lambda: {**real(), "threads": {
        "inspector": {"alive": True, "restarts": 2, "busy_s": 12.5}, "outbox": {"alive": False, "restarts": 0}}})
    text = client.get("/metrics").get_data(as_text=True)
    assert 'edge_runtime_thread_restarts_total{thread="inspector"} 2.0' in text
    assert 'edge_runtime_thread_alive{thread="outbox"} 0.0' in text
    assert 'edge_runtime_thread_busy_seconds{thread="inspector"} 12.5' in text
    assert 'edge_runtime_thread_busy_seconds{thread="outbox"} 0.0' in text


def test_a_clip_rings_frames_held_is_a_gauge_not_a_counter(client: FlaskClient, daemon: Daemon,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    real = daemon.status
    camera = {"name": "capper", "state": "streaming", "fps": 10.0,
              "frames": {"captured": 40, "waiting_for_clip": 3, "clip_frames_held": 2, "clip_restarts": 1}}
    monkeypatch.setattr(daemon, "status", lambda: {**real(), "cameras": [camera]})
    text = client.get("/metrics").get_data(as_text=True)
    assert "# TYPE edge_camera_clip_frames_held gauge" in text
    assert 'edge_camera_clip_frames_held{camera="capper"} 2.0' in text
    assert 'outcome="clip_frames_held"' not in text  # it falls as the ring empties: no counter's rate()
    assert 'edge_camera_frames_total{camera="capper",outcome="clip_restarts"} 1.0' in text


def test_metrics_count_admission_refusals(client: FlaskClient, daemon: Daemon) -> None:
    assert daemon.api is not None
    gate = daemon.api.app.extensions["edge_runtime_admission"]
    before = gate.refused
    gate.max_requests, old = 0, gate.max_requests
    try:
        refused = client.post("/api/v1/infer", json={"image": base64.b64encode(JPEG).decode()})
        assert refused.status_code == 429 and refused.headers["Retry-After"]
    finally:
        gate.max_requests = old
    text = client.get("/metrics").get_data(as_text=True)
    assert f'edge_api_refused_total{{kind="inference"}} {float(before + 1)}' in text


# ---- token rotation by SIGHUP on a real process (issue 14 item 5) ------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(path: Path, data: Path, model: Path, video: Path, port: int, token: str) -> None:
    path.write_text(f"device_id: rotate\ndata_dir: {data}\nmodel:\n  path: {model}\n  threads: 2\n"
                    f"api:\n  host: 127.0.0.1\n  port: {port}\n  token: {token}\nmqtt:\n  enabled: false\n"
                    f"cameras:\n  - name: belt\n    source: {video}\n    fps: 10\n"
                    "    trigger: {mode: on_demand}\n")


def test_sighup_rotates_the_api_token(tmp_path: Path, demo_dir: Path) -> None:
    cfg, port = tmp_path / "edge.yaml", free_port()
    video = write_sample_video(tmp_path / "v.avi", frames=40)
    write_config(cfg, tmp_path / "data", demo_dir, video, port, "old-token-1")
    log = tmp_path / "log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "edge_runtime", "--config", str(cfg), "run"],
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "EDGE_RUNTIME_DATA": str(tmp_path / "data")})
    base = f"http://127.0.0.1:{port}"
    body = {"image": base64.b64encode(JPEG).decode()}

    def infer(token: str) -> int:
        return requests.post(f"{base}/api/v1/infer", json=body, headers={"Authorization": f"Bearer {token}"},
                             timeout=30).status_code

    def ready() -> bool:
        try:
            return requests.get(f"{base}/readyz", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    try:
        wait_for(ready, 60, "the daemon to be ready")
        assert infer("old-token-1") == 200 and infer("new-token-2") == 401
        write_config(cfg, tmp_path / "data", demo_dir, video, port, "new-token-2")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "config reloaded" in log.read_text(), 30, "the reload")
        assert infer("old-token-1") == 401 and infer("new-token-2") == 200
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_apply_names_the_settings_that_need_a_restart(daemon: Daemon) -> None:
    assert daemon.api is not None
    new = daemon.config.api.model_copy(update={"port": 1, "threads": 9, "request_timeout_s": 5})
    try:
        assert daemon.api.apply(new) == ["port", "threads"]
    finally:
        daemon.api.apply(daemon.config.api)
