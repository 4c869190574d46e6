"""The anomaly gate on an inspection program's regions (issue 42), with the demo bundle's real encoder
(ONNX Runtime) and language model (llama.cpp): `gate fit --camera` fits one bank section per region
on that region's crops, each region's crop is scored against its own section (a defect in one region
puts that region, and only it, over its threshold), skip_ok asks the language model only about the
regions over their threshold, the crops are encoded once for the gate and the model, and a bank of
other regions or of whole frames is refused in one line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edge_runtime.config import CameraConfig, Config, ImageLimits, ProgramConfig
from edge_runtime.config.gate import GateConfig
from edge_runtime.core.batch import BatchJob
from edge_runtime.core.bundle.manifest import Bundle
from edge_runtime.core.inspection_queue import InspectionRequest
from edge_runtime.core.result import FrameInfo, Result
from edge_runtime.evaluation.gate_fit import FitOptions, fit_gate
from edge_runtime.inference.anomaly.bank import read_headers
from edge_runtime.inference.anomaly.loading import GateLoadError, load_gates
from edge_runtime.inference.anomaly.step import GateStep
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.regions import RegionsEncoded
from tests.support.parts import clean_part

OK = {"defect": False, "category": "none", "confidence": 1, "notes": "surface clean"}
HALVES = {"regions": [{"name": "left", "box": [0, 0, 112, 224]}, {"name": "right", "box": [112, 0, 112, 224]}]}
CENTRES = {"left": (56, 112), "right": (168, 112)}


def program(spec: dict[str, Any] = HALVES) -> ProgramConfig:
    return ProgramConfig.model_validate(spec)


def belt(gate: GateConfig | None = None, name: str = "halves") -> CameraConfig:
    return CameraConfig(name="belt", source="/tmp", kind="folder", program=name, gate=gate)


def stained(seed: int, region: str) -> np.ndarray:
    """A good part with a dark stain of 24 px drawn in the middle of `region`."""
    img = clean_part(seed).copy()
    cv2.circle(img, CENTRES[region], 12, (25, 30, 35), -1)
    return img


@pytest.fixture(scope="module")
def bank(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bank fitted by `gate fit DIR OUT --camera belt` on 40 good parts (8 held out)."""
    tmp = tmp_path_factory.mktemp("gate-regions")
    for s in range(40):
        cv2.imwrite(str(tmp / f"part-{s:02d}.png"), clean_part(s))
    cfg = Config(device_id="t", programs={"halves": program()}, cameras=[belt()])
    cfg.model.threads = 2
    out = tmp / "halves.bank"
    fit_gate(cfg, FitOptions(images=tmp, out=out, model=str(demo_dir), camera="belt", progress=False))
    return out


@pytest.fixture(scope="module")
def ins(demo_bundle: Bundle, config: Config) -> Iterator[Inspector]:
    # The encoder cache off: an encode counted below is a real one, never a cache hit.
    settings = config.model.model_copy(update={"warmup": False, "encoder_cache_mb": 0})
    inspector = Inspector(demo_bundle, settings, config.device_id)
    inspector.use_programs({"halves": program()}, [belt()], ImageLimits())
    yield inspector
    inspector.close()


def step_for(ins: Inspector, bank: Path, mode: str = "annotate", **gate: Any) -> GateStep:
    step = GateStep()
    cfg = GateConfig(mode=mode, bank=str(bank), verdict=OK, audit_every=1000, **gate)
    step.install(load_gates(ins.bundle, ins.settings, [belt(cfg)], {"belt": "defect"},
                            programs={"belt": program()}))
    return step


def look(step: GateStep, ins: Inspector, frame: np.ndarray) -> tuple[InspectionRequest, Any]:
    """The frame through the gate as the worker hands it over: (the request, what goes on to the model)."""
    request = InspectionRequest(image=frame, camera="belt")
    rest = step.sift([(request, ins.encode_frame("belt", frame))], ins, None, lambda _r, res: res,
                     lambda _r, exc: pytest.fail(str(exc)))
    return request, rest[0][1] if rest else None


def model_result() -> Result:
    """A Result as the language model makes one, for the gate to annotate."""
    return Result(device="t", camera="belt", frame=FrameInfo(0, 224, 224), verdict=dict(OK), text="", model="m",
                  timings_ms={}, prompt="p")


def test_gate_fit_on_a_program_writes_one_section_per_region_with_its_box_and_threshold(bank: Path) -> None:
    headers = read_headers(bank)
    assert [(h.part.name, h.part.box, h.part.index, h.part.count, h.part.frame) for h in headers if h.part] == [
        ("left", (0, 0, 112, 224), 0, 2, (224, 224)), ("right", (112, 0, 112, 224), 1, 2, (224, 224))]
    assert [(h.layout.width, h.layout.height) for h in headers] == [(112, 224), (112, 224)]  # each region's crop
    assert all(h.threshold.value and h.fit["held_out"]["images"] == 8 for h in headers)


