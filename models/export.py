"""`edge-runtime models export`: a Hugging Face VLM checkpoint folder -> an edge-runtime bundle.

Steps: load the checkpoint with transformers; export the vision tower + projector to ONNX (fp32,
and fp16 beside it; dynamic batch); write the language model as a plain Hugging Face llama
checkpoint and convert it with llama.cpp's own converter, then quantize with llama.cpp's
quantizer; read preprocessing, image-token layout and chat template from the processor; write
bundle.yaml with checksums. torch and transformers come from the `export` extra; the daemon never
imports this module.

Families (docs/models.md): LLaVA-1.5 style (CLIP/SigLIP tower, MLP projector, llama LM) and
SmolVLM/Idefics3 (SigLIP tower, pixel-shuffle connector, llama LM, tiled images).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_runtime.core.bundle.manifest import ImageLayout
from edge_runtime.inference.prompt_layout import image_prompt

from . import llama_cpp_tools
from .demo import DEFAULT_PROMPT, SYSTEM_PROMPT, VERDICT_SCHEMA, bundle_workdir, write_manifest

FAMILIES = {
    "LlavaForConditionalGeneration": "llava",
    "SmolVLMForConditionalGeneration": "smolvlm",
    "Idefics3ForConditionalGeneration": "smolvlm",
}
# Architectures people ask for that we do not export yet, with the reason (docs/models.md).
NOT_YET = {
    "KimiVLForConditionalGeneration": "Kimi-VL needs its MoonViT tower (native resolution, 2D RoPE) and a "
                                      "DeepSeek-V3 MoE language model; see docs/models.md",
    "Gemma3ForConditionalGeneration": "Gemma 3 needs bidirectional attention over the image block; "
                                      "see docs/models.md",
    "Qwen2VLForConditionalGeneration": "Qwen2-VL needs M-RoPE positions for image tokens",
    "Qwen2_5_VLForConditionalGeneration": "Qwen2.5-VL needs M-RoPE positions for image tokens",
}
_SENTINEL = {"system": "\u0001SYSTEM\u0001", "prompt": "\u0001PROMPT\u0001"}


class ExportError(RuntimeError):
    """A checkpoint we cannot export, said in one sentence."""


@dataclass
class ExportReport:
    out_dir: Path
    family: str
    seconds: dict[str, float]


def detect_family(checkpoint: Path) -> str:
    config_path = checkpoint / "config.json"
    if not config_path.is_file():
        raise ExportError(f"{checkpoint} has no config.json: point at a Hugging Face checkpoint folder")
    config = json.loads(config_path.read_text())
    arch = (config.get("architectures") or ["(none)"])[0]
    if arch in NOT_YET:
        raise ExportError(f"{arch} is not supported yet: {NOT_YET[arch]}")
    if arch not in FAMILIES:
        raise ExportError(f"{arch} is not a supported architecture; supported: {', '.join(sorted(FAMILIES))}")
    text_type = (config.get("text_config") or {}).get("model_type", "llama")
    if text_type != "llama":
        raise ExportError(f"{arch} with a {text_type!r} language model is not supported; the language model "
                          "must be llama-architecture")
    return FAMILIES[arch]


def export_checkpoint(checkpoint: Path, out_dir: Path, quant: str = "Q4_K_M", *, name: str | None = None,
                      schema: dict[str, Any] | None = None, prompt: str | None = None, system: str | None = None,
                      llama_cpp_src: Path | None = None, progress: bool = True, threads: int = 0) -> ExportReport:
    checkpoint = checkpoint.expanduser().resolve()
    family = detect_family(checkpoint)
    if quant not in llama_cpp_tools.FTYPES:
        raise ExportError(f"unknown quantization {quant!r}; choose one of {', '.join(llama_cpp_tools.FTYPES)}")
    steps = _Steps(progress, total=7 if quant in ("F32", "F16", "BF16") else 8)
    with steps("load checkpoint (transformers)"):
        try:
            import torch
            from transformers import AutoModelForImageTextToText, AutoProcessor
        except ImportError as exc:
            raise ExportError(f"export needs torch and transformers: pip install 'edge-runtime[export]' "
                              f"(CPU torch is enough) ({exc})") from None

        torch.manual_seed(0)
        model = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32).eval()
        model.requires_grad_(False)
        processor = AutoProcessor.from_pretrained(checkpoint)
    adapter = _ADAPTERS[family](model, processor)
    out_dir = out_dir.expanduser().resolve()
    with bundle_workdir(out_dir) as work, tempfile.TemporaryDirectory(prefix="export-", dir=work.parent) as tmp:
        with steps("vision tower + projector -> vision.onnx"):
            tokens, width = _export_vision(adapter, work / "vision.onnx")
        with steps("fp16 encoder -> vision.fp16.onnx"):
            _to_fp16(work / "vision.onnx", work / "vision.fp16.onnx")
        with steps("language model -> Hugging Face llama checkpoint"):
            lm_dir = Path(tmp) / "lm"
            adapter.save_language_model(lm_dir, checkpoint)
        with steps("llama.cpp convert_hf_to_gguf"):
            source = llama_cpp_tools.converter_dir(llama_cpp_src)
            direct = quant in ("F32", "F16", "BF16")
            converted = (work / "language.gguf") if direct else Path(tmp) / "language-f16.gguf"
            llama_cpp_tools.convert(lm_dir, converted, quant.lower() if direct else "f16", source)
        with steps("check: llama.cpp tokenizes the prompt as the checkpoint does"):
            template = adapter.template()
            layout = ImageLayout(**adapter.layout())
            sample = template.format(system=SYSTEM_PROMPT, image=image_prompt(layout, tokens, (1, 2)),
                                     prompt=DEFAULT_PROMPT)
            if not tokenizer_agrees(converted, adapter.processor.tokenizer, sample):
                raise ExportError("llama.cpp's tokenizer (from the converted GGUF) splits the prompt differently "
                                  "from the checkpoint's tokenizer; the bundle would not compute what the model "
                                  "computes")
        if not direct:
            with steps(f"llama.cpp quantize -> {quant}"):
                llama_cpp_tools.quantize(converted, work / "language.gguf", quant, threads)
        with steps("bundle.yaml"):
            manifest = {
                "format": 1, "name": name or natural_name(checkpoint), "version": "1",
                "description": f"Exported from {checkpoint.name} ({family}) by edge-runtime models export.",
                "preprocess": adapter.preprocess(),
                "vision": {"input": "pixel_values", "output": "image_embeds", "image_tokens": tokens,
                           "embedding_dim": width, "layout": adapter.layout()},
                "language": {"embedding_dim": width, "quantization": quant,
                             "context_length": int(adapter.text_config.max_position_embeddings)},
                "prompt": {"template": template, "system": SYSTEM_PROMPT if system is None else system,
                           "default": prompt or DEFAULT_PROMPT},
                "verdict_schema": schema or VERDICT_SCHEMA,
                "generation": {"max_tokens": 160},
            }
            write_manifest(work, manifest, extra_files={"vision_fp16": "vision.fp16.onnx"})
    steps.close()
    return ExportReport(out_dir, family, steps.seconds)


class _Steps:
    """One progress line per export step, with its time."""

    def __init__(self, progress: bool, total: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="step", disable=not progress,
                        bar_format="{l_bar}{bar}| {n}/{total} [{elapsed}]")
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, label: str) -> Iterator[None]:
        self.bar.set_description(label)
        t0 = time.perf_counter()
        yield
        self.seconds[label] = round(time.perf_counter() - t0, 2)
        self.bar.update()

    def close(self) -> None:
        self.bar.close()


# ---- families --------------------------------------------------------------------------------------


class _Adapter:
    """What differs between families: the vision forward, where the LM weights are, the processor."""

    def __init__(self, model: Any, processor: Any) -> None:
        self.model = model
        self.processor = processor
        self.text_config = model.config.text_config
        self.image_token: str = processor.image_token

    def vision_forward(self, pixel_values: Any) -> Any:
        raise NotImplementedError

    def vision_input_size(self) -> int:
        return int(self.model.config.vision_config.image_size)

    def language_parts(self) -> tuple[Any, Any]:
        """(the llama decoder module, the lm_head module)."""
        return self.model.model.language_model, self.model.lm_head

    def preprocess(self) -> dict[str, Any]:
        raise NotImplementedError

    def layout(self) -> dict[str, Any]:
        return {"image_token": self.image_token, "kind": "single"}

    def save_language_model(self, out: Path, checkpoint: Path) -> None:
        """The decoder + lm_head as a plain LlamaForCausalLM folder with the checkpoint's tokenizer,
        so llama.cpp's converter sees an architecture and tensor names it knows."""
        from transformers import LlamaForCausalLM

        config = self.text_config.__class__.from_dict(self.text_config.to_dict())
        config.architectures = ["LlamaForCausalLM"]
        lm = LlamaForCausalLM(config).eval()
        decoder, head = self.language_parts()
        lm.model.load_state_dict(decoder.state_dict())
        lm.lm_head.load_state_dict(head.state_dict())
        lm.save_pretrained(out)
        tok = self.processor.tokenizer
        tok.save_pretrained(out)
        # llama.cpp's converter learns the added tokens (the image token among them) from this table,
        # which transformers 5 no longer writes.
        config_path = out / "tokenizer_config.json"
        tok_config = json.loads(config_path.read_text())
        if (out / "tokenizer.model").is_file() or (checkpoint / "tokenizer.model").is_file():
            # SentencePiece: llama.cpp puts a space before text that follows a special token unless
            # told otherwise; match what this tokenizer does (legacy=False ones add none).
            tok_config["add_prefix_space"] = _spaces_after_special(tok)
        tok_config["added_tokens_decoder"] = {
            str(i): {"content": t.content, "special": bool(t.special), "lstrip": t.lstrip, "rstrip": t.rstrip,
                     "normalized": t.normalized, "single_word": t.single_word}
            for i, t in tok.added_tokens_decoder.items()}
        config_path.write_text(json.dumps(tok_config, indent=2))
        for extra in ("tokenizer.model",):  # the sentencepiece model, when the checkpoint has one
            if (checkpoint / extra).is_file():
                shutil.copy(checkpoint / extra, out / extra)

    def template(self) -> str:
        """The bundle's prompt template from the checkpoint's chat template, with {system}, {image}
        and {prompt} where the system text, the image and the question go."""
        messages = [
            {"role": "system", "content": [{"type": "text", "text": _SENTINEL["system"]}]},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": _SENTINEL["prompt"]}]},
        ]
        if getattr(self.processor, "chat_template", None):
            text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        else:  # LLaVA-1.5's documented prompt format
            text = f"{_SENTINEL['system']}\nUSER: {self.image_token}\n{_SENTINEL['prompt']} ASSISTANT:"
        if _SENTINEL["system"] not in text:
            raise ExportError("the chat template drops the system message; edit prompt.template in bundle.yaml")
        text = text.replace("{", "{{").replace("}", "}}")
        text = text.replace(_SENTINEL["system"], "{system}").replace(_SENTINEL["prompt"], "{prompt}")
        if text.count(self.image_token) != 1:
            raise ExportError(f"the chat template writes {text.count(self.image_token)} image tokens for one image")
        text = text.replace(self.image_token, "{image}")
        tok = self.processor.tokenizer
        bos = tok.bos_token
        adds_bos = bos is not None and tok("x").input_ids[:1] == [tok.bos_token_id] != tok(
            "x", add_special_tokens=False).input_ids[:1]
        if adds_bos and not text.startswith(bos):
            text = bos + text  # the processor adds BOS when it tokenizes; our template carries it as text
        return text


