"""Tiny random-weight transformers checkpoints laid out for llama.cpp's converter (tests/support/tiny_pairs.py).

Each family gets the SentencePiece tokenizer of tiny_vlms.py (byte fallback) plus the marker tokens
libmtmd writes around an image, a `tokenizer.model` beside the weights, and a `preprocessor_config.json`.
Weights are drawn larger than the usual 0.02 init so logits spread over several units and the
equality tolerances mean something.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedTokenizerFast

from tests.support.tiny_vlms import _CORPUS, _token_id, _tokenizer

# Chat templates in the families' own shape (what `models import` renders into prompt.template).
QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<start_of_image>{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def _save_tokenizer(tok: object, sp_model: bytes, out: Path, chat_template: str | None = None) -> None:
    """The tokenizer as the converter reads it: tokenizer.model plus the added tokens, marked special,
    in tokenizer_config.json's added_tokens_decoder (transformers 5.x keeps them only in tokenizer.json)."""
    if chat_template is not None:
        tok.chat_template = chat_template  # type: ignore[attr-defined]
    tok.save_pretrained(out)  # type: ignore[attr-defined]
    (out / "tokenizer.model").write_bytes(sp_model)
    mark_special_tokens(out)


def mark_special_tokens(out: Path) -> None:
    doc = json.loads((out / "tokenizer.json").read_text())
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"] = {
        str(t["id"]): {"content": t["content"], "special": True, "normalized": False, "lstrip": False,
                       "rstrip": False, "single_word": False}
        for t in doc.get("added_tokens", []) if t["id"] >= 3}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))


def build_qwen25vl(out: Path) -> Path:
    """Qwen2.5-VL: 3-block window-attention ViT (patch 14, merge 2) + M-RoPE qwen2 decoder (sections 2,3,3)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLImageProcessor

    torch.manual_seed(3)
    specials = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                "<|video_pad|>"]
    tok, sp_model = _tokenizer(out.parent / "qwen-tok", specials)
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                bos_token_id=1, eos_token_id=_token_id(tok, "<|im_end|>"), initializer_range=0.25)
    vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=112, fullatt_block_indexes=[2],
                  initializer_range=0.25)
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=_token_id(tok, "<|image_pad|>"),
                              video_token_id=_token_id(tok, "<|video_pad|>"),
                              vision_start_token_id=_token_id(tok, "<|vision_start|>"),
                              vision_end_token_id=_token_id(tok, "<|vision_end|>"), tie_word_embeddings=False)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    model.save_pretrained(out)
    # 56x56 .. 112x112 pixels: 4 to 16 merged image tokens
    Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=112 * 112, patch_size=14, merge_size=2,
                          temporal_patch_size=2).save_pretrained(out)
    _save_tokenizer(tok, sp_model, out, QWEN_TEMPLATE)
    return out


def build_qwen3vl(out: Path) -> Path:
    """Qwen3-VL: 3-block ViT (patch 16, merge 2, learned 8x8 position grid) with deepstack taps after
    blocks 0 and 1 (the LM's input embeddings are then 3 x 64 wide) + interleaved M-RoPE qwen3 decoder.

    The decoder has 3 layers, more than the 2 taps, as every real Qwen3-VL has (28+ layers, 3 taps): with
    as many taps as layers llama.cpp 0c1e570 adds the last tap after keeping only the output rows and
    aborts on any multi-token decode (GGML_ASSERT(ggml_can_repeat(b, a)); docs/models.md). The M-RoPE
    sections are (3, 3, 2): with (2, 3, 3) llama.cpp's interleaved rope gives frequency pair 6 to the 4th
    section (position 0 for text tokens) where transformers keeps it temporal, 0.1 apart on text alone;
    real Qwen3-VL's (24, 20, 20) leaves only its two slowest pairs (61, 62) to that section."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLConfig, Qwen3VLForConditionalGeneration

    torch.manual_seed(5)
    specials = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                "<|video_pad|>"]
    tok, sp_model = _tokenizer(out.parent / "qwen3-tok", specials)
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                rms_norm_eps=1e-6, initializer_range=0.25,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [3, 3, 2],
                                 "mrope_interleaved": True})
    vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                  deepstack_visual_indexes=[0, 1], initializer_range=0.25)
    config = Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=_token_id(tok, "<|image_pad|>"),
                           video_token_id=_token_id(tok, "<|video_pad|>"),
                           vision_start_token_id=_token_id(tok, "<|vision_start|>"),
                           vision_end_token_id=_token_id(tok, "<|vision_end|>"), tie_word_embeddings=False)
    model = Qwen3VLForConditionalGeneration(config).eval()
    model.save_pretrained(out)
    Qwen2VLImageProcessor(min_pixels=64 * 64, max_pixels=128 * 128, patch_size=16, merge_size=2,
                          temporal_patch_size=2).save_pretrained(out)
    _save_tokenizer(tok, sp_model, out, QWEN_TEMPLATE)
    return out


