"""`model:`: the bundle and how llama.cpp and ONNX Runtime run it."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field

from edge_runtime.config.base import ConfigPath, Section

DEFAULT_PROVIDERS = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


class ModelConfig(Section):
    path: ConfigPath | None = Field(
        None, description="Model bundle folder. Empty: the demo bundle, built on first use.")
    threads: int = Field(
        default_factory=lambda: os.cpu_count() or 1, ge=1, le=256,
        description="CPU threads for llama.cpp and ONNX Runtime (default: all cores).")
    context_size: int = Field(2048, ge=256, le=131072, description="llama.cpp context (tokens).")
    batch_size: int = Field(512, ge=32, le=8192, description="llama.cpp batch size (tokens per decode).")
    gpu_layers: int = Field(0, ge=-1, description="Layers offloaded to the GPU; -1 offloads all.")
    kv_cache_type: Literal["f16", "f32"] = Field(
        "f16", description="llama.cpp KV cache precision: f16 halves its memory; f32 matches a float32 "
        "reference implementation to ~1e-5 (docs/models.md).")
    providers: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PROVIDERS),
        description="ONNX Runtime execution providers in order of preference; missing ones are skipped.")
    vision_precision: Literal["fp32", "fp16"] = Field(
        "fp32", description="fp16 loads the bundle's half-precision encoder (for CUDA/TensorRT); "
        "bundles without one keep fp32.")
    prompt: str | None = Field(None, description="Inspection question; empty uses the bundle's default.")
    max_tokens: int | None = Field(None, ge=1, le=8192,
                                   description="Verdict token limit; empty uses the bundle's.")
    reuse_prefix_cache: bool = Field(
        True, description="Keep the KV cache of the fixed prompt prefix between inspections.")
    verify_checksums: bool = Field(True, description="Check the bundle's sha256 sums at load.")
    memory_check: bool = Field(
        True, description="Refuse, before loading, a bundle whose weights, KV cache (context_size x parallel "
        "sequences), compute buffers and encoder cannot fit the free memory (RAM and cgroup limit, or the GPU's "
        "by NVML), naming the figures (docs/reliability.md). false: load it anyway.")
    warmup: bool = Field(True, description="Run one inspection at load so the first real one is fast.")
    constraint_engine: Literal["llguidance", "gbnf"] = Field(
        "llguidance", description="JSON constraint engine: llguidance (token masks in Rust, only when the "
        "best token is refused; forced tokens in one batch) or gbnf (llama.cpp's grammar sampler).")
    fast_forward: bool = Field(
        True, description="llguidance: decode the tokens the grammar forces in one batch. Off: one token "
        "per step, exactly the tokens greedy decoding picks (docs/benchmarks.md).")
    steady_steps: bool = Field(
        False, description="Give a batched step of several sequences one shape (one token and one logit row per "
        "sequence) so llama.cpp's CUDA backend replays it as a captured graph; the tokens the grammar forces then "
        "go in one per step. On the H200 it made bench's 4-camera generation 1.04-1.23x faster but the daemon's "
        "camera route 7-17% slower at 4 cameras and 14-16% at 8 (docs/benchmarks.md, \"Steady steps\"), so it is off.")
    batch_kv_cache: Literal["per_sequence", "unified"] = Field(
        "per_sequence", description="KV cache of cameras generated as parallel sequences: per_sequence "
        "gives each its own stream (verdicts bit-identical to one at a time); unified shares one buffer "
        "(~15% more batched tokens/s on a 1.5B model, but verdicts may differ from one at a time).")
    flash_attention: bool | Literal["auto"] = Field(
        "auto", description="llama.cpp's fused attention kernel (what llama-server's default `-fa auto` picks on "
        "CPU and CUDA): on the H200, 1.25x the verdicts/s of 4 cameras; on two CPU cores no measurable change "
        "(docs/benchmarks.md). auto: on, except with kv_cache_type f32, whose point is matching a float32 "
        "reference (the fused CPU kernel's logits were 3e-3 of their range off it, the unfused under 1e-5); "
        "true/false force it.")
    draft_model: ConfigPath | None = Field(
        None, description="Speculative decoding: a GGUF of the same tokenizer (e.g. Qwen2.5-0.5B for Qwen2.5-VL-3B) "
        "that guesses the next tokens for the language model to check in one batch. Greedy answers of a "
        "camera or client running alone only; every answer is the one given without it (docs/models.md). "
        "Empty: none.")
    draft_tokens: int = Field(
        3, ge=1, le=16, description="Most tokens the draft guesses a step; fewer (or none for a while) when its "
        "guesses are refused.")
    token_cache_bytes: int = Field(
        4 * 1024 * 1024, ge=0, le=1 << 30,
        description="Memory for tokenized prompt texts kept between inspections (bytes; LRU).")
    encoder_cache_mb: int = Field(
        64, ge=0, le=16384,
        description="Memory for image embeddings kept by image content (MiB; LRU): a repeated API image, a "
        "reference or a re-ask is encoded once. Keyed by the decoded pixels' sha256, the encoder's file and "
        "settings, the crop and the image token budget. 0: off.")
    encoder_lanes: int = Field(
        1, ge=1, le=8,
        description="GGUF + mmproj bundles: libmtmd contexts that encode a frame's region crops at the same "
        "time (each holds its own copy of the mmproj's weights). On a large GPU one crop's encode does not "
        "fill it, so lanes overlap (partly): on the H200 4 lanes encoded 4 crops in 39 ms against 55-57 "
        "ms on one (docs/inspection.md, \"Encoder lanes\"); on a Jetson or a CPU the encodes share the same "
        "cores, so keep 1. ONNX bundles: one encoder session, whatever this says.")

    def flash_attention_on(self) -> bool:
        """Whether llama.cpp's contexts use fused attention (`flash_attention`, resolving auto)."""
        if self.flash_attention == "auto":
            return self.kv_cache_type != "f32"
        return bool(self.flash_attention)