class _Llava(_Adapter):
    def vision_forward(self, pixel_values: Any) -> Any:
        cfg = self.model.config
        out = self.model.model.vision_tower(pixel_values, output_hidden_states=True, return_dict=True)
        layer = cfg.vision_feature_layer
        if isinstance(layer, int):
            feats = out.hidden_states[layer]
            feats = feats[:, 1:] if cfg.vision_feature_select_strategy == "default" else feats
        else:
            import torch

            pool = [out.hidden_states[i] for i in layer]
            pool = [h[:, 1:] for h in pool] if cfg.vision_feature_select_strategy == "default" else pool
            feats = torch.cat(pool, dim=-1)
        return self.model.model.multi_modal_projector(feats)

    def preprocess(self) -> dict[str, Any]:
        ip = self.processor.image_processor
        size = dict(ip.size) if ip.size is not None else {}
        crop = dict(ip.crop_size) if getattr(ip, "crop_size", None) else None
        spec: dict[str, Any] = {"resize": _pil_name(ip.resample), "keep_aspect": False,
                                "mean": [float(v) for v in ip.image_mean], "std": [float(v) for v in ip.image_std],
                                "clahe": None}
        if size.get("shortest_edge") and getattr(ip, "do_center_crop", False) and crop:
            spec.update(width=crop["width"], height=crop["height"], shortest_edge=size["shortest_edge"])
        elif size.get("height") and size.get("width"):
            spec.update(width=size["width"], height=size["height"])
        else:
            raise ExportError(f"image processor size {size} is not one we can reproduce")
        return spec


