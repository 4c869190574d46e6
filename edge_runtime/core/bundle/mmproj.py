"""Does an mmproj GGUF fit a language-model GGUF? Read from both headers, the way libmtmd decides.

libmtmd (`clip_n_mmproj_embd` in the vendored llama.cpp's tools/mtmd/clip.cpp) takes the projector's
output width from one tensor's shape per projector type; llama.cpp takes the language model's input
width as `<arch>.embedding_length` x (1 + `<arch>.n_deepstack_layers`) (`llama_model_n_embd_inp`:
Qwen3-VL's deepstack rows are wider than the model). The two must be equal, or libmtmd refuses the
pair when the daemon starts; here it is refused with one sentence before anything loads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from edge_runtime.core.bundle.gguf_header import GGUFHeader
from edge_runtime.core.errors import BundleError


@dataclass(frozen=True)
class Projector:
    family: str
    tensor: str   # the tensor whose shape gives the output width
    axis: int     # which ggml dimension (ne[axis])
    languages: tuple[str, ...] = ()  # LM architectures it needs (M-RoPE, Gemma 3's attention); () = any


# clip.projector_type -> family and width rule (clip.cpp's load_tensors + clip_n_mmproj_embd).
PROJECTORS: dict[str, Projector] = {
    "qwen2vl_merger": Projector("Qwen2-VL", "mm.2.bias", 0, ("qwen2vl",)),
    "qwen2.5vl_merger": Projector("Qwen2.5-VL", "mm.2.bias", 0, ("qwen2vl",)),
    "qwen3vl_merger": Projector("Qwen3-VL", "mm.2.bias", 0, ("qwen3vl", "qwen3vlmoe")),  # x (1 + deepstack)
    "gemma3": Projector("Gemma 3", "mm.input_projection.weight", 0, ("gemma3",)),
    "idefics3": Projector("SmolVLM / SmolVLM2 / Idefics3", "mm.model.fc.weight", 1),
    "internvl": Projector("InternVL", "mm.model.mlp.3.weight", 1),
    "resampler": Projector("MiniCPM-V", "resampler.proj.weight", 0),
    "minicpmv4_6": Projector("MiniCPM-V 4.6", "mm.down.weight", 1),
    "lfm2": Projector("LFM2-VL", "mm.2.weight", 1),
    "kimivl": Projector("Kimi-VL", "mm.2.weight", 1),
    "kimik25": Projector("Kimi-K2.5", "mm.2.weight", 1),
    "mlp": Projector("LLaVA-1.5 style", "mm.2.weight", 1),     # mm.3.bias when the MLP has a third layer
}
_DEEPSTACK = re.compile(r"v\.deepstack\.(\d+)\.fc1\.weight")


@dataclass(frozen=True)
class PairFit:
    projector: str
    family: str
    embedding_dim: int


def language_width(lm: GGUFHeader) -> int:
    """llama_model_n_embd_inp from the header: the width of each embedding row the model takes."""
    arch = lm.architecture
    if arch == "clip":
        raise BundleError(f"{lm.path} is an mmproj (projector) file, not a language model: "
                          "give the language model first, then the mmproj")
    width = lm.require(f"{arch}.embedding_length", int)
    deepstack = lm.get(f"{arch}.n_deepstack_layers", 0)
    if not isinstance(deepstack, int) or not 0 <= deepstack <= 1024 or not 0 < width <= 1 << 20:
        raise BundleError(f"{lm.path}: {arch}.embedding_length {width} / n_deepstack_layers {deepstack} "
                          "are out of range")
    layers = lm.get(f"{arch}.block_count")
    if deepstack and isinstance(layers, int) and deepstack >= layers:
        # llama.cpp (0c1e570) adds the last layer's deepstack rows after keeping only the output rows:
        # GGML_ASSERT(ggml_can_repeat) aborts the process on the first decode of more than one token.
        raise BundleError(f"{lm.path}: {arch}.n_deepstack_layers {deepstack} is not below its block_count "
                          f"{layers}; llama.cpp aborts on such a model (real Qwen3-VL checkpoints have 3 "
                          "deepstack layers over 28 or more)")
    return int(width) * (1 + int(deepstack))


def projector_width(mm: GGUFHeader) -> tuple[str, Projector, int]:
    """(clip.projector_type, its rule, the projector's output width) of an mmproj header."""
    arch = mm.get("general.architecture")
    if arch != "clip":
        raise BundleError(f"{mm.path} is not an mmproj file (general.architecture is {arch!r}, not 'clip'): "
                          "give the language model first, then the mmproj")
    if mm.get("clip.has_vision_encoder") is not True:
        raise BundleError(f"{mm.path} has no vision encoder (clip.has_vision_encoder is not true): "
                          "an audio-only projector cannot inspect images")
    kind = mm.get("clip.vision.projector_type", mm.get("clip.projector_type"))
    if not isinstance(kind, str):
        raise BundleError(f"{mm.path} has no clip.projector_type key in its GGUF header")
    rule = PROJECTORS.get(kind)
    if rule is None:
        raise BundleError(f"{mm.path} has projector type {kind[:40]!r}, which edge-runtime does not know "
                          f"(known: {', '.join(sorted(PROJECTORS))})")
    name = rule.tensor
    if kind == "mlp" and "mm.3.weight" in mm.tensors:
        name, axis = "mm.3.bias", 0
    else:
        axis = rule.axis
    tensor = mm.tensors.get(name)
    if tensor is None or len(tensor.shape) <= axis:
        raise BundleError(f"{mm.path} has no {name} tensor, which a {kind} projector needs")
    width = tensor.shape[axis]
    if kind == "qwen3vl_merger":
        width *= 1 + len({m.group(1) for t in mm.tensors if (m := _DEEPSTACK.fullmatch(t))})
    return kind, rule, width


def check_pair(lm: GGUFHeader, mm: GGUFHeader) -> PairFit:
    """The projector type and shared width of a language model + mmproj pair, or BundleError."""
    kind, rule, out = projector_width(mm)
    width = language_width(lm)
    # libmtmd accepts any pair of equal widths (a tiny Gemma 3 mmproj loads on a tiny Qwen2.5-VL LM), but
    # M-RoPE positions and Gemma 3's image attention are only right with the family's own language model.
    arch = lm.architecture
    own = sorted(k for k, r in PROJECTORS.items() if arch in r.languages)
    if rule.languages and arch not in rule.languages:
        raise BundleError(f"{mm.path} is a {kind} projector ({rule.family}), which needs a "
                          f"{' or '.join(rule.languages)} language model, but {lm.path} is {arch}: "
                          "the mmproj belongs to a different model")
    if own and kind not in own:
        raise BundleError(f"{lm.path} is a {arch} language model, which needs a {' or '.join(own)} projector, "
                          f"but {mm.path} is {kind}: the mmproj belongs to a different model")
    if out != width:
        raise BundleError(f"{mm.path} ({kind}) outputs embeddings {out} wide, but {lm.path} takes "
                          f"{width}: the mmproj belongs to a different model")
    return PairFit(kind, rule.family, width)


_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
               11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
               17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}


def quantization(header: GGUFHeader) -> str:
    """general.file_type as llama.cpp's quantize tool names it ('' when absent, the number if unnamed)."""
    value = header.get("general.file_type")
    return "" if not isinstance(value, int) else _FILE_TYPES.get(value, str(value))
