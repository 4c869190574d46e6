"""The checks of a format-2 bundle (a llama.cpp language GGUF + its mmproj GGUF), run by `load_bundle`.

Files are plain names inside the folder, their sha256 match, both headers are walked by the bounded
reader (never by llama.cpp), the mmproj fits the language model and agrees with bundle.yaml, and the
prompt template is one the engine can fill in. Every failure is one BundleError sentence.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import TYPE_CHECKING

from edge_runtime.core.errors import BundleError
from edge_runtime.core.gguf_header import GGUFHeader, read_header
from edge_runtime.core.mmproj import PairFit, check_pair, quantization

if TYPE_CHECKING:
    from edge_runtime.core.bundle import Bundle, MmprojManifest

PLACEHOLDERS = ("system", "image", "prompt")


def check_pair_bundle(bundle: Bundle, manifest_path: Path, m: MmprojManifest, verify_checksums: bool) -> None:
    from edge_runtime.core.bundle import sha256_file

    for role, entry in (("language", m.files.language), ("mmproj", m.files.mmproj)):
        if Path(entry.path).name != entry.path or entry.path in ("", ".", ".."):
            raise BundleError(f"{manifest_path}: files.{role}.path {entry.path!r} must be a file name inside "
                              "the bundle folder")
        path = bundle.root / entry.path
        if not path.is_file():
            raise BundleError(f"{path} is missing: bundle.yaml lists it as the {role} model")
        if verify_checksums and sha256_file(path) != entry.sha256:
            raise BundleError(f"{path} does not match its sha256 in bundle.yaml (corrupt or replaced file)")
    assert bundle.mmproj_path is not None
    lm, mm = read_header(bundle.language_path), read_header(bundle.mmproj_path)
    fit = check_pair(lm, mm)
    if fit.projector != m.mtmd.projector:
        raise BundleError(f"{bundle.mmproj_path} is a {fit.projector} projector, but bundle.yaml says "
                          f"mtmd.projector {m.mtmd.projector!r}")
    if fit.embedding_dim != m.mtmd.embedding_dim:
        raise BundleError(f"{bundle.language_path} takes embeddings {fit.embedding_dim} wide, but bundle.yaml "
                          f"says mtmd.embedding_dim {m.mtmd.embedding_dim}")
    check_prompt_template(m.prompt.template, f"{manifest_path}: prompt.template")
    bundle.quantization = quantization(lm)


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
