"""A reload that changes the model and turns the anomaly gates off keeps them visible in health."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import Config
from edge_runtime.config.gate import GateConfig
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.core.inspection_queue import InspectionRequest
from edge_runtime.inference.anomaly import gate_context, patch_features, write_bank
from edge_runtime.inference.anomaly.fit import bank_header, fit_bank
from edge_runtime.inference.anomaly.step import gates_for
from edge_runtime.inference.inspector import Inspector
from tests.app.test_gate_daemon import OK, bank, camera, config, parts, run_daemon  # noqa: F401 - fixtures
from tests.inference.test_anomaly_gate import _bundle_with_another_encoder
from tests.support.parts import clean_part
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


def test_a_frame_encoded_before_a_model_reload_is_scored_only_with_the_new_models_encoding(
        run_daemon: Callable[..., Daemon], tmp_path: Path, demo_dir: Path, bank: Path,  # noqa: F811
        parts: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """A frame waits for the gate's thread while a reload swaps in a model with another encoder (and a bank
    fitted on it): the new gate never scores the old encoder's embeddings (same shape, other weights: the
    score would be garbage, a gated OK an escape); stage 2 encodes the frame again and the gate looks there."""
    gate = GateConfig(mode="skip_ok", bank=str(bank), threshold=100.0, audit_every=1000, verdict=OK)
    good = config(tmp_path, demo_dir, camera(parts, gate, mode="on_demand"))
    path = tmp_path / "config.yaml"
    _write(path, good)
    daemon = run_daemon(good, path)
    other_dir = _bundle_with_another_encoder(demo_dir, tmp_path)
    other = Inspector(load_bundle(other_dir), good.model.model_copy(update={"warmup": False}), "t")
    try:
        context = gate_context(other.bundle, other.settings)
        feats = [patch_features(other.encode(clean_part(s)), context) for s in range(8)]
        fit = fit_bank(feats)
        other_bank = tmp_path / "other.bank"
        write_bank(other_bank, bank_header(fit, context, feats[0]), fit.vectors)
        frames = [clean_part(30), clean_part(31)]
        wanted = [other.encode(f).embeds for f in frames]
    finally:
        other.close()

    reloaded = threading.Event()
    old_gate = daemon.gates.cameras["belt"].gate
    old_score = old_gate.score

    def held(encoded: Any) -> Any:  # the first frame holds the gate's thread until the reload is done
        reloaded.wait(30)
        return old_score(encoded)

    monkeypatch.setattr(old_gate, "score", held)
    first = InspectionRequest(frames[0], "belt", seq=0, journal=True)
    second = InspectionRequest(frames[1], "belt", seq=1, journal=True)
    daemon.inspections.submit(first)
    daemon.inspections.submit(second)
    assert second.encoded.wait(30)  # encoded by the old model, waiting behind the first for the gate
    moved = good.model_copy(deep=True)
    moved.model.path = other_dir
    assert moved.cameras[0].gate is not None
    moved.cameras[0].gate.bank = str(other_bank)
    _write(path, moved)
    daemon.reload()
    new_gate = daemon.gates.cameras["belt"].gate
    assert new_gate is not old_gate
    scored: list[np.ndarray] = []
    new_score = new_gate.score

    def seen(encoded: Any) -> Any:
        scored.append(np.array(encoded.embeds))
        return new_score(encoded)

    monkeypatch.setattr(new_gate, "score", seen)
    reloaded.set()
    assert second.future.result(60).source["engine"] == "gate"
    first.future.result(60)
    assert scored, "the new gate never looked at the frame"
    assert all(np.allclose(s, wanted[1], atol=1e-5) for s in scored), \
        "the new model's gate scored embeddings the old encoder made"


def test_a_frame_the_new_model_encoded_is_never_scored_by_the_old_models_banks(
        run_daemon: Callable[..., Daemon], tmp_path: Path, demo_dir: Path, bank: Path,  # noqa: F811
        parts: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Between a reload's model swap and the new banks' install (the old model closed, the new banks read),
    the old model's gates must not score frames the new encoder made (same shape, other weights: a
    garbage score, a gated OK an escape). A frame inspected in that window goes to the language model."""
    gate = GateConfig(mode="skip_ok", bank=str(bank), threshold=100.0, audit_every=1000, verdict=OK)
    good = config(tmp_path, demo_dir, camera(parts, gate, mode="on_demand"))
    path = tmp_path / "config.yaml"
    _write(path, good)
    daemon = run_daemon(good, path)
    old_gate = daemon.gates.cameras["belt"].gate
    old_score = old_gate.score
    scored: list[object] = []

    def spied(encoded: Any) -> Any:
        scored.append(daemon.inspector)
        return old_score(encoded)

    monkeypatch.setattr(old_gate, "score", spied)
    moved = good.model_copy(deep=True)
    moved.model.path = _bundle_with_another_encoder(demo_dir, tmp_path)
    _write(path, moved)  # the old bank does not fit the new encoder: the gates go off after the reload
    real = gates_for
    inside: list[Any] = []

    def window(bundle: Any, cfg: Config) -> Any:  # the new model is in place, its banks not yet installed
        request = InspectionRequest(clean_part(40), "belt", seq=0, journal=True)
        daemon.inspections.submit(request)
        inside.append(request.future.result(60))
        return real(bundle, cfg)

    monkeypatch.setattr("edge_runtime.app.reload.gates_for", window)
    daemon.reload()
    assert inside and inside[0].source["engine"] != "gate", "the old bank answered the new encoder's frame"
    assert scored == [], "the old model's gate scored a frame while the new model was in place"
