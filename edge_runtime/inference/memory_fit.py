"""Will the bundle fit this device's memory? Counted from the files' headers before anything loads.

A bundle and settings that cannot fit are refused with the figures (a ConfigError naming the keys to
change) instead of being killed by the kernel halfway through a load, or later, when a long chat
request makes the parallel context grow. What is counted, and why (docs/reliability.md):

- **weights** of the language model (and the draft): the tensor bytes of the GGUF. llama.cpp maps the
  file: on the CPU those pages are page cache the kernel can drop and read again, so they must fit the
  device's RAM (or cgroup limit), not be free now. Layers offloaded to a GPU are copied into its
  memory (on a Jetson that is the same RAM, and it must be free).
- **KV cache**, which llama.cpp allocates and fills at once: the main context (`model.context_size`
  cells) and the parallel sequences' context, which can grow to `max(4, inspection.max_batch)` slots
  of a whole context each (a prompt may be as long as the context), per layer from the GGUF's
  head counts and sizes (recurrent layers of hybrid models none; sliding-window layers in full, as
  llama.cpp's default full-size SWA cache holds them). Checked against llama.cpp's own figures for
  the demo and eight tiny model families.
- **compute buffers** of each context: the attention mask (or, without flash attention, the score
  matrix), a batch of logits and the activations, as llama.cpp reserves them (within ~10% of its own
  figures for the demo).
- **the encoder**: its weights (ONNX file or mmproj GGUF) plus working memory for one image, taken
  as half its weights and at least 32 MiB; a GGUF + mmproj bundle's, once per encoder lane
  (`model.encoder_lanes`).

Everything but the mapped CPU weights must be free now: MemAvailable, or less when a cgroup's
memory.max (v2) or memory.limit_in_bytes (v1) leaves less; on a discrete NVIDIA GPU, the part
offloaded to it against NVML's free memory.
"""

from __future__ import annotations

# The native engines load first, in their one safe order (engines.py).
from edge_runtime.inference import engines

# isort: split

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_runtime.config import Config
from edge_runtime.core.bundle.gguf_header import ArrayInfo, GGUFHeader, read_header
from edge_runtime.core.bundle.manifest import Bundle, Manifest
from edge_runtime.core.errors import BundleError, ConfigError
from edge_runtime.inference.programs import ReferenceMemory

log = logging.getLogger(__name__)

_MIN_SLOTS = 4  # the parallel context's fewest slots (llm/parallel.py)
_KV_BYTES = {"f16": 2, "f32": 4}
_MAX_LAYERS = 512  # llama.cpp's LLAMA_MAX_LAYERS
_UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a huge number


@dataclass(frozen=True)
class LanguageShape:
    """What the KV cache and compute buffers of a GGUF language model depend on."""

    weights: int
    layers: int
    kv_layer_bytes: list[int]  # K + V elements of one cell, per layer (0: a recurrent layer)
    n_vocab: int
    n_embd: int
    n_ff: int
    n_head: int
    n_embd_inp: int = 0  # the width of an image embedding the model takes (wider on Qwen3-VL: deepstack)


def _first(value: Any, default: int = 0) -> int:
    """A per-model integer that some GGUFs give per layer: the largest."""
    if isinstance(value, list):
        return max((int(v) for v in value), default=default)
    return int(value) if isinstance(value, (int, float)) else default


def _per_layer(value: Any, layers: int, default: int) -> list[int]:
    if isinstance(value, list) and len(value) == layers:
        return [max(int(v), 0) for v in value]
    return [max(_first(value, default), 0)] * layers