def build_gemma3(out: Path) -> Path:
    """Gemma 3: SigLIP tower (64 px, patch 8 -> 8x8 patches) pooled to 16 tokens + gemma3 decoder."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessor

    torch.manual_seed(4)
    specials = ["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>"]
    tok, sp_model = _tokenizer(out.parent / "gemma-tok", specials)
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                sliding_window=512, query_pre_attn_scalar=16, rms_norm_eps=1e-6, bos_token_id=1,
                eos_token_id=_token_id(tok, "<end_of_turn>"), pad_token_id=0, initializer_range=0.25)
    vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, image_size=64, patch_size=8, layer_norm_eps=1e-6)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=16,
                          boi_token_index=_token_id(tok, "<start_of_image>"),
                          eoi_token_index=_token_id(tok, "<end_of_image>"),
                          image_token_index=_token_id(tok, "<image_soft_token>"), initializer_range=0.25)
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # transformers starts the projector's input projection at zeros: every image alike
        for name, param in model.named_parameters():
            if "multi_modal_projector" in name and float(param.abs().max()) == 0.0:
                param.normal_(0.0, 0.25)
    model.save_pretrained(out)
    _rename_vision_keys(out)
    Gemma3ImageProcessor(size={"height": 64, "width": 64}, image_seq_length=16).save_pretrained(out)
    cfg = json.loads((out / "preprocessor_config.json").read_text())
    cfg["image_seq_length"] = 16
    (out / "preprocessor_config.json").write_text(json.dumps(cfg))
    _save_tokenizer(tok, sp_model, out, GEMMA_TEMPLATE)
    return out


LFM2_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _bpe_tokenizer(specials: list[str], bos: str, eos: str) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (any text tokenizes) trained on the tiny corpus, with `specials` added."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(_CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|pad|>", bos, eos], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=bos, eos_token=eos, pad_token="<|pad|>")
    tok.add_special_tokens({"additional_special_tokens": specials})
    return tok


def build_lfm2vl(out: Path) -> Path:
    """LFM2-VL: SigLIP2 tower (patch 16; 3 blocks, as the converter maps mm.N only for N below the block
    count) + pixel-unshuffle (2) + 2-layer MLP + LFM2 hybrid decoder (short-convolution and attention
    layers) with a byte-level BPE vocabulary, as LFM2's own is. The converter names the vocabulary's
    pre-tokenizer by the hash of its own tokenization of a test text, which only LiquidAI's real
    tokenizer has: tiny_pairs converts it with that name ("lfm2") given. Tied embeddings, as LFM2-VL's
    (the mmproj conversion has no rule for an lm_head)."""
    from transformers import Lfm2VlConfig, Lfm2VlForConditionalGeneration

    torch.manual_seed(6)
    specials = ["<|im_start|>", "<image>", "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>",
                *(f"<|img_row_{r}_col_{c}|>" for r in range(1, 4) for c in range(1, 4))]
    tok = _bpe_tokenizer(specials, "<|startoftext|>", "<|im_end|>")
    text = dict(model_type="lfm2", vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                layer_types=["conv", "full_attention", "conv"], conv_L_cache=3, block_auto_adjust_ff_dim=False,
                norm_eps=1e-5, bos_token_id=_token_id(tok, "<|startoftext|>"),
                eos_token_id=_token_id(tok, "<|im_end|>"), pad_token_id=0, initializer_range=0.25,
                tie_word_embeddings=True, architectures=["Lfm2ForCausalLM"])
    vision = dict(model_type="siglip2_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=2, patch_size=16, num_patches=64, vision_use_head=False)
    config = Lfm2VlConfig(text_config=text, vision_config=vision, image_token_id=_token_id(tok, "<image>"),
                          projector_hidden_size=64, downsample_factor=2, tie_word_embeddings=True)  # as LFM2-VL
    model = Lfm2VlForConditionalGeneration(config).eval()
    with torch.no_grad():  # norms start at ones/zeros: draw them too, so every weight shapes the logits
        for name, param in model.named_parameters():
            if param.ndim == 1:
                param.normal_(1.0 if name.endswith("weight") else 0.0, 0.25)
    model.save_pretrained(out)
    _rename_vision_keys(out)
    tok.chat_template = LFM2_TEMPLATE
    tok.save_pretrained(out)
    # transformers' Lfm2VlImageProcessor needs torchvision: the converter reads only mean and std
    (out / "preprocessor_config.json").write_text(json.dumps(
        {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "encoder_patch_size": 16,
         "downsample_factor": 2, "image_processor_type": "Lfm2VlImageProcessor"}))
    mark_special_tokens(out)
    return out


INTERNVL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_internvl(out: Path) -> Path:
    """InternVL 2.5/3 as its remote-code checkpoints lay it out (no transformers class reads that layout:
    the converter takes only `InternVisionModel`): an InternViT-300M-style tower written tensor by tensor
    (CLS token, 64 px / patch 8, 4 blocks with layer scale; the converter maps mlp1.N only for N below the
    block count), pixel shuffle 0.5, the mlp1 projector (LayerNorm, Linear, GELU, Linear), and a Qwen2 LM
    from transformers under `language_model.`; at most 2 tiles (+ the thumbnail) per image."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(7)
    tok, sp_model = _tokenizer(out.parent / "internvl-tok", ["<|im_start|>", "<|im_end|>", "<img>", "</img>",
                                                            "<IMG_CONTEXT>"])
    llm = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-6,
                      bos_token_id=1, eos_token_id=_token_id(tok, "<|im_end|>"), tie_word_embeddings=False,
                      initializer_range=0.25)
    lm = Qwen2ForCausalLM(llm).eval()
    d, f, patch, image, layers, hidden = 32, 64, 8, 64, 4, llm.hidden_size
    n = (image // patch) ** 2

    def rnd(*shape: int, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(*shape) * 0.25 + mean

    tensors = {f"language_model.{k}": v.contiguous() for k, v in lm.state_dict().items()}
    v = "vision_model."
    tensors |= {v + "embeddings.class_embedding": rnd(1, 1, d),
                v + "embeddings.patch_embedding.weight": rnd(d, 3, patch, patch),
                v + "embeddings.patch_embedding.bias": rnd(d), v + "embeddings.position_embedding": rnd(1, n + 1, d)}
    for i in range(layers):
        b = f"{v}encoder.layers.{i}."
        tensors |= {b + "norm1.weight": rnd(d, mean=1.0), b + "norm1.bias": rnd(d),
                    b + "norm2.weight": rnd(d, mean=1.0), b + "norm2.bias": rnd(d),
                    b + "attn.qkv.weight": rnd(3 * d, d), b + "attn.qkv.bias": rnd(3 * d),
                    b + "attn.proj.weight": rnd(d, d), b + "attn.proj.bias": rnd(d),
                    b + "mlp.fc1.weight": rnd(f, d), b + "mlp.fc1.bias": rnd(f),
                    b + "mlp.fc2.weight": rnd(d, f), b + "mlp.fc2.bias": rnd(d),
                    b + "ls1": rnd(d, mean=1.0), b + "ls2": rnd(d, mean=1.0)}
    tensors |= {"mlp1.0.weight": rnd(4 * d, mean=1.0), "mlp1.0.bias": rnd(4 * d), "mlp1.1.weight": rnd(hidden, 4 * d),
                "mlp1.1.bias": rnd(hidden), "mlp1.3.weight": rnd(hidden, hidden), "mlp1.3.bias": rnd(hidden)}
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: t.contiguous() for k, t in tensors.items()}, out / "model.safetensors", metadata={"format": "pt"})
    vision = dict(architectures=["InternVisionModel"], model_type="intern_vit_6b", hidden_size=d,
                  intermediate_size=f, num_attention_heads=2, num_hidden_layers=layers, image_size=image,
                  patch_size=patch, layer_norm_eps=1e-6, hidden_act="gelu", norm_type="layer_norm",
                  qk_normalization=False, drop_path_rate=0.0, use_flash_attn=False)
    config = dict(architectures=["InternVLChatModel"], model_type="internvl_chat", downsample_ratio=0.5,
                  min_dynamic_patch=1, max_dynamic_patch=2, dynamic_image_size=True, use_thumbnail=True,
                  force_image_size=image, select_layer=-1, template="internvl2_5",
                  llm_config={**llm.to_dict(), "architectures": ["Qwen2ForCausalLM"]}, vision_config=vision)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps(
        {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "size": image}))
    _save_tokenizer(tok, sp_model, out, INTERNVL_TEMPLATE)
    return out


