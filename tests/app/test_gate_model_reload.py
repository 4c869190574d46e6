"""A reload that changes the model and turns the anomaly gates off keeps them visible in health."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import Config
from edge_runtime.config.gate import GateConfig
from tests.app.test_gate_daemon import bank, camera, config, parts, run_daemon  # noqa: F401 - fixtures
from tests.inference.test_anomaly_gate import _bundle_with_another_encoder
from tests.support.waiting import wait_for


def _write(path: Path, cfg: Config) -> None:
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_defaults=True)))


def _gates_off(daemon: Daemon) -> list[str]:
    return [r for r in daemon.health()["reasons"] if r.startswith("anomaly gates off")]


def test_a_model_reload_that_turns_the_gates_off_is_a_health_reason_until_they_load_again(
        run_daemon: Callable[..., Daemon], tmp_path: Path, demo_dir: Path, bank: Path,  # noqa: F811
        parts: Path) -> None:  # noqa: F811
    good = config(tmp_path, demo_dir, camera(parts, GateConfig(mode="annotate", bank=str(bank), threshold=1.0),
                                             mode="on_demand"))
    path = tmp_path / "config.yaml"
    _write(path, good)
    daemon = run_daemon(good, path)
    wait_for(lambda: daemon.health()["ready"], what="the daemon ready", timeout=60)
    assert "belt" in daemon.gates.cameras and _gates_off(daemon) == []
    moved = good.model_copy(deep=True)
    moved.model.path = _bundle_with_another_encoder(demo_dir, tmp_path)
    _write(path, moved)
    daemon.reload()
    assert daemon.gates.cameras == {}
    health = daemon.health()
    off = _gates_off(daemon)
    assert health["state"] == "degraded" and len(off) == 1 and "cameras.belt.gate" in off[0], health
    _write(path, good)
    daemon.reload()
    assert "belt" in daemon.gates.cameras and _gates_off(daemon) == []