class _SmolVLM(_Adapter):
    def __init__(self, model: Any, processor: Any) -> None:
        super().__init__(model, processor)
        import torch

        # Every tile is a full image, so the tower's position ids are a constant: computed here with
        # the reference code's own arithmetic (its bucketize does not export to ONNX).
        n = int(model.model.vision_model.embeddings.num_patches_per_side)
        boundaries = torch.arange(1 / n, 1.0, 1 / n)
        coords = torch.clamp(torch.arange(n, dtype=torch.float32) * (1.0 / torch.tensor(float(n))), max=1.0 - 1e-6)
        buckets = torch.bucketize(coords, boundaries, right=True)
        self.position_ids = (buckets[:, None] * n + buckets[None, :]).reshape(-1)

    def vision_forward(self, pixel_values: Any) -> Any:
        inner = self.model.model
        tower = inner.vision_model
        x = tower.embeddings.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
        x = x + tower.embeddings.position_embedding(self.position_ids)[None]
        hidden = tower.post_layernorm(tower.encoder(inputs_embeds=x).last_hidden_state)
        return inner.connector(hidden)

    def language_parts(self) -> tuple[Any, Any]:
        return self.model.model.text_model, self.model.lm_head

    def preprocess(self) -> dict[str, Any]:
        ip = self.processor.image_processor
        tile = int(ip.max_image_size["longest_edge"])
        if tile != self.vision_input_size():
            raise ExportError(f"the processor's tile size {tile} differs from the vision tower's "
                              f"{self.vision_input_size()}")
        spec: dict[str, Any] = {"width": tile, "height": tile, "resize": _pil_name(ip.resample), "keep_aspect": False,
                                "mean": [float(v) for v in ip.image_mean], "std": [float(v) for v in ip.image_std],
                                "clahe": None}
        if getattr(ip, "do_image_splitting", True):
            spec["tiling"] = {"longest_edge": int(ip.size["longest_edge"])}
        return spec

    def layout(self) -> dict[str, Any]:
        p = self.processor
        return {"image_token": self.image_token, "kind": "idefics3", "fake_token": p.fake_image_token,
                "global_token": getattr(p, "global_image_token", None) or p.global_image_tag}


