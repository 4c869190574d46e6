"""A small llama-architecture decoder written as a quantized GGUF with the `gguf` package.

Random weights, real format: llama.cpp loads it like any Llama checkpoint, with a byte-level BPE
vocabulary (see tokenizer.py) so every string tokenizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from .tokenizer import Tokenizer


@dataclass(frozen=True)
class LanguageShape:
    width: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 384
    context: int = 2048
    vocab: int = 0  # pad the tokenizer's vocabulary to this size (real models' embedding tables)


# Quantization by name; Q8_0/Q4_0 need rows that are multiples of 32, K-quants of 256.
QUANT_TYPES = {
    "Q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "Q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    "F16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
}


def write_language_model(
    path: Path, shape: LanguageShape, tokenizer: Tokenizer, seed: int, quant: str = "Q8_0",
    name: str = "edge-demo-lm",
) -> None:
    qtype, ftype = QUANT_TYPES[quant]
    rng = np.random.default_rng(seed)
    tokens = list(tokenizer.tokens)
    tokens += [f"<|unused_{i}|>" for i in range(max(0, shape.vocab - len(tokens)))]
    vocab = len(tokens)
    d, dh = shape.width, shape.width // shape.heads

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_context_length(shape.context)
    w.add_embedding_length(d)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(dh)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(vocab)
    w.add_file_type(ftype)

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    special_ids = set(tokenizer.special.values())
    w.add_token_types([
        gguf.TokenType.CONTROL if i in special_ids else
        gguf.TokenType.UNUSED if i >= len(tokenizer.tokens) else gguf.TokenType.NORMAL for i in range(vocab)
    ])
    w.add_token_merges(tokenizer.merges)
    w.add_bos_token_id(tokenizer.special["<|endoftext|>"])
    w.add_eos_token_id(tokenizer.special["<|im_end|>"])
    w.add_add_bos_token(False)

    def matrix(name: str, rows: int, cols: int, std: float) -> None:
        data = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(std)
        q = gguf.quants.quantize(data, qtype)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)

    def norm(name: str) -> None:
        w.add_tensor(name, np.ones(d, np.float32))

    matrix("token_embd.weight", vocab, d, 1.0)
    for i in range(shape.layers):
        b = f"blk.{i}"
        norm(f"{b}.attn_norm.weight")
        matrix(f"{b}.attn_q.weight", d, d, d**-0.5)
        matrix(f"{b}.attn_k.weight", shape.kv_heads * dh, d, d**-0.5)
        matrix(f"{b}.attn_v.weight", shape.kv_heads * dh, d, d**-0.5)
        matrix(f"{b}.attn_output.weight", d, d, d**-0.5)
        norm(f"{b}.ffn_norm.weight")
        matrix(f"{b}.ffn_gate.weight", shape.ffn, d, d**-0.5)
        matrix(f"{b}.ffn_up.weight", shape.ffn, d, d**-0.5)
        matrix(f"{b}.ffn_down.weight", d, shape.ffn, shape.ffn**-0.5)
    norm("output_norm.weight")
    matrix("output.weight", vocab, d, d**-0.5)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
