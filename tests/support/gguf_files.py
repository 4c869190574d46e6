"""Small GGUF files written with the `gguf` package: headers shaped like real language models and
mmproj files (the keys and tensor names libmtmd reads), with tiny zero tensors, for the bundle checks.
They are not loadable models; tests/support/tiny_pairs.py makes those."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np

QWEN_CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_lm(path: Path, arch: str = "qwen2vl", width: int = 64, chat_template: str | None = QWEN_CHAT,
             deepstack: int = 0, add_bos: bool = False) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-test-lm")
    w.add_embedding_length(width)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    if deepstack:
        w.add_uint32(f"{arch}.n_deepstack_layers", deepstack)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["<bos>", "<eos>", "a", "b"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_add_bos_token(add_bos)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.add_tensor("token_embd.weight", np.zeros((4, width), np.float32))
    w.add_tensor("output_norm.weight", np.ones((width,), np.float32))
    _finish(w)
    return path


def write_mmproj(path: Path, projector: str = "qwen2.5vl_merger", width: int = 64, deepstack: int = 0,
                 tensors: dict[str, tuple[int, ...]] | None = None) -> Path:
    """An mmproj whose output-width tensor (ggml order: numpy shape reversed) says `width`."""
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", projector)
    w.add_uint32("clip.vision.projection_dim", width)
    defaults: dict[str, dict[str, tuple[int, ...]]] = {
        "qwen2.5vl_merger": {"mm.2.bias": (width,)}, "qwen3vl_merger": {"mm.2.bias": (width,)},
        "gemma3": {"mm.input_projection.weight": (32, width)},       # ne = [width, 32]
        "idefics3": {"mm.model.fc.weight": (width, 32)},             # ne = [32, width]
        "kimivl": {"mm.2.weight": (width, 32)},
    }
    shapes = tensors if tensors is not None else defaults.get(projector, {"mm.2.bias": (width,)})
    for name, shape in shapes.items():
        w.add_tensor(name, np.zeros(shape, np.float32))
    for i in range(deepstack):
        w.add_tensor(f"v.deepstack.{i}.fc1.weight", np.zeros((8, 8), np.float32))
    w.add_tensor("v.patch_embd.weight", np.zeros((8, 3, 2, 2), np.float32))
    _finish(w)
    return path


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def huge_array_file(path: Path) -> Path:
    """49 bytes declaring one metadata array of 2^40 uint8 elements (GGUFReader loops on it for hours)."""
    key = b"x"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
                     + struct.pack("<I", 9) + struct.pack("<IQ", 0, 1 << 40))
    return path


def huge_tensor_count_file(path: Path) -> Path:
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 62, 0) + b"\0" * 64)
    return path
