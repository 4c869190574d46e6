"""Tiny random-weight Hugging Face VLM checkpoints, built from configs with transformers (no download).

Each has a real SentencePiece tokenizer trained here on inspection text (byte fallback, so any text
tokenizes), the family's special tokens, a chat template, and the family's real processor.
"""

from __future__ import annotations

import io
from pathlib import Path

import sentencepiece as spm
import torch
from transformers import (
    AutoTokenizer,
    CLIPImageProcessor,
    CLIPVisionConfig,
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    Idefics3ImageProcessor,
    Idefics3Processor,
    Idefics3VisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerBase,
)

_CORPUS = [
    "You are a visual inspection assistant on a factory line. Answer only with JSON.",
    "Inspect the part in the image. Is there a defect? Give the category, your confidence and a short note.",
    '{"defect": false, "category": "none", "confidence": 0.93, "notes": "surface clean"}',
    '{"defect": true, "category": "scratch", "confidence": 0.71, "notes": "scratch near the left edge"}',
    "USER: ASSISTANT: System: User: Assistant: crack dent stain missing_part misaligned other",
    "0 1 2 3 4 5 6 7 8 9 . , : ; { } [ ] \" ' ? ! - _",
] * 40

LLAVA_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'][0]['text'] }}\n"
    "{% else %}{{ m['role'].upper() }}: {% for c in m['content'] %}{% if c['type'] == 'image' %}<image>\n"
    "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% if m['role'] == 'user' %} {% endif %}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
# SmolVLM's chat template.
IDEFICS3_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def _tokenizer(work: Path, specials: list[str]) -> tuple[PreTrainedTokenizerBase, bytes]:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_CORPUS), model_writer=model, vocab_size=400, model_type="bpe", byte_fallback=True,
        character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, normalization_rule_name="identity",
        split_digits=True, remove_extra_whitespaces=False, minloglevel=2)
    folder = work / "spm"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    (folder / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "LlamaTokenizer", "add_bos_token": true, "legacy": false}')
    tok = AutoTokenizer.from_pretrained(folder)
    tok.add_special_tokens({"additional_special_tokens": specials})
    return tok, model.getvalue()


def _token_id(tok: PreTrainedTokenizerBase, token: str) -> int:
    token_id = tok.convert_tokens_to_ids(token)
    assert isinstance(token_id, int), token_id  # one token in, one id out
    return token_id


def _text_config(vocab: int) -> LlamaConfig:
    # Weights larger than the usual 0.02 init so logits spread over several units, which makes
    # the equivalence tolerance mean something.
    return LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                       rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                       initializer_range=0.25)


def build_llava(out: Path) -> Path:
    """LLaVA-1.5 layout: CLIP tower (56 px, patch 14, layer -2, CLS dropped) + 2-layer MLP + llama."""
    torch.manual_seed(1)
    tok, sp_model = _tokenizer(out.parent / "llava-tok", ["<image>"])
    vision = CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                              image_size=56, patch_size=14, projection_dim=64)
    config = LlavaConfig(vision_config=vision, text_config=_text_config(len(tok)),
                         image_token_index=_token_id(tok, "<image>"), image_seq_length=16,
                         vision_feature_layer=-2, vision_feature_select_strategy="default")
    model = LlavaForConditionalGeneration(config).eval()
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56}),
        tokenizer=tok, patch_size=14, num_additional_image_tokens=1, vision_feature_select_strategy="default",
        chat_template=LLAVA_TEMPLATE)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    (out / "tokenizer.model").write_bytes(sp_model)
    return out


def build_idefics3(out: Path, extra_specials: tuple[str, ...] = (), tokenizer_dir: str = "idefics3-tok") -> Path:
    """SmolVLM (v1) layout: SigLIP-style tower (32 px tiles, patch 8), pixel shuffle x2, llama; images
    longer than a tile are split into a grid of tiles plus a global image. `extra_specials` go into the
    vocabulary before the tile-grid tokens (the GGUF pair of tiny_pair_models.py adds "\\n\\n")."""
    torch.manual_seed(2)
    specials = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>", *extra_specials] + [
        f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
    tok, sp_model = _tokenizer(out.parent / tokenizer_dir, specials)
    vision = Idefics3VisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  image_size=32, patch_size=8)
    config = Idefics3Config(vision_config=vision.to_dict(), text_config=_text_config(len(tok)).to_dict(),
                            scale_factor=2, image_token_id=_token_id(tok, "<image>"))
    model = Idefics3ForConditionalGeneration(config).eval()
    processor = Idefics3Processor(
        image_processor=Idefics3ImageProcessor(size={"longest_edge": 64}, max_image_size={"longest_edge": 32}),
        tokenizer=tok, image_seq_len=4, chat_template=IDEFICS3_TEMPLATE.replace("<|im_start|>", ""))
    model.save_pretrained(out)
    processor.save_pretrained(out)
    (out / "tokenizer.model").write_bytes(sp_model)
    return out
