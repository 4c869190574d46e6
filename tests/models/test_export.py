"""`models export`: tiny random checkpoints of each supported family, exported and compared with
transformers' own forward pass on the same image and prompt (docs/models.md states the tolerance)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import cv2
import jsonschema
import numpy as np
import pytest
import torch
from edge_runtime_models.export import ExportError, export_checkpoint
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from edge_runtime.cli.main import main
from edge_runtime.config import ModelConfig
from edge_runtime.core.bundle.manifest import Bundle, load_bundle
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.picker import Sampling
from tests.support.tiny_vlms import build_idefics3, build_llava

# The tolerances we hold exported F32 bundles to (docs/models.md): first-token logits within this
# much of transformers', relative to the largest logit, with the KV cache in f32 and in f16 (the default).
LOGIT_TOLERANCE = {"f32": 1e-5, "f16": 1e-2}
GREEDY_STEPS = 12
QUESTION = "Is the weld seam continuous?"
RAW = Sampling(valid_utf8=False)  # compare raw token streams, as transformers' generate() produces them


@dataclass
class Family:
    checkpoint: Path
    f32: Bundle


def _frame(width: int, height: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
    return cv2.resize(small, (width, height), interpolation=cv2.INTER_LINEAR)  # BGR, smooth enough to resize


@pytest.fixture(scope="module", params=["llava", "idefics3"])
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Family:
    work = tmp_path_factory.mktemp(request.param)
    build = build_llava if request.param == "llava" else build_idefics3
    checkpoint = build(work / "checkpoint")
    report = export_checkpoint(checkpoint, work / "bundle-f32", "F32", progress=False)
    return Family(checkpoint, load_bundle(report.out_dir))


def _inspector(bundle: Bundle, **settings: object) -> Inspector:
    return Inspector(bundle, ModelConfig(threads=2, warmup=False, **settings), "test")


def _reference(checkpoint: Path, bundle: Bundle, frame: np.ndarray) -> dict[str, object]:
    """transformers on the same picture and the same prompt text (the bundle's template)."""
    model = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(checkpoint)
    p = bundle.manifest.prompt
    layout = bundle.onnx_manifest.vision.layout
    assert layout is not None
    text = p.template.format(system=p.system, image=layout.image_token, prompt=QUESTION)
    rgb = Image.fromarray(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
    inputs = processor(text=text, images=rgb, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        logits = model(**inputs).logits[0, -1].numpy()
        n = inputs["input_ids"].shape[1]
        tokens = model.generate(**inputs, max_new_tokens=GREEDY_STEPS, do_sample=False, min_new_tokens=GREEDY_STEPS)
    return {"ids": inputs["input_ids"][0].tolist(), "pixels": inputs["pixel_values"].numpy(), "logits": logits,
            "tokens": tokens[0, n:].tolist()}


def _our_ids(inspector: Inspector, prefix: list[int], image: object, suffix: list[int]) -> list[int]:
    ids, image_token = list(prefix), inspector.prompts.image_token
    for seg in image if isinstance(image, list) else [image]:
        ids += [image_token] * len(seg) if isinstance(seg, np.ndarray) else list(cast(Iterable[int], seg))
    return ids + list(suffix)


@pytest.mark.parametrize("kv_cache_type", ["f32", "f16"])
def test_exported_bundle_computes_what_transformers_computes(family: Family, kv_cache_type: str) -> None:
    frame = _frame(160, 120, seed=5)  # 4:3, so the idefics3 family tiles it (2x2 grid + global image)
    ref = _reference(family.checkpoint, family.f32, frame)
    inspector = _inspector(family.f32, kv_cache_type=kv_cache_type)
    try:
        assert inspector.preprocessor is not None  # an ONNX-encoder bundle always has one
        pixels, grid = inspector.preprocessor.process(frame)
        enc = inspector.encode(frame)
        prefix, image, suffix = inspector.sequence(QUESTION, enc)
        assert _our_ids(inspector, prefix, image, suffix) == ref["ids"]  # same tokens, image tokens included
        ref_pixels = np.asarray(ref["pixels"]).reshape(pixels.shape)
        np.testing.assert_allclose(pixels, ref_pixels, atol=1e-5)  # same preprocessing, tiles included
        logits = inspector.language.prompt_logits(prefix, image, suffix)
        ref_logits = np.asarray(ref["logits"])
        scale = float(np.abs(ref_logits).max())
        assert scale > 1.0  # the tiny model's logits are spread enough for the tolerance to mean something
        worst = float(np.abs(logits[: ref_logits.shape[0]] - ref_logits).max()) / scale
        print(f"max |logit difference| / max |logit|: {worst:.2e} (scale {scale:.2f})")
        assert worst <= LOGIT_TOLERANCE[kv_cache_type]
        gen = inspector.generate(prefix, image, suffix, None, GREEDY_STEPS, RAW)
        assert gen.token_ids == ref["tokens"]
        if family.f32.onnx_manifest.preprocess.tiling is not None:
            assert grid == (2, 2)
    finally:
        inspector.close()


def test_q8_0_keeps_the_first_greedy_tokens(family: Family, tmp_path: Path) -> None:
    frame = _frame(160, 120, seed=6)
    q8 = load_bundle(export_checkpoint(family.checkpoint, tmp_path / "q8", "Q8_0", progress=False).out_dir)
    tokens = []
    for bundle in (family.f32, q8):
        inspector = _inspector(bundle)
        try:
            prefix, image, suffix = inspector.sequence(QUESTION, inspector.encode(frame))
            tokens.append(inspector.generate(prefix, image, suffix, None, 4, RAW).token_ids)
        finally:
            inspector.close()
    assert tokens[1][:3] == tokens[0][:3]


def test_q4_k_m_bundle_gives_schema_valid_verdicts(family: Family, tmp_path: Path) -> None:
    bundle = load_bundle(export_checkpoint(family.checkpoint, tmp_path / "q4", progress=False).out_dir)
    assert bundle.onnx_manifest.language.quantization == "Q4_K_M"
    inspector = _inspector(bundle)
    try:
        for seed in range(3):
            result = inspector.inspect(_frame(320, 240, seed=seed))
            jsonschema.validate(json.loads(result.text, strict=True), bundle.manifest.verdict_schema)
    finally:
        inspector.close()


def test_fp16_encoder_is_close_to_fp32_and_selected_by_config(family: Family) -> None:
    frame = _frame(160, 120, seed=7)
    embeds = []
    for precision in ("fp32", "fp16"):
        inspector = _inspector(family.f32, vision_precision=precision)
        try:
            embeds.append(inspector.encode(frame).embeds)
        finally:
            inspector.close()
    assert not np.array_equal(embeds[0], embeds[1])  # the fp16 file really was used
    np.testing.assert_allclose(embeds[1], embeds[0], atol=2e-2 * float(np.abs(embeds[0]).max()))


def test_unsupported_architecture_is_named_with_what_is_supported(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FooVLForConditionalGeneration"]}))
    with pytest.raises(ExportError, match=r"FooVLForConditionalGeneration is not a supported architecture; "
                                          r"supported: .*LlavaForConditionalGeneration"):
        export_checkpoint(tmp_path, tmp_path / "out", progress=False)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["KimiVLForConditionalGeneration"]}))
    with pytest.raises(ExportError, match="MoonViT"):
        export_checkpoint(tmp_path, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_export_command_writes_a_verified_bundle(family: Family, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bundle"
    assert main(["models", "export", str(family.checkpoint), str(out), "--quant", "Q8_0", "--quiet",
                 "--name", "line-3-vlm"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["name"] == "line-3-vlm" and report["quantization"] == "Q8_0"
    assert main(["models", "verify", str(out)]) == 0
    assert main(["models", "export", str(tmp_path / "nowhere"), str(tmp_path / "x")]) == 2
    assert "has no config.json" in capsys.readouterr().err
