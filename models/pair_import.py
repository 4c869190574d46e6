"""`edge-runtime models import LM.gguf MMPROJ.gguf DIR`: a llama.cpp language GGUF + its mmproj GGUF
-> a format-2 bundle (docs/models.md).

Both headers are walked by the bounded reader and the pair's fit is checked before a byte is copied;
the chat template is read from the language model's header and rendered (sandboxed) into the
bundle's prompt template; the folder is written beside DIR and renamed into place, so a failed
import leaves nothing behind. Files are copied, or hard-linked (symlinked across file systems).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from edge_runtime.core.bundle.gguf_header import GGUFHeader
from edge_runtime.core.bundle.manifest import MAX_CHAT_TEMPLATE, load_bundle, sha256_file
from edge_runtime.core.bundle.pair import check_prompt_template, read_pair

from .chat_template import TemplateRefused, derive_prompt_template
from .demo import DEFAULT_PROMPT, SYSTEM_PROMPT, VERDICT_SCHEMA, bundle_workdir


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the chat and prompt templates) as literal blocks, readable in bundle.yaml."""


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|" if "\n" in data else None)


_Dumper.add_representer(str, _str)


class ImportRefused(ValueError):
    """A pair we cannot import, said in one sentence."""


@dataclass
class ImportOptions:
    name: str | None = None
    schema: dict[str, Any] | None = None
    prompt: str | None = None
    prompt_template: str | None = None
    image_max_tokens: int = 1024
    mode: Literal["copy", "link"] = "copy"


def _bos(lm: GGUFHeader) -> tuple[str, str, bool]:
    """(BOS text, EOS text, whether llama.cpp adds BOS) from the tokenizer keys of the header."""
    tokens = lm.get("tokenizer.ggml.tokens")

    def text(key: str) -> str:
        idx = lm.get(key)
        if isinstance(tokens, list) and isinstance(idx, int) and 0 <= idx < len(tokens):
            return str(tokens[idx])
        return ""

    return text("tokenizer.ggml.bos_token_id"), text("tokenizer.ggml.eos_token_id"), \
        lm.get("tokenizer.ggml.add_bos_token") is True


def _template(lm: GGUFHeader, given: str | None) -> tuple[str | None, str]:
    """(the LM's chat template or None, the prompt template)."""
    chat = lm.get("tokenizer.chat_template")
    if chat is not None and not isinstance(chat, str):
        raise ImportRefused(f"{lm.path}: tokenizer.chat_template is not a string")
    if chat is not None and len(chat) > MAX_CHAT_TEMPLATE:
        raise ImportRefused(f"{lm.path}: its chat template is {len(chat)} characters long "
                            f"(limit {MAX_CHAT_TEMPLATE}); give --prompt-template")
    if given is not None:
        check_prompt_template(given, "--prompt-template")
        return chat, given
    if chat is None:
        raise ImportRefused(f"{lm.path} has no chat template (tokenizer.chat_template): give --prompt-template, "
                            "e.g. '<|im_start|>user\\n{image}{prompt}<|im_end|>\\n<|im_start|>assistant\\n'")
    bos, eos, add_bos = _bos(lm)
    try:
        template = derive_prompt_template(chat, bos=bos, eos=eos, add_bos=add_bos)
    except TemplateRefused as exc:
        raise ImportRefused(f"{lm.path}: {exc}; give --prompt-template") from None
    check_prompt_template(template, f"{lm.path}: the prompt template derived from its chat template")
    return chat, template


def _place(src: Path, dst: Path, mode: str) -> None:
    if mode == "copy":
        shutil.copyfile(src, dst)
        return
    try:
        os.link(src, dst)
    except OSError:  # another file system (or no hard links there): a symlink to the absolute path
        os.symlink(src.resolve(), dst)


def _check_target(out_dir: Path, sources: tuple[Path, ...], mode: str) -> None:
    """DIR is replaced as a whole: it must be new, empty, or a bundle folder, never a folder of other files."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ImportRefused(f"{out_dir} exists and is not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "bundle.yaml").is_file():
        raise ImportRefused(f"{out_dir} is not empty and is not a bundle folder: the import replaces the whole "
                            "folder, so give a new or empty one")
    if mode == "link" and any(out_dir in src.resolve().parents for src in sources):
        raise ImportRefused(f"--link from files inside {out_dir} would lose them when the folder is replaced: "
                            "use --copy")


def import_pair(language: Path, mmproj: Path, out_dir: Path, options: ImportOptions | None = None) -> Path:
    """Write the format-2 bundle of a language GGUF + mmproj GGUF into `out_dir` (replaced atomically)."""
    opts = options or ImportOptions()
    for role, path in (("language model", language), ("mmproj", mmproj)):
        if not path.is_file():
            raise ImportRefused(f"{path} does not exist or is not a file (the {role})")
    if language.resolve() == mmproj.resolve():
        raise ImportRefused(f"{language} was given as both the language model and the mmproj")
    if not 1 <= opts.image_max_tokens <= 65536:
        raise ImportRefused(f"--image-max-tokens {opts.image_max_tokens} must be between 1 and 65536")
    out_dir = out_dir.expanduser().resolve()
    _check_target(out_dir, (language, mmproj), opts.mode)
    lm, _, fit = read_pair(language, mmproj)
    chat, template = _template(lm, opts.prompt_template)
    general = lm.get("general.name")
    name = (opts.name or (general if isinstance(general, str) else "") or language.stem).strip()[:200]
    names = {"language": language.name, "mmproj": mmproj.name}
    if names["language"] == names["mmproj"] or "bundle.yaml" in names.values():
        names = {"language": "language.gguf", "mmproj": "mmproj.gguf"}
    with bundle_workdir(out_dir) as work:
        files = {}
        for role, src in (("language", language), ("mmproj", mmproj)):
            try:
                _place(src, work / names[role], opts.mode)
            except OSError as exc:
                raise ImportRefused(f"cannot write {out_dir / names[role]}: {exc.strerror or exc}") from None
            files[role] = {"path": names[role], "sha256": sha256_file(work / names[role])}
        manifest = {
            "format": 2, "name": name or "imported-vlm", "version": "0",
            "description": f"{fit.family} pair imported from {language.name} + {mmproj.name}",
            "files": files,
            "mtmd": {"projector": fit.projector, "embedding_dim": fit.embedding_dim,
                     "image_max_tokens": opts.image_max_tokens},
            "chat_template": chat,
            "prompt": {"template": template, "system": SYSTEM_PROMPT if "{system}" in template else "",
                       "default": opts.prompt or DEFAULT_PROMPT},
            "verdict_schema": opts.schema or VERDICT_SCHEMA,
            "generation": {"max_tokens": 256},
        }
        (work / "bundle.yaml").write_text(yaml.dump(manifest, Dumper=_Dumper, sort_keys=False, width=100,
                                                        allow_unicode=True))
        load_bundle(work)  # the same checks the daemon makes, before the folder replaces DIR
    return out_dir