_ADAPTERS: dict[str, Callable[[Any, Any], _Adapter]] = {"llava": _Llava, "smolvlm": _SmolVLM}


def _spaces_after_special(tok: Any) -> bool:
    """Does the tokenizer read text right after a special token as if it began with a space?"""
    special = tok.bos_token or tok.eos_token
    if special is None:
        return True  # nothing to test against: keep llama.cpp's SentencePiece default
    plain = tok(f"{special}USER", add_special_tokens=False).input_ids
    spaced = tok(f"{special} USER", add_special_tokens=False).input_ids
    return bool(plain == spaced)


def tokenizer_agrees(gguf_path: Path, tok: Any, text: str) -> bool:
    """llama.cpp's tokenization of `text` (from the GGUF's vocabulary) equals the checkpoint tokenizer's."""
    from edge_runtime.inference.engines import llama_cpp

    vocab_model = llama_cpp.Llama(str(gguf_path), vocab_only=True, verbose=False)
    try:
        ours = vocab_model.tokenize(text.encode(), add_bos=False, special=True)
    finally:
        vocab_model.close()
    return list(ours) == list(tok(text, add_special_tokens=False).input_ids)


def _pil_name(resample: Any) -> str:
    names = {2: "pil_bilinear", 3: "pil_bicubic", 1: "pil_lanczos"}  # PIL.Image.Resampling values
    value = int(getattr(resample, "value", resample))
    if value not in names:
        raise ExportError(f"image processor resampling {resample!r} is not one we reproduce")
    return names[value]


def _export_vision(adapter: _Adapter, path: Path) -> tuple[int, int]:
    import torch

    class Vision(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = adapter.model  # registered, so the tracer sees its weights as parameters

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return adapter.vision_forward(pixel_values)

    size = adapter.vision_input_size()
    example = torch.zeros(2, 3, size, size)
    with torch.no_grad():
        out = Vision()(example)
        program = torch.onnx.export(
            Vision().eval(), (example,), input_names=["pixel_values"], output_names=["image_embeds"], dynamo=True,
            dynamic_shapes={"pixel_values": {0: torch.export.Dim("batch", min=1, max=64)}}, verbose=False)
    program.save(str(path), external_data=False)
    return int(out.shape[1]), int(out.shape[2])


def _to_fp16(src: Path, dst: Path) -> None:
    """Half-precision weights and activations, float32 input/output (ONNX Runtime's own converter)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    onnx.save_model(model, str(dst))


def natural_name(checkpoint: Path) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", checkpoint.name).strip("-") or "exported-vlm"
