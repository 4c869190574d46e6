"""The anomaly gate: the encoder's own patch embeddings against a bank of good parts' (PatchCore).

`fit.py` makes a bank from good images' features, `bank.py` writes and reads its file, `gate.py`
scores frames against it (`search.py`: faiss), `heatmap.py` turns the per-patch distances into an
image. `features.py` and `layout.py` say what an encoded frame's embeddings are and where they lie.
In the daemon, `loading.py` loads and checks each gated camera's bank and `step.py` (`GateStep`) looks
at each frame before the language model does (`look.py`: what it saw, its counters).
"""

from edge_runtime.inference.anomaly.bank import (
    BankCorrupt,
    BankError,
    BankHeader,
    BankMismatch,
    BankThreshold,
    BankTooLarge,
    read_bank,
    read_header,
    verify_bank,
    write_bank,
)
from edge_runtime.inference.anomaly.features import GateContext, PatchFeatures, gate_context, patch_features
from edge_runtime.inference.anomaly.gate import AnomalyGate, FrameMismatch, GateScore
from edge_runtime.inference.anomaly.heatmap import heat_map, overlay_heat

__all__ = ["AnomalyGate", "BankCorrupt", "BankError", "BankHeader", "BankMismatch", "BankThreshold", "BankTooLarge",
           "FrameMismatch", "GateContext", "GateScore", "PatchFeatures", "gate_context", "heat_map", "overlay_heat",
           "patch_features", "read_bank", "read_header", "verify_bank", "write_bank"]
