"""`gate:` (config/gate.py): a mode that uses the gate needs a bank; every key is documented."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from edge_runtime.config.gate import GateConfig
from tests.shipping.test_docs import keys

ROOT = Path(__file__).resolve().parents[2]


def test_a_mode_that_uses_the_gate_needs_a_bank() -> None:
    assert GateConfig().mode == "off" and GateConfig().audit_every == 50
    with pytest.raises(ValidationError, match=r"gate\.mode skip_ok needs gate\.bank"):
        GateConfig(mode="skip_ok")
    cfg = GateConfig.model_validate({"mode": "annotate", "bank": "/var/lib/edge-runtime/a.bank", "threshold": 0.2})
    assert cfg.threshold == 0.2
    for bad in ({"threshold": 0}, {"audit_every": 0}, {"max_bank_mb": 0}, {"mode": "on"}, {"bank_file": "x"}):
        with pytest.raises(ValidationError):
            GateConfig.model_validate(bad)


def test_every_gate_key_is_in_the_configuration_doc() -> None:
    doc = (ROOT / "docs/configuration.md").read_text()
    assert [k for k in keys(GateConfig, "cameras[].gate.") if f"`{k}`" not in doc] == []
