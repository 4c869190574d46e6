"""`gate fit --camera` under the camera's program's image token budget (issue 42), on the tiny Qwen2.5-VL
pair (libmtmd, dynamic resolution): the good parts are encoded at the budget the daemon encodes the
camera's frames at, the bank records it, such a bank scores the daemon's frames, and a bank of another
budget is refused in one line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import cv2
import pytest

from edge_runtime.config import CameraConfig, Config, ImageLimits, ProgramConfig
from edge_runtime.config.gate import GateConfig
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.core.inspection_queue import InspectionRequest
from edge_runtime.evaluation.gate_fit import FitOptions, fit_gate
from edge_runtime.inference.anomaly.bank import read_headers
from edge_runtime.inference.anomaly.loading import GateLoadError, load_gates
from edge_runtime.inference.anomaly.step import GateStep
from edge_runtime.inference.inspector import Inspector
from tests.support.parts import clean_part
from tests.support.tiny_pairs import TinyPair, write_pair_bundle

FEW = {"image_tokens": {"max": 16}}


def camera(gate: GateConfig | None = None, program: str | None = "few") -> CameraConfig:
    return CameraConfig(name="belt", source="/tmp", kind="folder", program=program, gate=gate)


@pytest.fixture(scope="module")
def fitted(tiny_pairs: Callable[[str], TinyPair], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the bundle, a bank fitted by `gate fit DIR OUT --camera belt` under the program's 16 tokens)."""
    tmp = tmp_path_factory.mktemp("gate-budget")
    bundle = write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp / "q", image_max_tokens=256)
    parts = tmp / "ok"
    parts.mkdir()
    for s in range(10):
        cv2.imwrite(str(parts / f"part-{s:02d}.png"), clean_part(s))
    cfg = Config(device_id="t", programs={"few": ProgramConfig.model_validate(FEW)}, cameras=[camera()])
    cfg.model.threads = 2
    out = tmp / "few.bank"
    fit_gate(cfg, FitOptions(images=parts, out=out, model=str(bundle), camera="belt", progress=False))
    return bundle, out


def test_gate_fit_encodes_at_the_programs_budget_and_the_bank_records_it(fitted: tuple[Path, Path]) -> None:
    (header,) = read_headers(fitted[1])
    assert header.budget == {"image_max_tokens": 256, "image_tokens": {"min": None, "max": 16}}
    patches = sum(r * c for r, c in header.layout.grid)
    assert patches <= 16  # a 224x224 part is 64 tokens at the bundle's budget


def test_a_bank_fitted_under_the_budget_scores_the_daemons_frames_and_another_budget_is_refused(
        fitted: tuple[Path, Path]) -> None:
    bundle, bank = fitted
    settings = Config(device_id="t").model.model_copy(update={"threads": 2, "warmup": False})
    ins = Inspector(load_bundle(bundle), settings, "t")
    try:
        few = ProgramConfig.model_validate(FEW)
        ins.use_programs({"few": few}, [camera()], ImageLimits())
        gate = GateConfig(mode="annotate", bank=str(bank), threshold=1.0)
        step = GateStep()
        step.install(load_gates(ins.bundle, ins.settings, [camera(gate)], programs={"belt": few}))
        frame = clean_part(500)
        request = InspectionRequest(image=frame, camera="belt")
        step.sift([(request, ins.encode_frame("belt", frame))], ins, None, lambda _r, res: res,
                  lambda _r, exc: pytest.fail(str(exc)))
        counts = step.counts()["belt"]
        assert (counts.errors, counts.gated + counts.passed) == (0, 1)  # the same patch grid as the fit's
        for program, why in ((None, r'\{"image_tokens": null\} now'),
                             (ProgramConfig.model_validate({"image_tokens": {"max": 24}}), r'"max": 24.* now')):
            with pytest.raises(GateLoadError, match=rf"^cameras\.belt\.gate: gate bank .*another image budget "
                               rf"\(image_tokens: .*\"max\": 16.* in the bank, .*{why}") as err:
                load_gates(ins.bundle, ins.settings, [camera(gate)],
                           programs={} if program is None else {"belt": program})
            assert "\n" not in str(err.value)
    finally:
        ins.close()