KIMI_TEMPLATE = (
    "{% for m in messages %}<|im_{{ m['role'] }}|>{{ m['role'] }}<|im_middle|>{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|media_pad|>{% else %}{{ c['text'] }}{% endif %}{% endfor %}<|im_end|>"
    "{% endfor %}{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %}"
)


def build_kimivl(out: Path) -> Path:
    """Kimi-VL (remote code only: no transformers class) as its checkpoints lay it out: a MoonViT tower
    written tensor by tensor (patch 14, a learned 64x64 position grid as the converter assumes, 3 blocks:
    the converter maps linear_N only for N below the block count), a 2x2 patch merger + 2-layer MLP, and a
    DeepSeek-V3-style MoE decoder (MLA attention with a q LoRA: llama.cpp takes Moonlight's q_lora_rank-less
    attention only at its 26/27 layers; 4 routed + 1 shared expert, first layer dense) from
    transformers' DeepseekV3 under `language_model.`, its fused experts split per expert as Kimi-VL's
    checkpoints store them. Byte-level BPE vocabulary converted with the pre-tokenizer name "kimi-k2"."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(8)
    specials = ["<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>", "<|media_start|>",
                "<|media_content|>", "<|media_end|>", "<|media_pad|>"]
    tok = _bpe_tokenizer(specials, "[BOS]", "<|im_end|>")
    text = DeepseekV3Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2,
        n_group=1, topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=2048, bos_token_id=_token_id(tok, "[BOS]"),
        eos_token_id=_token_id(tok, "<|im_end|>"), tie_word_embeddings=False, initializer_range=0.25)
    lm = DeepseekV3ForCausalLM(text).eval()
    with torch.no_grad():
        for name, param in lm.named_parameters():
            if "experts" in name and param.ndim == 3:  # transformers initialises fused experts at zeros
                param.normal_(0.0, 0.25)
    tensors: dict[str, torch.Tensor] = {}
    moe = text.moe_intermediate_size
    for key, value in lm.state_dict().items():
        if key.endswith("mlp.experts.gate_up_proj"):  # [E, 2 I, H]: gate rows, then up rows
            head = key.removesuffix("gate_up_proj")
            for e in range(value.shape[0]):
                tensors[f"language_model.{head}{e}.gate_proj.weight"] = value[e, :moe]
                tensors[f"language_model.{head}{e}.up_proj.weight"] = value[e, moe:]
        elif key.endswith("mlp.experts.down_proj"):  # [E, H, I]
            head = key.removesuffix("down_proj")
            for e in range(value.shape[0]):
                tensors[f"language_model.{head}{e}.down_proj.weight"] = value[e]
        else:
            tensors[f"language_model.{key}"] = value
    d, f, patch, grid, layers, hidden = 32, 64, 14, 64, 3, text.hidden_size

    def rnd(*shape: int, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(*shape) * 0.25 + mean

    v = "vision_tower."
    tensors |= {v + "patch_embed.proj.weight": rnd(d, 3, patch, patch), v + "patch_embed.proj.bias": rnd(d),
                v + "patch_embed.pos_emb.weight": rnd(grid, grid, d),
                v + "encoder.final_layernorm.weight": rnd(d, mean=1.0), v + "encoder.final_layernorm.bias": rnd(d)}
    for i in range(layers):
        b = f"{v}encoder.blocks.{i}."
        tensors |= {b + "norm0.weight": rnd(d, mean=1.0), b + "norm0.bias": rnd(d),
                    b + "norm1.weight": rnd(d, mean=1.0), b + "norm1.bias": rnd(d),
                    b + "wqkv.weight": rnd(3 * d, d), b + "wqkv.bias": rnd(3 * d),
                    b + "wo.weight": rnd(d, d), b + "wo.bias": rnd(d),
                    b + "mlp.fc0.weight": rnd(f, d), b + "mlp.fc0.bias": rnd(f),
                    b + "mlp.fc1.weight": rnd(d, f), b + "mlp.fc1.bias": rnd(d)}
    p = "multi_modal_projector."
    tensors |= {p + "pre_norm.weight": rnd(d, mean=1.0), p + "pre_norm.bias": rnd(d),
                p + "linear_1.weight": rnd(4 * d, 4 * d), p + "linear_1.bias": rnd(4 * d),
                p + "linear_2.weight": rnd(hidden, 4 * d), p + "linear_2.bias": rnd(hidden)}
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: t.contiguous() for k, t in tensors.items()}, out / "model.safetensors", metadata={"format": "pt"})
    vision = dict(model_type="moonvit", hidden_size=d, intermediate_size=f, num_attention_heads=2,
                  num_hidden_layers=layers, patch_size=patch, init_pos_emb_height=grid, init_pos_emb_width=grid,
                  merge_kernel_size=[2, 2])
    config = dict(architectures=["KimiVLForConditionalGeneration"], model_type="kimi_vl",
                  media_placeholder_token_id=_token_id(tok, "<|media_pad|>"), tie_word_embeddings=False,
                  text_config={**text.to_dict(), "architectures": ["DeepseekV3ForCausalLM"]}, vision_config=vision)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps(
        {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "patch_size": patch, "in_token_limit": 64,
         "merge_kernel_size": [2, 2]}))
    tok.chat_template = KIMI_TEMPLATE
    tok.save_pretrained(out)
    mark_special_tokens(out)
    return out


def build_minicpmv46(out: Path) -> Path:
    """MiniCPM-V 4.6 (transformers' MiniCPMV4_6ForConditionalGeneration): SigLIP tower (128 px slices,
    patch 16, 3 blocks, the 70 x 70 position buckets libmtmd hard-codes) with the window-attention ViT
    merger after block 1 and the DownsampleMLP merger, over a Qwen3.5 hybrid decoder (3 gated-delta-net
    linear-attention layers + 1 full attention; interleaved M-RoPE sections (2, 1, 1) over 4 rotary
    pairs, so llama.cpp gives no pair to its 4th section); byte-level BPE converted as `qwen35`, the LM
    with `--no-mtp` (no multi-token-prediction layer)."""
    from transformers import MiniCPMV4_6Config, MiniCPMV4_6ForConditionalGeneration

    torch.manual_seed(9)
    specials = ["<|im_start|>", "<image>", "</image>", "<slice>", "</slice>", "<|image_pad|>"]
    tok = _bpe_tokenizer(specials, "<|endoftext|>", "<|im_end|>")
    text = dict(model_type="qwen3_5_text", vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                linear_conv_kernel_dim=4, max_position_embeddings=2048, rms_norm_eps=1e-6, initializer_range=0.25,
                eos_token_id=_token_id(tok, "<|im_end|>"), tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                 "mrope_section": [2, 1, 1], "mrope_interleaved": True})
    vision = dict(model_type="minicpmv4_6_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=2, image_size=70 * 16, patch_size=16, insert_layer_id=1)  # 70x70 buckets
    config = MiniCPMV4_6Config(text_config=text, vision_config=vision, insert_layer_id=1, image_size=64,
                               image_token_id=_token_id(tok, "<|image_pad|>"), tie_word_embeddings=False)
    model = MiniCPMV4_6ForConditionalGeneration(config).eval()
    with torch.no_grad():  # norms start at ones/zeros: draw them too, so every weight shapes the logits
        for name, param in model.named_parameters():
            if param.ndim == 1 and "norm" in name:
                param.normal_(1.0 if name.endswith("weight") else 0.0, 0.25)
    model.save_pretrained(out)
    tok.chat_template = INTERNVL_TEMPLATE.replace("<image>", "<image>./</image>")
    tok.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps(
        {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "scale_resolution": 128, "patch_size": 16,
         "max_slice_nums": 2, "slice_mode": True, "downsample_mode": "16x"}))
    mark_special_tokens(out)
    return out


def _rename_vision_keys(out: Path) -> None:
    """The converter reads SigLIP's keys under vision_tower.vision_model. (transformers 5.x drops it)."""
    for shard in out.glob("*.safetensors"):
        tensors = load_file(shard)
        renamed = {_vision_model_key(k): v.contiguous() for k, v in tensors.items()}
        save_file(renamed, shard, metadata={"format": "pt"})


