"""A bank fitted again to the same path and a SIGHUP: the reload loads the new bank (it always re-reads
the banks) and now says so, `applied: cameras.<name>.gate.bank`. It said `applied: nothing`, so the
technician who re-fitted the gate read that the daemon had ignored it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from edge_runtime.app.daemon import Daemon
from edge_runtime.config.gate import GateConfig
from edge_runtime.core.bundle.manifest import Bundle
from edge_runtime.inference.anomaly import gate_context, patch_features, write_bank
from edge_runtime.inference.anomaly.fit import bank_header, fit_bank
from edge_runtime.inference.inspector import Inspector
from tests.app.test_gate_daemon import bank, camera, config, parts, run_daemon  # noqa: F401 - fixtures
from tests.support.parts import clean_part


def test_a_bank_fitted_again_in_place_is_named_in_the_reloads_applied_list(
        run_daemon: Callable[..., Daemon], tmp_path: Path, demo_dir: Path, bank: Path, parts: Path,  # noqa: F811
        inspector: Inspector, demo_bundle: Bundle) -> None:
    path_bank = tmp_path / "station.bank"
    path_bank.write_bytes(bank.read_bytes())
    cfg = config(tmp_path, demo_dir, camera(parts, GateConfig(mode="annotate", bank=str(path_bank), threshold=1.0),
                                            mode="on_demand"))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_defaults=True)))
    daemon = run_daemon(cfg, path)
    before = daemon.gates.cameras["belt"].gate.header.vectors.sha256
    assert daemon.reload()["applied"] == []  # nothing changed: nothing is named
    context = gate_context(demo_bundle, inspector.settings)
    feats = [patch_features(inspector.encode(clean_part(s)), context) for s in range(40, 46)]
    fit = fit_bank(feats)
    write_bank(path_bank, bank_header(fit, context, feats[0]), fit.vectors)  # `gate fit` again, same path
    applied = daemon.reload()["applied"]
    after = daemon.gates.cameras["belt"].gate.header.vectors.sha256
    assert after != before
    assert applied == ["cameras.belt.gate.bank"]
