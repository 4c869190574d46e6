"""The checks of a format-2 bundle (a llama.cpp language GGUF + its mmproj GGUF), run by `load_bundle`.

Files are plain names inside the folder, their sha256 match, both headers are walked by the bounded
reader (never by llama.cpp), the mmproj fits the language model and agrees with bundle.yaml, and the
prompt template is one the engine can fill in. Every failure is one BundleError sentence.
"""

from __future__ import annotations

import string
from pathlib import Path

from edge_runtime.core.bundle.gguf_header import GGUFHeader, read_header
from edge_runtime.core.bundle.mmproj import PairFit, check_pair, quantization
from edge_runtime.core.errors import BundleError

PLACEHOLDERS = ("system", "image", "prompt")


def check_pair_fit(language: Path, mmproj: Path, projector: str, embedding_dim: int, template: str,
                   manifest_path: Path) -> str:
    """The two headers fit each other and what bundle.yaml says of them; returns the LM's quantization."""
    lm, mm = read_header(language), read_header(mmproj)
    fit = check_pair(lm, mm)
    if fit.projector != projector:
        raise BundleError(f"{mmproj} is a {fit.projector} projector, but bundle.yaml says "
                          f"mtmd.projector {projector!r}")
    if fit.embedding_dim != embedding_dim:
        raise BundleError(f"{language} takes embeddings {fit.embedding_dim} wide, but bundle.yaml "
                          f"says mtmd.embedding_dim {embedding_dim}")
    check_prompt_template(template, f"{manifest_path}: prompt.template")
    return quantization(lm)


def check_prompt_template(template: str, where: str) -> None:
    """A template str.format can fill with system, image and prompt, holding {image} exactly once."""
    fields = []
    try:
        for _, name, spec, conv in string.Formatter().parse(template):
            if name is not None:
                if name not in PLACEHOLDERS or spec or conv:
                    raise BundleError(f"{where} has a placeholder {{{name[:40]}}}; only {{system}}, {{image}} "
                                      "and {prompt} are allowed (write a literal brace as {{ or }})")
                fields.append(name)
    except ValueError as exc:
        raise BundleError(f"{where} is not a valid template: {exc} (write a literal brace as {{{{ or }}}})") from None
    if fields.count("image") != 1 or fields.count("prompt") != 1 or fields.count("system") > 1:
        raise BundleError(f"{where} must hold {{image}} and {{prompt}} exactly once each and {{system}} at most "
                          f"once (it has image {fields.count('image')}, prompt {fields.count('prompt')}, "
                          f"system {fields.count('system')})")


def read_pair(language: Path, mmproj: Path) -> tuple[GGUFHeader, GGUFHeader, PairFit]:
    """Both headers and their fit, for `models import` (the same checks as a bundle's)."""
    lm, mm = read_header(language, keep=frozenset({"tokenizer.ggml.tokens"})), read_header(mmproj)
    return lm, mm, check_pair(lm, mm)
