"""Realistic-shape bundles for benchmarks: random weights, the shapes of real edge VLMs.

A SigLIP-base-like encoder (patch 16, width 768, 12 blocks) with a projector, and Qwen2.5-0.5B/1.5B-
shaped llama decoders quantized Q4_K_M by llama.cpp's own quantizer. Built on request; never in git.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

from .catalog import BENCH_BUNDLE_NAMES
from .demo import (
    _CORPUS,
    DEFAULT_PROMPT,
    PROMPT_TEMPLATE,
    SYSTEM_PROMPT,
    VERDICT_SCHEMA,
    bundle_workdir,
    write_manifest,
)
from .language_gguf import LanguageShape, write_language_model
from .tokenizer import train_bpe
from .vision_onnx import VisionShape, build_vision_model

LANGUAGE_SHAPES = {
    # Qwen2.5 shapes (config.json of the public checkpoints).
    "qwen0.5b": LanguageShape(width=896, layers=24, heads=14, kv_heads=2, ffn=4864, context=4096, vocab=151936),
    "qwen1.5b": LanguageShape(width=1536, layers=28, heads=12, kv_heads=2, ffn=8960, context=4096, vocab=151936),
}
VISION_SIZES = {"siglip224": 224, "siglip384": 384}


@dataclass(frozen=True)
class BenchBundle:
    vision: str
    language: str

    @property
    def name(self) -> str:
        return f"{self.vision}-{self.language}"


BENCH_BUNDLES = {b.name: b for b in (BenchBundle(*name.split("-")) for name in BENCH_BUNDLE_NAMES)}


def quantize_gguf(src: Path, dst: Path, ftype: int = 15, threads: int = 0) -> None:
    """llama.cpp's quantizer (15 = Q4_K_M); rows that K-quants cannot take fall back as llama.cpp decides."""
    from edge_runtime.engines import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed with code {rc}")


def build_bench_bundle(name: str, out_dir: Path, seed: int = 7) -> Path:
    spec = BENCH_BUNDLES[name]
    lang = LANGUAGE_SHAPES[spec.language]
    vision = VisionShape(image_size=VISION_SIZES[spec.vision], patch=16, width=768, heads=12, blocks=12, mlp=3072,
                         out_dim=lang.width)
    out_dir = out_dir.expanduser().resolve()
    with bundle_workdir(out_dir) as work:
        onnx.save_model(build_vision_model(vision, seed), str(work / "vision.onnx"))
        f16 = work / "language-f16.gguf"
        write_language_model(f16, lang, train_bpe(_CORPUS, n_merges=240), seed + 1, "F16", name=name)
        quantize_gguf(f16, work / "language.gguf")
        f16.unlink()
        manifest = {
            "format": 1, "name": name, "version": "bench",
            "description": f"Random weights in the shape of {spec.vision} + {spec.language} (benchmarks only).",
            "preprocess": {"width": vision.image_size, "height": vision.image_size, "resize": "cubic",
                           "keep_aspect": False, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "clahe": None},
            "vision": {"input": "pixel_values", "output": "image_embeds", "image_tokens": vision.tokens,
                       "embedding_dim": lang.width},
            "language": {"embedding_dim": lang.width, "quantization": "Q4_K_M", "context_length": lang.context},
            "prompt": {"template": PROMPT_TEMPLATE, "system": SYSTEM_PROMPT, "default": DEFAULT_PROMPT},
            "verdict_schema": VERDICT_SCHEMA,
            "generation": {"max_tokens": 160},
        }
        write_manifest(work, manifest)
    return out_dir