def _vision_model_key(key: str) -> str:
    for head in ("model.vision_tower.", "vision_tower."):
        if key.startswith(head) and not key.startswith(head + "vision_model."):
            return head + "vision_model." + key[len(head):]
    return key


def build_smolvlm(out: Path) -> Path:
    """SmolVLM (v1) / Idefics3 as tiny_vlms.build_idefics3 lays it out, plus the "\\n\\n" token libmtmd
    looks up for the global image (one token in SmolVLM's BPE vocabulary); the text part is named as
    SmolVLM's own config names it, which is how the converter picks the llama class for the LM GGUF."""
    from tests.support.tiny_vlms import build_idefics3

    build_idefics3(out, extra_specials=("\n\n",), tokenizer_dir="smolvlm-tok")
    cfg = json.loads((out / "config.json").read_text())
    cfg["text_config"]["architectures"] = ["VLlama3ForCausalLM"]
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    mark_special_tokens(out)
    return out


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "qwen2.5-vl": build_qwen25vl, "gemma3": build_gemma3, "smolvlm": build_smolvlm, "qwen3-vl": build_qwen3vl,
    "lfm2-vl": build_lfm2vl, "internvl": build_internvl, "kimi-vl": build_kimivl,
    "minicpm-v": build_minicpmv46,
}
