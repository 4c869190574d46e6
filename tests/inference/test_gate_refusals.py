"""Gate settings the daemon refuses at load (one line naming the field) and values it never lets into
JSON: a non-finite threshold or score, a NOK gated verdict, a bank that is not a regular file, a bank
of another image budget than the camera's program, a whole-frame bank on a program with regions or tiling
(tests/inference/test_gate_regions.py: banks of other regions)."""

from __future__ import annotations

import functools
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.config import CameraConfig
from edge_runtime.config.gate import GateConfig
from edge_runtime.config.programs import ImageTokens, ProgramConfig, RegionConfig, TilingConfig
from edge_runtime.config.schema import ConfigError, load_config, parse_config
from edge_runtime.core.batch import Encoded
from edge_runtime.core.bundle.manifest import Bundle
from edge_runtime.core.inspection_queue import InspectionRequest
from edge_runtime.inference.anomaly import gate_context, patch_features, write_bank
from edge_runtime.inference.anomaly.fit import bank_header, fit_bank
from edge_runtime.inference.anomaly.loading import GateLoadError, load_gates
from edge_runtime.inference.anomaly.step import GateStep
from edge_runtime.inference.inspector import Inspector
from tests.support.parts import clean_part


@pytest.fixture(scope="module")
def bank(inspector: Inspector, demo_bundle: Bundle, tmp_path_factory: pytest.TempPathFactory) -> Path:
    context = gate_context(demo_bundle, inspector.settings)
    feats = [patch_features(inspector.encode(clean_part(s)), context) for s in range(6)]
    fit = fit_bank(feats)
    path = tmp_path_factory.mktemp("gate") / "parts.bank"
    write_bank(path, bank_header(fit, context, feats[0]), fit.vectors)
    return path

OK = {"defect": False, "category": "none", "confidence": 1, "notes": "surface clean"}


def belt(gate: GateConfig) -> CameraConfig:
    return CameraConfig(name="belt", source="/tmp", kind="folder", gate=gate)


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "-1", "0"])
def test_a_threshold_that_is_not_a_finite_number_over_zero_is_refused_naming_the_field(value: str) -> None:
    text = (f"cameras:\n  - name: belt\n    source: /tmp\n    kind: folder\n"
            f"    gate: {{mode: skip_ok, bank: /tmp/a.bank, threshold: {value}}}\n")
    with pytest.raises(ConfigError, match=r"cameras\.0\.gate\.threshold: ") as err:
        parse_config(text, "c.yaml")
    assert "\n" not in str(err.value)


def test_a_frame_with_non_finite_embeddings_is_an_error_sent_on_never_a_score_in_json(
        inspector: Inspector, demo_bundle: Bundle, bank: Path) -> None:
    step = GateStep()
    step.install(load_gates(demo_bundle, inspector.settings,
                            [belt(GateConfig(mode="annotate", bank=str(bank), threshold=1.0))]))
    enc = inspector.encode(clean_part(3))
    bad = Encoded(np.full_like(enc.embeds, np.nan), enc.width, enc.height, 0.0, 0.0, enc.grid)
    request = InspectionRequest(image=clean_part(3), camera="belt")
    rest = step.sift([(request, bad)], inspector, None, lambda _r, res: res, lambda _r, _e: None)
    assert rest == [(request, bad)]
    counts = step.counts()["belt"]
    assert (counts.errors, counts.gated, counts.passed) == (1, 0, 0)
    json.dumps(step.status(), allow_nan=False)  # raises on Infinity / NaN


def test_a_skip_ok_gated_verdict_that_is_nok_by_the_nok_field_is_refused(
        inspector: Inspector, demo_bundle: Bundle, bank: Path) -> None:
    nok = {"defect": True, "category": "scratch", "confidence": 1, "notes": "scratch on the face"}
    gate = GateConfig(mode="skip_ok", bank=str(bank), threshold=1.0, verdict=nok)
    with pytest.raises(GateLoadError, match=r"^cameras\.belt\.gate\.verdict: .*'defect'.* false") as err:
        load_gates(demo_bundle, inspector.settings, [belt(gate)])
    assert "\n" not in str(err.value)
    ok = {"defect": False, "category": "none", "confidence": 1, "notes": "surface clean"}
    gate = GateConfig(mode="skip_ok", bank=str(bank), threshold=1.0, verdict=ok)
    assert load_gates(demo_bundle, inspector.settings, [belt(gate)])["belt"] is not None


