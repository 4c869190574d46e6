"""Tiny random-weight GGUF + mmproj pairs, made at test time: a transformers checkpoint from a small
config, converted by the llama.cpp converter that llama-cpp-python 0.3.36 vendors.

The converter is not in the installed wheel: `pip download` fetches the 0.3.36 sdist (PyPI, pip's
cache) and its `convert_hf_to_gguf.py`, `conversion/` and `gguf-py/` are unpacked once. Pairs are
cached under `~/.cache/edge-runtime/tiny-pairs/<hash of this file>/<family>/` (`EDGE_RUNTIME_CACHE`
moves the root), so a change here makes new ones and an unchanged file costs nothing.

Pitfalls (docs/FACTS): the converter wants `preprocessor_config.json` with `image_mean`/`image_std`,
a SentencePiece `tokenizer.model` (the BPE path refuses unknown pre-tokenizers), and libmtmd's
marker tokens (`<|vision_start|>`, `<start_of_image>`, ...) must be single tokens of the vocabulary;
byte fallback makes any text tokenizable; Qwen2.5-VL vision needs >= 3 blocks (the converter maps a
projector tensor mm.N only for N below the vision block count: InternVL's mlp1.3 needs 4, LFM2-VL's and
Kimi-VL's linear_2 3); Gemma 3's and LFM2-VL's SigLIP keys are `vision_tower.vision_model.*` for the
converter but `vision_tower.*` in transformers 5.x. A byte-level BPE vocabulary (LFM2-VL, Kimi-VL) is
converted with its pre-tokenizer named (`_BPE_PRE`): the converter knows only real tokenizers' hashes.
InternVL and Kimi-VL have no transformers class for their checkpoints' layout: their vision tensors are
written by hand under the names the converter's classes read.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"
FAMILIES = ("qwen2.5-vl", "gemma3", "smolvlm", "qwen3-vl", "lfm2-vl", "internvl", "kimi-vl", "minicpm-v")
EXTRA_FAMILIES: tuple[str, ...] = ()  # built on request only, in no test
_HERE = Path(__file__)


@dataclass(frozen=True)
class TinyPair:
    family: str
    language: Path  # the LM GGUF
    mmproj: Path  # the projector GGUF
    hf_dir: Path  # the transformers checkpoint it was converted from (for reference logits)
    template: str  # the prompt template, {system} {image} {prompt} as in bundle.yaml format 2
    image_max_tokens: int


# The prompt templates the chat templates render to (what `models import` derives at import).
_TEMPLATES = {
    "qwen2.5-vl": "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{image}{prompt}<|im_end|>\n"
                  "<|im_start|>assistant\n",
    "gemma3": "<start_of_turn>user\n{system}{image}{prompt}<end_of_turn>\n<start_of_turn>model\n",
    "smolvlm": "{system}User:{image}{prompt}<end_of_utterance>\nAssistant:",
    "qwen3-vl": "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{image}{prompt}<|im_end|>\n"
                "<|im_start|>assistant\n",
    "internvl": "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{image}{prompt}<|im_end|>\n"
                "<|im_start|>assistant\n",
    "kimi-vl": "<|im_system|>system<|im_middle|>{system}<|im_end|><|im_user|>user<|im_middle|>{image}{prompt}"
               "<|im_end|><|im_assistant|>assistant<|im_middle|>",
    "minicpm-v": "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{image}{prompt}<|im_end|>\n"
                 "<|im_start|>assistant\n",
    "lfm2-vl": "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{image}{prompt}<|im_end|>\n"
               "<|im_start|>assistant\n",
}


def cache_root() -> Path:
    base = Path(os.environ.get("EDGE_RUNTIME_CACHE", Path.home() / ".cache" / "edge-runtime"))
    return base


def _code_hash() -> str:
    h = hashlib.sha256()
    for f in (_HERE, _HERE.with_name("tiny_pair_models.py"), _HERE.with_name("tiny_vlms.py")):
        h.update(f.read_bytes())
    h.update(LLAMA_CPP_PYTHON.encode())
    return h.hexdigest()[:16]


def converter_dir() -> Path:
    """The unpacked converter of the vendored llama.cpp (downloaded with pip once, then cached)."""
    out = cache_root() / "llama-convert" / LLAMA_CPP_PYTHON
    if (out / "convert_hf_to_gguf.py").is_file():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={LLAMA_CPP_PYTHON}",
                        "--no-deps", "--no-binary", ":all:", "-d", tmp, "-q"], check=True)
        (sdist,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        top = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
        stage = Path(tmp) / "x"
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.name == top + "convert_hf_to_gguf.py"
                       or m.name.startswith((top + "conversion/", top + "gguf-py/"))]
            tar.extractall(stage, members=members, filter="data")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp_out = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp_out, ignore_errors=True)
        shutil.move(str(stage / top), tmp_out)
        os.replace(tmp_out, out)
    return out


# Both conversions in one interpreter (torch and transformers imported once: ~5 s less per family).
# `pre` names the BPE pre-tokenizer where the converter would look it up by the hash of the real
# tokenizer's output (a tiny vocabulary has no known hash); empty: the converter's own lookup.
_CONVERT_BOTH = """
import sys
conv, hf, lm, mm, pre, text_args = sys.argv[1:7]
sys.path.insert(0, conv)
import convert_hf_to_gguf
if pre:
    from conversion.base import TextModel
    TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
