"""Reload: broken files never end the daemon, command-line cameras stay, status races reload safely."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, TriggerConfig
from edge_runtime.core.errors import EdgeRuntimeError
from edge_runtime.core.samples import write_sample_video
from tests.app.test_lifecycle import setup, start, wait_until, write_config  # noqa: F401
from tests.config.test_hostile_config import CORPUS
from tests.support.file_daemon import daemon_from_file
from tests.support.waiting import wait_for


def test_sighup_with_broken_configs_keeps_the_daemon_running(setup, tmp_path: Path, demo_dir: Path) -> None:  # noqa: F811
    cfg, video, _ = setup
    log = tmp_path / "log"
    proc = start(cfg, log)
    broken = [*sorted(CORPUS), "directory", "symlink_loop", "huge"]
    try:
        wait_until(lambda: "daemon: ready" in log.read_text(), timeout=60)
        for n, name in enumerate(broken, 1):
            cfg.unlink() if cfg.is_file() or cfg.is_symlink() else cfg.rmdir()
            if name == "directory":
                cfg.mkdir()
            elif name == "symlink_loop":
                cfg.symlink_to(cfg)
            elif name == "huge":
                with cfg.open("wb") as f:
                    f.truncate(1 << 30)
            else:
                cfg.write_bytes(CORPUS[name])
            proc.send_signal(signal.SIGHUP)
            wait_until(lambda n=n: log.read_text().count("reload refused") == n, timeout=30)
            assert proc.poll() is None, name
        cfg.unlink()
        write_config(cfg, tmp_path / "data", demo_dir, [("first", video), ("second", video)])
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "config reloaded (2 cameras)" in log.read_text(), timeout=60)
        assert proc.poll() is None
    finally:
        proc.terminate()
        rc = proc.wait(timeout=15)
    text = log.read_text()
    assert rc == 0 and "Traceback" not in text
    refused = [line for line in text.splitlines() if "reload refused" in line]
    assert len(refused) == len(broken) and all(" ERROR " in line for line in refused)


@pytest.mark.parametrize("name", ["unhashable_key", "recursive_alias"])
def test_start_with_a_broken_config_is_one_line_and_exit_2(name: str, tmp_path: Path) -> None:
    path = tmp_path / "edge.yaml"
    path.write_bytes(CORPUS[name])
    proc = subprocess.run([sys.executable, "-m", "edge_runtime", "--config", str(path), "run"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


@contextmanager
def daemon_with_file(tmp_path: Path, demo_dir: Path, file_cameras: list[CameraConfig],
                     extra: list[CameraConfig]) -> Iterator[tuple[Daemon, Path, Config]]:
    cfg = Config(device_id="reload-test", data_dir=tmp_path / "data")
    cfg.model.path = demo_dir
    cfg.model.threads = 2
    cfg.api.enabled = False
    cfg.mqtt.enabled = False
    cfg.cameras = file_cameras
    running = cfg.model_copy(deep=True)
    running.cameras = file_cameras + extra  # as `run --demo` adds its camera beyond the file
    with daemon_from_file(tmp_path / "edge.yaml", cfg, running=running) as started:
        yield started.daemon, started.path, cfg


def test_reload_keeps_the_demo_camera(tmp_path: Path, demo_dir: Path) -> None:
    video = write_sample_video(tmp_path / "v.avi", frames=20)
    demo = CameraConfig(name="demo", source=str(video), fps=10, trigger=TriggerConfig(mode="interval"))
    with daemon_with_file(tmp_path, demo_dir, [], [demo]) as (daemon, path, cfg):
        cfg.log_level = "debug"
        path.write_text(cfg.model_dump_json())
        assert daemon.reload()["applied"] == ["log_level"]
        assert sorted(daemon.rigs) == ["demo"]
        path.write_text("? [a, b]\n: 1\n")
        with pytest.raises(EdgeRuntimeError, match="reload refused"):
            daemon.reload()
        assert sorted(daemon.rigs) == ["demo"]


def test_status_is_safe_while_reloads_add_and_remove_cameras(tmp_path: Path, demo_dir: Path) -> None:
    video = write_sample_video(tmp_path / "v.avi", frames=20)
    cams = [CameraConfig(name=f"c{i}", source=str(video), fps=10, trigger=TriggerConfig(mode="on_demand"))
            for i in range(6)]
    with daemon_with_file(tmp_path, demo_dir, cams[:1], []) as (daemon, path, cfg):
        errors: list[BaseException] = []
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                try:
                    daemon.status()
                    daemon.telemetry()
                except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                    errors.append(exc)
                    return

        pollers = [threading.Thread(target=poll) for _ in range(2)]
        for t in pollers:
            t.start()
        try:
            for i in range(20):
                cfg.cameras = cams[: 1 + (i % 6)] if i % 2 else cams[:1]
                path.write_text(cfg.model_dump_json())
                daemon.reload()
                wait_for(lambda: len(daemon.rigs) == len(cfg.cameras), what="cameras")
        finally:
            stop.set()
            for t in pollers:
                t.join(10)
    assert not errors, errors
