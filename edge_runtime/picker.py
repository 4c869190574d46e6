"""Moved to `edge_runtime.llm.picker`; kept so old imports keep working."""

from .llm.picker import GREEDY, Candidates, PickerHost, Sampling, TokenPicker

__all__ = ["GREEDY", "Candidates", "PickerHost", "Sampling", "TokenPicker"]
