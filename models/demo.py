"""Build the demo bundle: a tiny, deterministic vision-language model in the real bundle format.

Same bytes on every build (fixed seeds, no timestamps), so its checksums are stable and tests can
rely on it. Random weights: verdicts are schema-valid but meaningless (their notes are picked from a
fixed list of phrases) — it exists so the whole pipeline runs on a fresh machine with no download.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import onnx
import yaml

from edge_runtime.core.bundle.manifest import sha256_file
from edge_runtime.core.errors import BundleError

from .language_gguf import LanguageShape, write_language_model
from .tokenizer import train_bpe
from .vision_onnx import VisionShape, build_vision_model

DEMO_NAME = "edge-demo-vlm"
DEMO_VERSION = "1.0"
SEED = 20261130

VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "defect": {"type": "boolean", "description": "true when the part must be rejected"},
        "category": {
            "type": "string",
            "enum": ["none", "scratch", "dent", "crack", "stain", "missing_part", "misaligned", "other"],
        },
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "notes": {"type": "string", "maxLength": 60},
    },
    "required": ["defect", "category", "confidence", "notes"],
    "additionalProperties": False,
}

# The demo's random weights would fill a free-text field with noise: its notes are a short phrase
# from this list, so a demo verdict reads like an inspection (and still says nothing about the image).
DEMO_NOTES = ["surface clean", "scratch on the face", "dent near the rim", "crack at the bore", "stain on the surface",
              "part missing", "part misaligned", "needs a second look"]
DEMO_VERDICT_SCHEMA = {
    **VERDICT_SCHEMA,
    "properties": {**VERDICT_SCHEMA["properties"],
                   "notes": {"type": "string", "enum": DEMO_NOTES, "description": "a short finding"}},
}

SYSTEM_PROMPT = "You are a visual inspection assistant on a factory line. Answer only with JSON."
DEFAULT_PROMPT = (
    "Inspect the part in the image. Is there a defect? Give the category, your confidence "
    "and a short note."
)
# ChatML layout; {image} is where the image embeddings enter the sequence.
PROMPT_TEMPLATE = (
    "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n<image>{image}</image>\n"
    "{prompt}<|im_end|>\n<|im_start|>assistant\n"
)

# Text the tokenizer is trained on: the prompt, the schema's words and typical answers.
_CORPUS = "\n".join([
    SYSTEM_PROMPT, DEFAULT_PROMPT, json.dumps(DEMO_VERDICT_SCHEMA),
    '{"defect": false, "category": "none", "confidence": 0.93, "notes": "surface clean"}',
    '{"defect": true, "category": "scratch", "confidence": 0.71, "notes": "scratch near the left edge"}',
    '{"defect": true, "category": "missing_part", "confidence": 0.88, "notes": "screw missing"}',
    "system user assistant image inspection camera part defect label conveyor weld bolt",
] * 3)


@contextmanager
def bundle_workdir(out_dir: Path) -> Iterator[Path]:
    """A temporary folder beside `out_dir` that atomically replaces it when the block succeeds.
    `out_dir` is replaced whole, so it must be new, empty or a bundle folder: never a folder of
    other files (`models demo ~/` would otherwise delete the home folder)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise BundleError(f"{out_dir} exists and is not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "bundle.yaml").is_file():
        raise BundleError(f"{out_dir} is not empty and is not a bundle folder: the bundle replaces the whole "
                          "folder, so give a new or empty one")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".bundle-", dir=out_dir.parent))
    try:
        yield work
        if out_dir.exists():
            shutil.rmtree(out_dir)
        work.rename(out_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def write_manifest(work: Path, manifest: dict[str, Any], extra_files: dict[str, str] | None = None) -> None:
    """bundle.yaml with the checksums of the model files already in `work`."""
    files = {"vision": "vision.onnx", "language": "language.gguf"} | (extra_files or {})
    manifest["files"] = {role: {"path": name, "sha256": sha256_file(work / name)} for role, name in files.items()}
    order = ["format", "name", "version", "description", "files"]
    ordered = {k: manifest[k] for k in order} | {k: v for k, v in manifest.items() if k not in order}
    (work / "bundle.yaml").write_text(yaml.safe_dump(ordered, sort_keys=False, width=100))


def write_demo_language(path: Path, seed: int = SEED + 1, quant: str = "Q8_0", **shape: int) -> None:
    """The demo bundle's language model (`seed`, `shape` overrides: another model of its vocabulary,
    e.g. a draft for speculative decoding, or one of another vocabulary size with `vocab`)."""
    language = LanguageShape(**{"width": VisionShape().out_dim, **shape})
    write_language_model(path, language, train_bpe(_CORPUS, n_merges=240), seed, quant, name=DEMO_NAME)


def build_demo_bundle(out_dir: Path, quant: str = "Q8_0") -> Path:
    """Write the demo bundle into `out_dir` (replaced atomically) and return it."""
    vision = VisionShape()
    language = LanguageShape(width=vision.out_dim)

    out_dir = out_dir.expanduser().resolve()
    with bundle_workdir(out_dir) as work:
        onnx.save_model(build_vision_model(vision, SEED), str(work / "vision.onnx"))
        write_demo_language(work / "language.gguf", SEED + 1, quant)
        manifest = {
            "format": 1,
            "name": DEMO_NAME,
            "version": DEMO_VERSION,
            "description": "Tiny random-weight demo VLM generated by edge-runtime (not a real model).",
            "preprocess": {
                "width": vision.image_size,
                "height": vision.image_size,
                "resize": "area",
                "keep_aspect": False,
                "mean": [0.485, 0.456, 0.406],
                "std": [0.229, 0.224, 0.225],
                "clahe": None,
            },
            "vision": {"input": "pixel_values", "output": "image_embeds",
                       "image_tokens": vision.tokens, "embedding_dim": vision.out_dim},
            "language": {"embedding_dim": language.width, "quantization": quant,
                         "context_length": language.context},
            "prompt": {"template": PROMPT_TEMPLATE, "system": SYSTEM_PROMPT,
                       "default": DEFAULT_PROMPT},
            "verdict_schema": DEMO_VERDICT_SCHEMA,
            "generation": {"max_tokens": 160},
        }
        write_manifest(work, manifest)
    return out_dir