def _within(seconds: float, call: Callable[[], object]) -> BaseException | None:
    """The exception `call` raised, run in a thread so that a hang fails the test instead of blocking it."""
    caught: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            caught.append(exc)
        else:
            caught.append(None)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert caught, f"still blocked after {seconds} s"
    return caught[0]


def test_a_gate_bank_that_is_a_fifo_is_refused_in_one_line_not_waited_on(
        inspector: Inspector, demo_bundle: Bundle, tmp_path: Path) -> None:
    fifo = tmp_path / "parts.bank"
    os.mkfifo(fifo)
    gate = GateConfig(mode="annotate", bank=str(fifo), threshold=1.0)
    err = _within(10, lambda: load_gates(demo_bundle, inspector.settings, [belt(gate)]))
    assert isinstance(err, GateLoadError) and "\n" not in str(err)
    assert str(err).startswith("cameras.belt.gate: ") and "not a regular file (a FIFO)" in str(err)


def test_a_reference_image_that_is_a_fifo_or_device_is_refused_in_one_line_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "golden.png"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/null")):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"programs:\n  housing:\n    references:\n      - {{image: {path}, caption: golden}}\n"
                       "cameras:\n  - {name: belt, source: x.png, program: housing}\n")
        err = _within(10, functools.partial(load_config, cfg))
        assert isinstance(err, ConfigError) and "\n" not in str(err)
        assert f"references.0.image {path}: not a regular file" in str(err), str(err)


def test_a_whole_frame_bank_on_a_camera_whose_program_has_regions_or_tiling_is_refused_in_one_line(
        inspector: Inspector, demo_bundle: Bundle, bank: Path) -> None:
    gate = GateConfig(mode="skip_ok", bank=str(bank), threshold=1.0, verdict=OK)
    cam = belt(gate).model_copy(update={"program": "housing"})
    for program in (ProgramConfig(regions=[RegionConfig(name="left", box=(0, 0, 100, 100))]),
                    ProgramConfig(tiling=TilingConfig(rows=2, cols=2))):
        with pytest.raises(GateLoadError, match=r"^cameras\.belt\.gate: gate bank .*holds whole frames; these "
                           r"frames are regions of a program: fit the gate again .*gate fit --camera") as err:
            load_gates(demo_bundle, inspector.settings, [cam], programs={"belt": program})
        assert "\n" not in str(err.value)
    assert load_gates(demo_bundle, inspector.settings, [cam], programs={"belt": ProgramConfig()})["belt"]


def test_a_bank_fitted_at_the_bundles_budget_is_refused_for_a_program_with_its_own_image_tokens(
        inspector: Inspector, demo_bundle: Bundle, bank: Path) -> None:
    gate = GateConfig(mode="annotate", bank=str(bank), threshold=1.0)
    program = ProgramConfig(image_tokens=ImageTokens(min=4, max=20))
    with pytest.raises(GateLoadError, match=r"^cameras\.belt\.gate: .*another image budget \(image_tokens: .*null.* "
                       r"in the bank, .*\{\"max\": 20, \"min\": 4\}\} now\)") as err:
        load_gates(demo_bundle, inspector.settings, [belt(gate)], programs={"belt": program})
    assert "\n" not in str(err.value)


def test_gate_search_threads_from_the_config_is_what_the_search_runs_on(
        inspector: Inspector, demo_bundle: Bundle, bank: Path) -> None:
    """gate.search_threads reaches faiss on the thread that scores (the encoder's), and a gate left at the
    default puts that thread back on one: the setting is per gate, not whatever ran last."""
    import threading

    import faiss

    wide = load_gates(demo_bundle, inspector.settings,
                      [belt(GateConfig(mode="annotate", bank=str(bank), threshold=1.0, search_threads=2))])["belt"]
    narrow = load_gates(demo_bundle, inspector.settings,
                        [belt(GateConfig(mode="annotate", bank=str(bank), threshold=1.0))])["belt"]
    assert wide is not None and narrow is not None
    enc = inspector.encode(clean_part(3))
    seen: list[int] = []

    def score() -> None:
        for gate in (wide, narrow, wide):
            gate.gate.score(enc)
            seen.append(faiss.omp_get_max_threads())

    worker = threading.Thread(target=score)
    worker.start()
    worker.join()
    assert seen == [2, 1, 2]