@pytest.mark.parametrize("region", ["left", "right"])
def test_a_defect_in_one_region_puts_that_region_and_only_it_over_its_threshold(
        ins: Inspector, bank: Path, region: str) -> None:
    step = step_for(ins, bank)
    request, _ = look(step, ins, stained(700, region))
    result = step.annotate(request, model_result())
    assert result.gate is not None and result.gate["gated"] is False
    over = {r["name"]: r["score"] >= r["threshold"] for r in result.gate["regions"]}
    assert over == {"left": region == "left", "right": region == "right"}, result.gate["regions"]
    x0, _, x1, _ = result.gate["worst_box"]  # in the frame's pixels: inside the stained half
    assert (x0 + x1) / 2 < 112 if region == "left" else (x0 + x1) / 2 > 112


def test_the_heat_map_is_drawn_over_each_region_and_hottest_over_the_defect(ins: Inspector, bank: Path) -> None:
    step = step_for(ins, bank)
    step.heat_wanted = True
    frame = stained(701, "right")
    request, _ = look(step, ins, frame)
    result = step.annotate(request, model_result())
    drawn = step.overlay(frame, result).astype(int)
    change = np.abs(drawn - frame.astype(int)).sum(axis=2)
    assert change[:, 112:].sum() > 5 * max(1, change[:, :112].sum())  # the right half coloured, the left not
    y, x = np.unravel_index(np.argmax(change), change.shape)
    assert abs(x - 168) < 40 and abs(y - 112) < 40


def test_skip_ok_answers_a_frame_whose_every_region_is_under_its_threshold(ins: Inspector, bank: Path) -> None:
    step = step_for(ins, bank, mode="skip_ok")
    delivered: list[Result] = []

    def deliver(_request: InspectionRequest, result: Result) -> Result:
        delivered.append(result)
        return result

    frame = clean_part(702)
    request = InspectionRequest(image=frame, camera="belt")
    rest = step.sift([(request, ins.encode_frame("belt", frame))], ins, None, deliver,
                     lambda _r, exc: pytest.fail(str(exc)))
    assert rest == [] and len(delivered) == 1
    result = delivered[0]
    assert result.source["engine"] == "gate" and result.verdict == OK
    assert [(r["name"], r["outcome"], r.get("engine")) for r in result.regions or []] == [
        ("left", "ok", "gate"), ("right", "ok", "gate")]
    assert step.counts()["belt"].skipped == 1


