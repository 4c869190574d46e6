"""`cameras[].gate`: the anomaly gate in front of the language model (docs/inspection.md).

The daemon loads each camera's bank at start and reload (inference/anomaly/loading.py); a bank made with
another encoder, budget or crop refuses the config in one line.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from edge_runtime.config.base import ConfigPathText, Section


class GateConfig(Section):
    mode: Literal["off", "annotate", "skip_ok"] = Field(
        "off", description="off: no gate. annotate: every result carries the gate's score and threshold; the "
        "language model answers every frame as before. skip_ok: a frame scoring under the threshold is an OK "
        "result without the language model (source.engine: gate), journaled, published and handed to the "
        "line like any other; the rest go to the language model. With a program's regions: answered when every "
        "region is under its threshold, else only the regions over theirs are asked.")
    bank: ConfigPathText | None = Field(
        None, max_length=4096, description="The bank file `edge-runtime gate fit` wrote for this camera (or "
        "recipe). It must have been made with this model's encoder, image budget and crop: a bank of another "
        "is refused at load with one line, and the gate stays off for this camera. A camera whose program has "
        "regions or tiling needs a bank of one section per region (`gate fit DIR OUT --camera NAME`).")
    threshold: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="Scores under this are gated as OK: a finite number over "
        "0 (infinity or NaN is refused at load); with regions it applies to each. Unset: the threshold chosen at "
        "fit time (each region's own) "
        "(`gate fit --labelled ... --max-escape`); skip_ok needs one or the other.")
    audit_every: int = Field(
        50, ge=1, le=1_000_000, description="skip_ok: 1 in N gated frames still goes to the language model as "
        "an audit (with a program's regions, also 1 in N frames sent on whose other regions the gate would answer: "
        "asked whole); when it disagrees (calls the part NOK, or a region the gate would have answered) the "
        "disagreement is counted and shown. 1 audits every gated frame (no call saved).")
    max_bank_mb: float = Field(
        256, gt=0, le=65536, allow_inf_nan=False, description="Memory bound of the loaded bank (vectors and "
        "search index); a larger bank is refused at load with one line.")
    search_threads: int = Field(
        1, ge=1, le=64, description="CPU threads of the bank's nearest-neighbour search. 1 keeps no thread "
        "team beside llama.cpp's CPU threads (right when the language model runs on the CPU); where it runs on a "
        "GPU, the CPU is free and the encoder takes milliseconds, so give the search the cores it has "
        "(docs/benchmarks.md: on the H200 one thread searched 10,000 patches in 388 ms, 25x the encode).")
    heat_map: bool = Field(True, description="Draw the per-patch distances over the evidence image.")
    verdict: dict[str, Any] | None = Field(
        None, description="skip_ok: the verdict a gated frame carries, checked against the verdict schema at "
        "load. Unset: the schema's NOK field false and each string field whose enum holds \"none\" set to "
        "it; a schema that needs more (e.g. a required confidence) is refused until this is set.")

    @model_validator(mode="after")
    def _bank_when_on(self) -> GateConfig:
        if self.mode != "off" and not self.bank:
            raise ValueError(f"gate.mode {self.mode} needs gate.bank (the file `edge-runtime gate fit` wrote)")
        return self
