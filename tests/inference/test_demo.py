"""The demo bundle's verdicts read like an inspection, although its weights are random."""

from __future__ import annotations

from edge_runtime_models.demo import DEMO_NOTES

from edge_runtime.core.samples import part_image
from edge_runtime.inference.inspector import Inspector


def test_demo_verdict_notes_are_readable_phrases(inspector: Inspector) -> None:
    for seed in range(4):
        verdict = inspector.inspect(part_image(seed, defect=seed % 2 == 1), camera="demo").verdict
        assert set(verdict) == {"defect", "category", "confidence", "notes"}
        assert verdict["notes"] in DEMO_NOTES
        assert verdict["notes"].isprintable()
