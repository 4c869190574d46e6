"""`edge-runtime run` as a real process: signals, reload, systemd notify."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge_runtime.core.samples import write_sample_video


def journal_rows(db: Path, camera: str | None = None) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        try:
            if camera:
                return int(conn.execute("SELECT COUNT(*) FROM results WHERE camera = ?", (camera,)).fetchone()[0])
            return int(conn.execute("SELECT COUNT(*) FROM results").fetchone()[0])
        except sqlite3.OperationalError:
            return 0


def wait_until(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


def write_config(path: Path, data: Path, model: Path, cameras: list[tuple[str, Path]]) -> None:
    lines = [f"device_id: proc-test\ndata_dir: {data}\nmodel:\n  path: {model}\n  threads: 2\n"
             "api:\n  port: 0\nmqtt:\n  enabled: false\ncameras:\n"]
    for name, video in cameras:
        lines.append(f"  - name: {name}\n    source: {video}\n    fps: 30\n"
                     "    trigger: {mode: interval, interval_s: 0.1}\n")
    path.write_text("".join(lines))


@pytest.fixture
def setup(tmp_path: Path, demo_dir: Path) -> tuple[Path, Path, Path]:
    video = write_sample_video(tmp_path / "v.avi", frames=40)
    cfg = tmp_path / "edge.yaml"
    write_config(cfg, tmp_path / "data", demo_dir, [("first", video)])
    return cfg, video, tmp_path / "data" / "journal.sqlite3"


def start(cfg: Path, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", "edge_runtime", "--config", str(cfg), "run"],
                                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})


def test_sigterm_mid_inspection_exits_cleanly_with_the_journal_intact(setup, tmp_path: Path) -> None:
    cfg, _, db = setup
    proc = start(cfg, tmp_path / "log")
    try:
        wait_until(lambda: journal_rows(db) >= 5)
    finally:
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        rc = proc.wait(timeout=10)
    assert rc == 0 and time.monotonic() - t0 < 5
    log = (tmp_path / "log").read_text()
    assert "daemon: stopped" in log and "Traceback" not in log
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    logged = log.count("INFO edge_runtime.verdicts.pipeline: result ")
    assert journal_rows(db) == logged  # every finished (logged) result is in the journal


def test_sighup_adds_a_camera_without_reloading_the_model(setup, tmp_path: Path, demo_dir: Path) -> None:
    cfg, video, db = setup
    proc = start(cfg, tmp_path / "log")
    try:
        wait_until(lambda: journal_rows(db, "first") >= 1)
        write_config(cfg, tmp_path / "data", demo_dir, [("first", video), ("second", video)])
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: journal_rows(db, "second") >= 2)
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    log = (tmp_path / "log").read_text()
    assert "config reloaded (2 cameras)" in log and "loading the new model" not in log


def test_systemd_gets_ready_and_watchdog_pings(setup, tmp_path: Path) -> None:
    cfg, _, _ = setup
    sock_path = str(tmp_path / "notify.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(sock_path)
    server.settimeout(30)
    proc = start(cfg, tmp_path / "log", {"NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "1000000"})
    messages: list[str] = []
    try:
        while not any("WATCHDOG=1" in m for m in messages):
            messages.append(server.recv(4096).decode())
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        server.close()
    assert any(m.startswith("READY=1") for m in messages)
    ready = next(i for i, m in enumerate(messages) if m.startswith("READY=1"))
    watchdog = next(i for i, m in enumerate(messages) if "WATCHDOG=1" in m)
    assert ready < watchdog