for out, extra in ((lm, text_args.split()), (mm, ["--mmproj"])):
    sys.argv = ["convert_hf_to_gguf.py", hf, "--outfile", out, "--outtype", "f32", *extra]
    convert_hf_to_gguf.main()
"""


def _convert(hf_dir: Path, language: Path, mmproj: Path, pre: str = "", text_args: str = "") -> None:
    conv = converter_dir()
    cmd = [sys.executable, "-c", _CONVERT_BOTH, str(conv), str(hf_dir), str(language), str(mmproj), pre, text_args]
    env = {**os.environ, "PYTHONPATH": str(conv / "gguf-py"), "NO_LOCAL_GGUF": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0 or not language.is_file() or not mmproj.is_file():
        raise RuntimeError(f"convert_hf_to_gguf failed for {hf_dir}:\n{res.stderr[-3000:]}")


def tiny_pair(family: str) -> TinyPair:
    """The cached pair of `family` (one of FAMILIES), made on first use (a few seconds each)."""
    if family not in FAMILIES + EXTRA_FAMILIES:
        raise ValueError(f"unknown tiny family {family!r}; known: {', '.join(FAMILIES + EXTRA_FAMILIES)}")
    folder = cache_root() / "tiny-pairs" / _code_hash() / family
    done = folder / "done.json"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{family}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # xdist workers or two sessions: one builds, the rest wait
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            from tests.support import tiny_pair_models as builders  # torch + transformers: only when building

            hf = folder / "hf"
            builders.BUILDERS[family](hf)
            _convert(hf, folder / "model.gguf", folder / "mmproj.gguf", _BPE_PRE.get(family, ""),
                     _TEXT_ARGS.get(family, ""))
            done.write_text(json.dumps({"family": family}))
    return TinyPair(family, folder / "model.gguf", folder / "mmproj.gguf", folder / "hf", _TEMPLATES[family],
                    _IMAGE_MAX_TOKENS[family])


_IMAGE_MAX_TOKENS = {"qwen2.5-vl": 64, "gemma3": 16, "smolvlm": 64, "qwen3-vl": 64, "lfm2-vl": 96, "internvl": 64,
                     "kimi-vl": 64, "minicpm-v": 64}
# What the converter's hash lookup answers for LiquidAI's and Moonshot's real tokenizers.
_BPE_PRE = {"lfm2-vl": "lfm2", "kimi-vl": "kimi-k2", "minicpm-v": "qwen35"}
_TEXT_ARGS = {"minicpm-v": "--no-mtp"}  # converter options for the language model
PROJECTORS = {"qwen2.5-vl": "qwen2.5vl_merger", "gemma3": "gemma3", "smolvlm": "idefics3",
              "qwen3-vl": "qwen3vl_merger", "lfm2-vl": "lfm2", "internvl": "internvl",
              "kimi-vl": "kimivl", "minicpm-v": "minicpmv4_6"}
EMBEDDING_DIMS = {"qwen3-vl": 192}  # 64 x (1 + 2 deepstack taps); the others 64
# A short verdict (everything an enum or a boolean): random weights finish it in a few tokens.
TINY_SCHEMA: dict[str, object] = {
    "type": "object", "additionalProperties": False, "required": ["defect", "category"],
    "properties": {"defect": {"type": "boolean"},
                   "category": {"enum": ["none", "scratch", "dent", "crack", "stain"]}},
}


def write_pair_bundle(pair: TinyPair, dest: Path, image_max_tokens: int | None = None,
                      schema: dict[str, object] | None = None) -> Path:
    """A format-2 bundle folder (bundle.yaml + copies of both GGUFs), as `models import` writes one."""
    import yaml

    dest.mkdir(parents=True, exist_ok=True)
    files = {}
    for role, src in (("language", pair.language), ("mmproj", pair.mmproj)):
        name = f"{pair.family}-{role}.gguf"
        shutil.copyfile(src, dest / name)
        files[role] = {"path": name, "sha256": hashlib.sha256((dest / name).read_bytes()).hexdigest()}
    manifest = {
        "format": 2, "name": f"tiny-{pair.family}", "version": "0", "files": files,
        "mtmd": {"projector": PROJECTORS[pair.family], "embedding_dim": EMBEDDING_DIMS.get(pair.family, 64),
                 "image_max_tokens": image_max_tokens or pair.image_max_tokens},
        "chat_template": None,
        "prompt": {"template": pair.template, "system": "You inspect parts. ",
                   "default": "Inspect the part. Answer in JSON."},
        "verdict_schema": schema or TINY_SCHEMA, "generation": {"max_tokens": 48},
    }
    (dest / "bundle.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return dest


if __name__ == "__main__":  # python -m tests.support.tiny_pairs [family...]: build and print the paths
    for fam in sys.argv[1:] or FAMILIES + EXTRA_FAMILIES:
        print(tiny_pair(fam))