def language_shape(header: GGUFHeader) -> LanguageShape:
    """Read from the GGUF as llama.cpp reads it. Sliding-window layers (Gemma 3) count in full: llama.cpp's
    contexts keep a full-size SWA cache by default (swa_full), and ours keep that default."""
    arch = header.architecture
    g = lambda key, default=None: header.get(f"{arch}.{key}", default)  # noqa: E731 - a local shorthand
    layers = _first(g("block_count"), 1)
    if not 0 < layers <= _MAX_LAYERS:  # bounded before any per-layer list is built from it
        raise BundleError(f"{header.path}: {arch}.block_count {layers} is not a model's (llama.cpp takes at "
                          f"most {_MAX_LAYERS} layers)")
    n_embd = _first(g("embedding_length"), 1)
    heads = _per_layer(g("attention.head_count"), layers, 1)
    kv_heads = _per_layer(g("attention.head_count_kv"), layers, max(heads))
    # Hybrid models: recurrent layers keep a small state instead of KV (LFM2 says so with 0 KV heads).
    recurrent = g("attention.recurrent_layers")
    interval = _first(g("full_attention_interval"))
    if isinstance(recurrent, list) and len(recurrent) == layers:
        kv_heads = [0 if r else h for h, r in zip(kv_heads, recurrent, strict=True)]
    elif interval > 1:
        kv_heads = [h if (i + 1) % interval == 0 else 0 for i, h in enumerate(kv_heads)]
    head_k = _first(g("attention.key_length"), n_embd // max(max(heads), 1))
    head_v = _first(g("attention.value_length"), head_k)
    if g("attention.kv_lora_rank") is not None:  # MLA (DeepSeek-V2/V3, Kimi): one compressed row per layer
        row = _first(g("attention.kv_lora_rank")) + _first(g("rope.dimension_count"))
        kv = [row if h else 0 for h in kv_heads]
    else:
        kv = [h * (head_k + head_v) for h in kv_heads]
    tokens = header.get("tokenizer.ggml.tokens")
    n_vocab = tokens.length if isinstance(tokens, ArrayInfo) else len(tokens) if isinstance(tokens, list) else 0
    return LanguageShape(
        weights=sum(t.nbytes for t in header.tensors.values()), layers=layers, kv_layer_bytes=kv,
        n_vocab=n_vocab or _first(g("vocab_size"), 32000), n_embd=n_embd,
        n_ff=_first(g("feed_forward_length"), 4 * n_embd), n_head=max(heads),
        n_embd_inp=n_embd * (1 + _first(g("n_deepstack_layers"))))  # llama_hparams::n_embd_inp


def _pad(n: int) -> int:
    return -(-n // 256) * 256


def kv_bytes(shape: LanguageShape, cells: int, elem: int) -> int:
    """Bytes of a llama.cpp context's KV cache of `cells` cells at `elem` bytes an element."""
    return sum(shape.kv_layer_bytes) * elem * cells


def compute_bytes(shape: LanguageShape, cells: int, ubatch: int, flash: bool) -> int:
    """The largest buffers llama.cpp reserves for a step of `ubatch` tokens over `cells` cells: the
    attention mask (without flash attention, the f32 score matrix of every head), the logits of the
    batch and the activations."""
    attention = cells * ubatch * (2 if flash else 4 * shape.n_head)
    return attention + ubatch * shape.n_vocab * 4 + ubatch * (shape.n_embd * 16 + shape.n_ff * 8)


# ---- what the device has -----------------------------------------------------------------------

@dataclass(frozen=True)
class HostMemory:
    available: int  # what may be allocated now
    total: int      # what the process may ever hold (RAM, or the cgroup's limit)
    source: str


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _stat_file_bytes(text: str | None, keys: tuple[str, ...]) -> int:
    total = 0
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name in keys and value.strip().isdigit():
            total += int(value)
    return total


def _cgroup_dirs(base: Path, path: str) -> list[Path]:
    """The process's cgroup folder and its ancestors (a namespaced mount shows only its root)."""
    here = base / path.lstrip("/")
    dirs = [here, *here.parents] if here.is_dir() else [base]
    return [d for d in dirs if d == base or base in d.parents]


def host_memory(root: Path = Path("/")) -> HostMemory:
    """MemAvailable / MemTotal, lowered by a cgroup memory limit (v2 memory.max or v1
    memory.limit_in_bytes, on the process's cgroup and its ancestors) where one is set."""
    meminfo = {k: int(v.split()[0]) * 1024 for k, _, v in
               (line.partition(":") for line in (_read(root / "proc/meminfo") or "").splitlines()) if v.strip()}
    available = meminfo.get("MemAvailable", meminfo.get("MemFree", 0))
    total = meminfo.get("MemTotal", available)
    best = HostMemory(available, total, "MemAvailable")
    for line in (_read(root / "proc/self/cgroup") or "").splitlines():
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if controllers == "" and (root / "sys/fs/cgroup/cgroup.controllers").exists():
            dirs, limit_file, usage_file = _cgroup_dirs(root / "sys/fs/cgroup", path), "memory.max", "memory.current"
            cache_keys: tuple[str, ...] = ("active_file", "inactive_file")
        elif "memory" in controllers.split(","):
            dirs = _cgroup_dirs(root / "sys/fs/cgroup/memory", path)
            limit_file, usage_file, cache_keys = "memory.limit_in_bytes", "memory.usage_in_bytes", \
                ("total_active_file", "total_inactive_file")
        else:
            continue
        for d in dirs:
            limit = (_read(d / limit_file) or "").strip()
            if not limit.isdigit() or int(limit) >= _UNLIMITED:
                continue
            usage = int((_read(d / usage_file) or "0").strip() or 0)
            free = int(limit) - usage + _stat_file_bytes(_read(d / "memory.stat"), cache_keys)
            if free < best.available or int(limit) < best.total:
                best = HostMemory(min(free, best.available), min(int(limit), best.total),
                                  f"cgroup {limit_file} of {d}")
    return best


def gpu_free() -> int | None:
    """Free memory of GPU 0 from NVML (llama.cpp's main GPU), or None where NVML does not answer."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).free)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no GPU, no library: the GPU part is not checked
        return None


def unified_memory(root: Path = Path("/")) -> bool:
    """A Jetson: its GPU memory is the host's RAM."""
    return (root / "etc/nv_tegra_release").exists()


# ---- what the bundle needs -----------------------------------------------------------------------

def _size(n: float) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    if n >= 2**20:
        return f"{n / 2**20:.0f} MiB" if n >= 10 * 2**20 else f"{n / 2**20:.1f} MiB"
    return f"{n / 2**10:.1f} KiB" if n >= 2**10 else f"{int(n)} B"


@dataclass(frozen=True)
class Need:
    """The figures of one bundle under one config, and where each part lives."""

    weights: int
    kv: int
    compute: int
    encoder: int
    kv_per_token: int    # of the main context, all layers
    cells: int           # KV cells of both contexts
    slots: int
    gpu_share: float     # of the language model's layers on a GPU (0 without offload)
    encoder_on_gpu: bool
    encoder_lanes: int = 1  # libmtmd contexts `encoder` counts (model.encoder_lanes; ONNX bundles: 1)

    def on_gpu(self) -> int:
        part = self.gpu_share * (self.weights + self.kv) + (self.compute if self.gpu_share else 0)
        return int(part + (self.encoder if self.encoder_on_gpu else 0))

    def host_resident(self, unified: bool) -> int:
        """What must be free in RAM: all but the CPU layers' mapped weights (all of it on a Jetson)."""
        gpu = self.on_gpu()
        return int((1 - self.gpu_share) * self.kv + (0 if self.gpu_share else self.compute)
                   + (0 if self.encoder_on_gpu else self.encoder) + (gpu if unified else 0))

    def figures(self, config: Config) -> str:
        m = config.model
        return (f"weights {_size(self.weights)}, KV cache {_size(self.kv)} (model.context_size {m.context_size} "
                f"tokens x (1 + {self.slots} parallel sequences, inspection.max_batch {config.inspection.max_batch}) "
                f"x {_size(self.kv_per_token)} a token at model.kv_cache_type {m.kv_cache_type}), "
                f"compute buffers {_size(self.compute)}, encoder {_size(self.encoder)}"
                + (f" (model.encoder_lanes {self.encoder_lanes} x {_size(self.encoder // self.encoder_lanes)})"
                   if self.encoder_lanes > 1 else ""))


def _offload_share(gpu_layers: int, layers: int, gpu_offload: bool) -> float:
    if not gpu_offload or gpu_layers == 0:
        return 0.0
    return 1.0 if gpu_layers < 0 or gpu_layers >= layers else gpu_layers / layers


def need_of(bundle: Bundle, config: Config, gpu_offload: bool) -> Need:
    """Count the bundle's memory under `config` from its headers and file sizes (nothing loads)."""
    m = config.model
    elem, flash, ubatch = _KV_BYTES[m.kv_cache_type], m.flash_attention_on(), m.batch_size
    lm = language_shape(read_header(bundle.language_path))
    main = _pad(m.context_size)
    slots = max(_MIN_SLOTS, config.inspection.max_batch)
    parallel = main * slots  # every slot may hold a whole context (llm/parallel.py grows it to that)
    weights = lm.weights
    kv = kv_bytes(lm, main + parallel, elem)
    # With a KV stream per sequence a step attends over one slot's cells; unified, over all of them.
    attended = main if m.batch_kv_cache == "per_sequence" else parallel
    compute = compute_bytes(lm, main, ubatch, flash) + compute_bytes(lm, attended, ubatch, flash)
    if m.draft_model is not None:
        draft = language_shape(read_header(m.draft_model))
        weights += draft.weights
        kv += kv_bytes(draft, main, elem)
        compute += compute_bytes(draft, main, ubatch, flash)
    share = _offload_share(m.gpu_layers, lm.layers, gpu_offload)
    if isinstance(bundle.manifest, Manifest):
        vision = bundle.vision_fp16_path if m.vision_precision == "fp16" and bundle.vision_fp16_path else \
            bundle.vision_path
        encoder_weights = vision.stat().st_size if vision is not None else 0
        gpu_providers = {"CUDAExecutionProvider", "TensorrtExecutionProvider"}
        encoder_on_gpu = bool(gpu_providers & set(m.providers) & set(engines.onnxruntime.get_available_providers()))
    else:
        assert bundle.mmproj_path is not None
        encoder_weights = sum(t.nbytes for t in read_header(bundle.mmproj_path).tensors.values())
        encoder_on_gpu = share > 0  # libmtmd uses the GPU when the language model does (llm/mtmd.py)
    encoder = encoder_weights + max(encoder_weights // 2, 32 * 2**20)
    # each libmtmd lane holds the mmproj and its buffers again; an ONNX bundle has one session
    lanes = 1 if isinstance(bundle.manifest, Manifest) else m.encoder_lanes
    per_token = kv_bytes(lm, 1, elem)
    return Need(weights, kv, compute, encoder * lanes, per_token, main + parallel, slots, share, encoder_on_gpu,
                lanes)


def check_fit(bundle: Bundle, config: Config, gpu_offload: bool, host: HostMemory | None = None,
              gpu: int | None = None, unified: bool | None = None) -> Need:
    """Raise ConfigError, naming the figures and the keys that lower them, when the bundle cannot fit;
    return the figures otherwise. `host`, `gpu` (free bytes) and `unified` default to this machine's."""
    need = need_of(bundle, config, gpu_offload)
    host = host if host is not None else host_memory()
    unified = unified if unified is not None else unified_memory()
    resident = need.host_resident(unified)
    mapped = int((1 - need.gpu_share) * need.weights)
    problem = ""
    if resident > host.available:
        problem = f"{_size(resident)} must be free in RAM but {_size(host.available)} is ({host.source})"
    elif resident + mapped > host.total:
        problem = (f"{_size(resident + mapped)} of RAM is needed (the mapped weights included) but the device "
                   f"has {_size(host.total)} ({host.source})")
    elif need.on_gpu() and not unified:
        free = gpu if gpu is not None else gpu_free()
        if free is not None and need.on_gpu() > free:
            problem = f"{_size(need.on_gpu())} must be free on the GPU (model.gpu_layers {config.model.gpu_layers}) " \
                      f"but {_size(free)} is (NVML)"
    if problem:
        raise ConfigError(f"{bundle.name} does not fit this device's memory: {problem}; it needs "
                          f"{need.figures(config)}. Lower model.context_size"
                          + (", inspection.max_batch or model.encoder_lanes" if need.encoder_lanes > 1
                             else " or inspection.max_batch")
                          + ", pick a smaller model, or set model.memory_check: false to load it anyway")
    log.info("model: memory needed %s; %s available (%s)", need.figures(config), _size(host.available),
             host.source)
    return need


# ---- what the programs' references hold ----------------------------------------------------------

def check_references_fit(refs: ReferenceMemory, bundle: Bundle, config: Config, gpu_offload: bool,
                         host: HostMemory | None = None, unified: bool | None = None, loaded: bool = True) -> None:
    """Raise ConfigError, one line naming the programs and the figures, when the inspection programs'
    reference embeddings (host arrays, on every device) cannot fit: with the model `loaded` (start,
    reload), the ones not held yet must be free now and all of them fit the device's RAM beside the
    model (`need_of`, the mapped weights included); before (`config validate`, which may run beside a
    daemon holding its own model), only the latter."""
    if not refs.total:
        return
    host = host if host is not None else host_memory()
    unified = unified if unified is not None else unified_memory()
    need = need_of(bundle, config, gpu_offload)
    model = need.host_resident(unified) + int((1 - need.gpu_share) * need.weights)
    if loaded and refs.new > host.available:
        problem = (f"{_size(refs.new)} more must be free in RAM but {_size(host.available)} is ({host.source})"
                   + (f" ({_size(refs.total - refs.new)} of them are held already)" if refs.new < refs.total else ""))
    elif model + refs.total > host.total:
        problem = (f"with the model ({_size(model)}) {_size(model + refs.total)} of RAM is needed but the device "
                   f"has {_size(host.total)} ({host.source})")
    else:
        log.info("programs: references hold %s (%d images, %d image tokens)", _size(refs.total), refs.images,
                 refs.tokens)
        return
    images = f"{refs.images} distinct image" + ("s" if refs.images != 1 else "")
    ranked = sorted(refs.programs.items(), key=lambda kv: -kv[1])
    shown = ", ".join(f"programs.{name} {_size(n)}" for name, n in ranked[:8]) + (
        f" and {len(ranked) - 8} more programs" if len(ranked) > 8 else "")
    raise ConfigError(
        f"the inspection programs' references do not fit this device's memory: {problem}; their embeddings take "
        f"{_size(refs.total)} ({images}, {refs.tokens} image tokens at "
        f"{_size(refs.total / max(refs.tokens, 1))} a token as held, rows of {refs.n_embd} float32): {shown}. "
        "Use fewer or smaller references or a lower programs.<name>.image_tokens.max, or set "
        "model.memory_check: false to load them anyway")


def references_check(bundle: Bundle, config: Config) -> Callable[[ReferenceMemory], None] | None:
    """What start and reload give `Inspector.use_programs` to check the references' memory (None when
    model.memory_check is off)."""
    if not config.model.memory_check:
        return None
    from edge_runtime.inference.llm.runtime import engine_info

    gpu_offload = bool(engine_info()["gpu_offload"])
    return lambda refs: check_references_fit(refs, bundle, config, gpu_offload)