def test_skip_ok_asks_the_model_only_about_the_regions_over_their_threshold_from_one_encode(
        ins: Inspector, bank: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    encodes: list[tuple[int, int]] = []
    real = ins.encoder.encode_uncached

    def counted(frame: np.ndarray, tokens: Any = None) -> Any:
        encodes.append((frame.shape[1], frame.shape[0]))
        return real(frame, tokens)

    monkeypatch.setattr(ins.encoder, "encode_uncached", counted)
    step = step_for(ins, bank, mode="skip_ok")
    _, encoded = look(step, ins, stained(703, "left"))
    assert isinstance(encoded, RegionsEncoded) and list(encoded.answered) == [1]  # right: the gate's OK
    result = ins.inspect_batch([BatchJob(encoded, "belt")])[0]
    assert isinstance(result, Result) and result.regions is not None
    left, right = result.regions
    assert right["engine"] == "gate" and right["verdict"] == OK and right["text"] == json.dumps(
        OK, separators=(",", ":"))
    assert "engine" not in left and left["text"] != right["text"]  # the language model's answer
    assert encodes == [(112, 224), (112, 224)]  # each region's crop encoded once, for the gate and the model
    assert step.counts()["belt"].regions_answered == 1


def test_regions_the_gate_answers_in_a_frame_sent_on_are_audited_one_in_n(ins: Inspector, bank: Path) -> None:
    """skip_ok answers the regions under their threshold of a frame it sends on for its others: 1 in
    audit_every of those frames is asked whole instead (gate.audit), or a region that is always over its
    threshold would keep the gate's answers for the others from ever being checked. A NOK the model finds
    in a region the gate would have answered is a disagreement; one in the region over its threshold is not."""
    step = GateStep()
    cfg = GateConfig(mode="skip_ok", bank=str(bank), verdict=OK, audit_every=2)
    step.install(load_gates(ins.bundle, ins.settings, [belt(cfg)], {"belt": "defect"}, programs={"belt": program()}))
    frame = stained(703, "left")  # left over its threshold, right under (the test above)
    sent = [look(step, ins, frame) for _ in range(4)]
    assert [list(enc.answered) for _, enc in sent] == [[1], [], [1], []]  # the 2nd and 4th: audits

    def asked(nok: str) -> Result:
        result = model_result()
        result.verdict = {**OK, "defect": True}
        result.regions = [{"name": n, "box": [0, 0, 1, 1], "verdict": {**OK, "defect": n == nok}, "text": "",
                           "outcome": "nok" if n == nok else "ok", "error": None} for n in ("left", "right")]
        return result

    first = step.annotate(sent[1][0], asked("left"))  # the model agrees: only the region over its threshold
    second = step.annotate(sent[3][0], asked("right"))  # a region the gate would have called OK is NOK
    assert first.gate is not None and first.gate["audit"] and first.gate["disagree"] is False
    assert second.gate is not None and second.gate["audit"] and second.gate["disagree"] is True
    counts = step.counts()["belt"]
    assert (counts.audits, counts.disagreements, counts.regions_answered) == (2, 1, 2)
    assert counts.last_disagreement == second.id


def test_a_frame_with_a_region_the_bank_has_no_section_for_is_never_gated(ins: Inspector, bank: Path) -> None:
    """A frame encoded under a program with one more region than the bank's (a reload adds a region
    while the old gates still run): that region was never scored, so it is not under any threshold and
    the frame is not answered OK; it goes to the language model and counts as a gate error."""
    from edge_runtime.inference.regions import RegionSpec

    step = step_for(ins, bank, mode="skip_ok")
    frame = clean_part(702)  # gated when cut into the bank's two halves (the test above)
    encoded = ins.encode_frame("belt", frame)
    assert isinstance(encoded, RegionsEncoded)
    middle = (56, 0, 112, 224)
    encoded.regions.append((RegionSpec("middle", middle), ins.encode(frame, crop=middle)))
    request = InspectionRequest(image=frame, camera="belt")
    rest = step.sift([(request, encoded)], ins, None, lambda _r, res: pytest.fail(f"answered {res.verdict}"),
                     lambda _r, exc: pytest.fail(str(exc)))
    assert [r for r, _ in rest] == [request] and not rest[0][1].answered  # type: ignore[union-attr]
    assert step.counts()["belt"].skipped == 0 and step.counts()["belt"].errors == 1


def test_a_bank_of_other_regions_or_of_whole_frames_is_refused_in_one_line(
        ins: Inspector, bank: Path, tmp_path: Path) -> None:
    gate = GateConfig(mode="annotate", bank=str(bank), threshold=1.0)
    moved = {"regions": [{"name": "left", "box": [0, 0, 100, 224]}, {"name": "right", "box": [112, 0, 112, 224]}]}
    renamed = {"regions": [{"name": "screw", "box": [0, 0, 112, 224]}, {"name": "right", "box": [112, 0, 112, 224]}]}
    cases = [(moved, r"fitted on region left \[0, 0, 112, 224\], but these frames are region left \[0, 0, 100, 224\]"),
             (renamed, r"holds regions left, right; these frames are regions screw, right"),
             ({}, r"holds regions left, right; these frames are whole frames")]
    for spec, why in cases:
        with pytest.raises(GateLoadError, match=rf"^cameras\.belt\.gate: gate bank .*{why}") as err:
            load_gates(ins.bundle, ins.settings, [belt(gate)], programs={"belt": program(spec)})
        assert "\n" not in str(err.value)


def test_a_line_recipes_own_gate_loads_against_the_recipes_program(
        ins: Inspector, bank: Path) -> None:
    """The camera has no program; the recipe names the two-region one: its gate is the regions' bank."""
    from edge_runtime.config.line_io import LineIOConfig
    from edge_runtime.inference.anomaly.step import gates_for

    schema_ok = {"mode": "skip_ok", "bank": str(bank), "audit_every": 1000, "verdict": OK}
    cfg = Config(device_id="t", programs={"halves": program()},
                 cameras=[CameraConfig(name="cam", source="/tmp", kind="folder")])
    station = {"name": "st1", "camera": "cam", "result_deadline_ms": 60_000,
               "nok_when": [{"field": "verdict.defect", "equals": True}],
               "recipes": {"housing": {"program": "halves", "gate": schema_ok}}}
    cfg.line_io = LineIOConfig.model_validate({"stations": [station]})
    loaded = gates_for(ins.bundle, cfg)["st1/housing"]
    assert loaded is not None and [r.name for r in loaded.regions] == ["left", "right"]
