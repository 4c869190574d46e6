"""A random-weight GGUF + mmproj pair in Qwen2.5-VL-3B shapes, for `edge-runtime bench` on a GPU.

The checkpoint is made with transformers from the public model's config.json dimensions (the weights
are random: only speed and memory are measured), converted by the vendored llama.cpp converter into a
language GGUF (quantized Q4_K_M by llama.cpp's own quantizer) and an f16 mmproj, then imported with
`edge-runtime models import`. The tokenizer is the tiny SentencePiece one of the tests, padded to the
real vocabulary size, so the output layer costs what Qwen's 151,936-token head costs.

    python benchmarks/realistic_pair.py OUT_DIR --converter DIR [--image-max-tokens 256] [--shape 3b|1.5b|0.5b|smoke]

`--shape 1.5b` is Qwen2.5-1.5B's language dimensions behind the 3b's 32-block tower (the layout of
Qwen2-VL-2B, in Qwen2.5-VL's format): the 1.5B shape of issue 25's end-to-end target.
`--shape 0.5b` is a CPU-sized pair: Qwen2.5-0.5B's language dimensions (the same 151,936-token head)
behind a 12-block, 768-wide vision tower at 336 px (144 image tokens); no such Qwen2.5-VL exists, it
is sized for peers.py's image workload on two cores. `--shape smoke` (or `--smoke`) builds the same
layout with tiny dimensions (the CPU smoke run of tests/shipping).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Qwen/Qwen2.5-VL-3B-Instruct config.json (text and vision towers).
TEXT_3B = dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
               num_key_value_heads=2, vocab_size=151936, rope_theta=1_000_000.0, mrope_section=[16, 24, 24])
VISION_3B = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                 fullatt_block_indexes=[7, 15, 23, 31])
TEXT_SMOKE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, rope_theta=10000.0, mrope_section=[2, 3, 3])
VISION_SMOKE = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                    fullatt_block_indexes=[2])
# Qwen/Qwen2.5-0.5B-Instruct config.json (head_dim 64, so M-RoPE sections of 32 rotary pairs).
TEXT_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                num_key_value_heads=2, vocab_size=151936, rope_theta=1_000_000.0, mrope_section=[8, 12, 12])
VISION_05B = dict(depth=12, hidden_size=768, intermediate_size=2048, num_heads=12, out_hidden_size=896,
                  fullatt_block_indexes=[3, 7, 11])
# Qwen/Qwen2.5-1.5B-Instruct config.json behind the 3B's vision tower projecting to its width: the
# layout of Qwen2-VL-2B (a 1.5B language model and a 32-block 1280-wide tower) in Qwen2.5-VL's format.
TEXT_15B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                num_key_value_heads=2, vocab_size=151936, rope_theta=1_000_000.0, mrope_section=[16, 24, 24])
VISION_15B = dict(VISION_3B, out_hidden_size=1536)
# shape: (text, vision, image px, quantization, bundle name)
SHAPES = {"3b": (TEXT_3B, VISION_3B, 448, "Q4_K_M", "qwen2.5-vl-3b-shape"),
          "1.5b": (TEXT_15B, VISION_15B, 448, "Q4_K_M", "qwen2.5-vl-1.5b-shape"),
          "0.5b": (TEXT_05B, VISION_05B, 336, "Q4_K_M", "qwen2.5-vl-0.5b-shape"),
          # K-quants need rows of 256: the smoke shapes are too narrow
          "smoke": (TEXT_SMOKE, VISION_SMOKE, 112, "Q8_0", "qwen2.5-vl-3b-shape")}


def build_checkpoint(out: Path, text_dims: dict, vision_dims: dict, image_px: int) -> None:
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLImageProcessor

    from tests.support.tiny_pair_models import QWEN_TEMPLATE, _save_tokenizer
    from tests.support.tiny_vlms import _token_id, _tokenizer

    torch.manual_seed(11)
    specials = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                "<|video_pad|>"]
    tok, sp_model = _tokenizer(out.parent / "tok", specials)
    dims = dict(text_dims)
    mrope, theta = dims.pop("mrope_section"), dims.pop("rope_theta")
    text = dict(dims, max_position_embeddings=32768, rms_norm_eps=1e-6, bos_token_id=1,
                eos_token_id=_token_id(tok, "<|im_end|>"),
                rope_parameters={"rope_type": "default", "rope_theta": theta, "mrope_section": mrope})
    vision = dict(vision_dims, patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112)
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=_token_id(tok, "<|image_pad|>"),
                              video_token_id=_token_id(tok, "<|video_pad|>"),
                              vision_start_token_id=_token_id(tok, "<|vision_start|>"),
                              vision_end_token_id=_token_id(tok, "<|vision_end|>"), tie_word_embeddings=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_default_dtype(torch.bfloat16 if device == "cuda" else torch.float32)
    with torch.device(device):  # 3.8 B parameters initialise in seconds on the GPU, minutes on a CPU
        model = Qwen2_5_VLForConditionalGeneration(config).eval()
    model.save_pretrained(out)
    Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=image_px * image_px, patch_size=14, merge_size=2,
                          temporal_patch_size=2).save_pretrained(out)
    _save_tokenizer(tok, sp_model, out, QWEN_TEMPLATE)


def convert(converter: Path, hf_dir: Path, out: Path, outtype: str, mmproj: bool) -> None:
    cmd = [sys.executable, str(converter / "convert_hf_to_gguf.py"), str(hf_dir), "--outfile", str(out),
           "--outtype", outtype, *(["--mmproj"] if mmproj else [])]
    env = {**os.environ, "PYTHONPATH": str(converter / "gguf-py"), "NO_LOCAL_GGUF": "1"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--converter", type=Path, required=True, help="folder with convert_hf_to_gguf.py and gguf-py/")
    ap.add_argument("--image-max-tokens", type=int, default=256)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="3b")
    ap.add_argument("--smoke", action="store_true", help="the same as --shape smoke (tiny dimensions)")
    args = ap.parse_args()
    text, vision, image_px, quant, name = SHAPES["smoke" if args.smoke else args.shape]
    from edge_runtime_models.llama_cpp_tools import quantize

    work = args.out.with_name(args.out.name + ".work")
    work.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    t = time.perf_counter()
    build_checkpoint(work / "hf", text, vision, image_px=image_px)
    times["checkpoint_s"] = time.perf_counter() - t
    t = time.perf_counter()
    convert(args.converter, work / "hf", work / "lm-f16.gguf", "f16", mmproj=False)
    convert(args.converter, work / "hf", work / "mmproj-f16.gguf", "f16", mmproj=True)
    times["convert_s"] = time.perf_counter() - t
    t = time.perf_counter()
    quantize(work / "lm-f16.gguf", work / f"lm-{quant}.gguf", quant, threads=os.cpu_count() or 1)
    times["quantize_s"] = time.perf_counter() - t
    subprocess.run([sys.executable, "-m", "edge_runtime", "models", "import", str(work / f"lm-{quant}.gguf"),
                    str(work / "mmproj-f16.gguf"), str(args.out), "--name", name,
                    "--image-max-tokens", str(args.image_max_tokens), "--link"], check=True)
    sizes = {p.name: p.stat().st_size for p in work.glob("*.gguf")}
    print(json.dumps({"bundle": str(args.out), **{k: round(v, 1) for k, v in times.items()}, "bytes": sizes}))


if __name__ == "__main__":
    main()
