"""Model bundles, checked before anything loads: format 1 is `bundle.yaml` + `vision.onnx` (the ONNX
encoder) + `language.gguf`; format 2 is `bundle.yaml` + a llama.cpp language GGUF + its mmproj GGUF.

Every failure is a `BundleError` whose message is one sentence naming the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edge_runtime.core.errors import BundleError, InputError

MANIFEST = "bundle.yaml"
MAX_CHAT_TEMPLATE = 128 * 1024  # characters: real chat templates are 1-20 kB


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BundleFile(_Strict):
    path: str = Field(description="File name inside the bundle folder.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Lower-case hex SHA-256 of the file.")


class BundleFiles(_Strict):
    vision: BundleFile
    language: BundleFile
    vision_fp16: BundleFile | None = Field(
        None, description="Optional half-precision encoder (same inputs/outputs) for model.vision_precision fp16.")


class Clahe(_Strict):
    clip_limit: float = Field(2.0, gt=0, description="OpenCV CLAHE clip limit.")
    tile_grid: int = Field(8, ge=1, le=64, description="Tiles per side.")


class Tiling(_Strict):
    longest_edge: int = Field(ge=8, le=4096, description="The frame's longest edge is first resized to this.")


class Preprocess(_Strict):
    width: int = Field(ge=8, le=4096, description="Encoder input width in pixels (the tile size when tiling).")
    height: int = Field(ge=8, le=4096, description="Encoder input height in pixels (the tile size when tiling).")
    resize: Literal["nearest", "linear", "area", "cubic", "lanczos", "pil_bilinear", "pil_bicubic",
                    "pil_lanczos"] = Field(
        "area", description="Interpolation: OpenCV's, or Pillow's (pil_*) to match a Hugging Face processor exactly.")
    keep_aspect: bool = Field(False, description="Letterbox instead of stretching.")
    shortest_edge: int | None = Field(
        None, ge=8, le=8192,
        description="Resize the shortest edge to this, then centre-crop width x height (CLIP-style processors).")
    tiling: Tiling | None = Field(
        None, description="Idefics3/SmolVLM-style tiling: tiles of width x height plus a global image.")
    mean: list[float] = Field(min_length=3, max_length=3, description="Per-channel RGB mean (0-1 scale).")
    std: list[float] = Field(min_length=3, max_length=3, description="Per-channel RGB std (0-1 scale).")
    clahe: Clahe | None = Field(None, description="Equalise uneven lighting on the luminance channel.")


class ImageLayout(_Strict):
    """How image embeddings enter the prompt, for models whose tokenizer has an image token."""

    image_token: str = Field(description="The tokenizer's image placeholder token; each one takes one embedding.")
    kind: Literal["single", "idefics3"] = Field(
        "single", description="single: N image tokens at {image}; idefics3: tile grid with row/col markers.")
    fake_token: str = Field("", description="idefics3: the token around each tile.")
    global_token: str = Field("", description="idefics3: the token before the global image.")


class VisionInfo(_Strict):
    input: str = Field("pixel_values", description="ONNX input name.")
    output: str = Field("image_embeds", description="ONNX output name.")
    image_tokens: int = Field(ge=1, description="Embeddings per image or tile (N).")
    embedding_dim: int = Field(ge=1, description="Width of each embedding (D).")
    layout: ImageLayout | None = Field(
        None, description="Unset: the embeddings go straight in at {image} (no image token in the vocabulary).")


class LanguageInfo(_Strict):
    embedding_dim: int = Field(ge=1, description="The GGUF model's embedding width.")
    quantization: str = Field("", description="Informational: Q4_K_M, Q8_0, …")
    context_length: int = Field(2048, ge=64, description="Training context of the model.")


class PromptInfo(_Strict):
    template: str = Field(description="Prompt layout with {system}, {image} and {prompt} placeholders.")
    system: str = Field("", description="System text.")
    default: str = Field(description="The inspection question asked when none is given.")


class Generation(_Strict):
    max_tokens: int = Field(256, ge=1, le=8192, description="Upper bound on verdict tokens.")


class Manifest(_Strict):
    format: Literal[1] = 1
    name: str
    version: str = "0"
    description: str = ""
    files: BundleFiles
    preprocess: Preprocess
    vision: VisionInfo
    language: LanguageInfo
    prompt: PromptInfo
    verdict_schema: dict[str, Any]
    generation: Generation = Generation()


    @property
    def mtmd(self) -> None:
        """Format 1 has no mmproj: always None (format 2's manifest has its MtmdInfo here)."""
        return None


class PairFiles(_Strict):
    language: BundleFile = Field(description="The llama.cpp language model GGUF.")
    mmproj: BundleFile = Field(description="The llama.cpp multimodal projector GGUF (libmtmd's mmproj).")


class MtmdInfo(_Strict):
    projector: str = Field(description="clip.projector_type read from the mmproj header.")
    embedding_dim: int = Field(ge=1, description="The LM's input embedding width the projector outputs.")
    image_max_tokens: int = Field(1024, ge=1, le=65536,
                                  description="Caps an image's tokens and the warm-up's compute reservation.")


class MmprojManifest(_Strict):
    format: Literal[2]
    name: str = Field(min_length=1, max_length=200)
    version: str = "0"
    description: str = ""
    files: PairFiles
    mtmd: MtmdInfo
    chat_template: str | None = Field(None, max_length=MAX_CHAT_TEMPLATE,
                                      description="tokenizer.chat_template of the LM GGUF (null if it has none).")
    prompt: PromptInfo
    verdict_schema: dict[str, Any]
    generation: Generation = Generation()


class Bundle:
    """A checked bundle on disk: its manifest and the absolute paths of its model files."""

    def __init__(self, root: Path, manifest: Manifest | MmprojManifest) -> None:
        self.root = root
        self.manifest = manifest
        self.language_path = root / manifest.files.language.path
        self.kind: Literal["onnx", "mmproj"]
        self.vision_path: Path | None = None
        self.vision_fp16_path: Path | None = None
        self.mmproj_path: Path | None = None
        self.quantization = ""  # of the language model, from its header (format 2) or the manifest
        if isinstance(manifest, MmprojManifest):
            self.kind = "mmproj"
            self.mmproj_path = root / manifest.files.mmproj.path
        else:
            self.kind = "onnx"
            self.vision_path = root / manifest.files.vision.path
            fp16 = manifest.files.vision_fp16
            self.vision_fp16_path = root / fp16.path if fp16 else None
            self.quantization = manifest.language.quantization

    @property
    def name(self) -> str:
        return f"{self.manifest.name}@{self.manifest.version}"

    @property
    def onnx_manifest(self) -> Manifest:
        """The format-1 manifest, for code of the ONNX-encoder path (BundleError on a format-2 bundle)."""
        if not isinstance(self.manifest, Manifest):
            raise BundleError(f"{self.root} is a GGUF + mmproj bundle (format 2), not an ONNX-encoder bundle")
        return self.manifest

    def describe(self) -> dict[str, Any]:
        m = self.manifest
        head = {"name": m.name, "version": m.version, "path": str(self.root), "kind": self.kind,
                "quantization": self.quantization}
        if isinstance(m, MmprojManifest):
            return {**head, "projector": m.mtmd.projector, "embedding_dim": m.mtmd.embedding_dim,
                    "image_max_tokens": m.mtmd.image_max_tokens,
                    "files": {"language": m.files.language.path, "mmproj": m.files.mmproj.path}}
        return {**head, "image_tokens": m.vision.image_tokens, "embedding_dim": m.vision.embedding_dim,
                "input_size": [m.preprocess.width, m.preprocess.height]}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_bundle(root: Path | str, verify_checksums: bool = True) -> Bundle:
    """Read and check a bundle folder; raise BundleError with one clear sentence on any problem."""
    root = Path(root).expanduser().resolve()
    manifest_path, manifest = read_manifest(root)
    if isinstance(manifest, MmprojManifest):
        from edge_runtime.core.bundle.pair import check_pair_fit

        bundle = Bundle(root, manifest)
        for role, entry in (("language", manifest.files.language), ("mmproj", manifest.files.mmproj)):
            if Path(entry.path).name != entry.path or entry.path in ("", ".", ".."):
                raise BundleError(f"{manifest_path}: files.{role}.path {entry.path!r} must be a file name "
                                  "inside the bundle folder")
            _check_file(root / entry.path, role, entry, verify_checksums)
        assert bundle.mmproj_path is not None
        bundle.quantization = check_pair_fit(bundle.language_path, bundle.mmproj_path, manifest.mtmd.projector,
                                             manifest.mtmd.embedding_dim, manifest.prompt.template, manifest_path)
        _check_schema(manifest_path, manifest.verdict_schema)
        return bundle

    bundle = Bundle(root, manifest)
    for role, path, entry in onnx_files(bundle, manifest):
        _check_file(path, role, entry, verify_checksums)
    _check_schema(manifest_path, manifest.verdict_schema)
    _check_widths(bundle, manifest)
    return bundle


def _check_file(path: Path, role: str, entry: BundleFile, verify_checksums: bool) -> None:
    if not path.is_file():
        raise BundleError(f"{path} is missing: bundle.yaml lists it as the {role} model")
    if verify_checksums and sha256_file(path) != entry.sha256:
        raise BundleError(f"{path} does not match its sha256 in bundle.yaml (corrupt or replaced file)")


def onnx_files(bundle: Bundle, manifest: Manifest) -> list[tuple[str, Path, BundleFile]]:
    files = [("vision", manifest.files.vision), ("language", manifest.files.language)]
    if manifest.files.vision_fp16 is not None:
        files.append(("vision_fp16", manifest.files.vision_fp16))
    return [(role, bundle.root / entry.path, entry) for role, entry in files]


def read_manifest(root: Path) -> tuple[Path, Manifest | MmprojManifest]:
    """bundle.yaml of a folder, validated as format 1 or format 2."""
    manifest_path = root / MANIFEST
    if not root.is_dir():
        raise BundleError(f"model bundle {root} does not exist or is not a folder")
    if not manifest_path.is_file():
        raise BundleError(f"{manifest_path} is missing: a bundle folder needs a {MANIFEST}")
    try:
        raw = yaml.safe_load(manifest_path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise BundleError(f"{manifest_path} is not valid YAML: {_first_line(exc)}") from None
    model = MmprojManifest if isinstance(raw, dict) and raw.get("format") == 2 else Manifest
    try:
        manifest = model.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise BundleError(f"{manifest_path}: {where}: {err['msg']}") from None
    return manifest_path, manifest


def check_schema(manifest_path: Path, schema: dict[str, Any]) -> None:
    """The verdict schema is a JSON-schema object within the complexity budget."""
    _check_schema(manifest_path, schema)


def _check_schema(manifest_path: Path, schema: dict[str, Any]) -> None:
    from jsonschema import Draft202012Validator, SchemaError

    from edge_runtime.core.schema_budget import check_schema_budget

    try:  # the same complexity budget as a client's schema, before anything recursive reads it
        check_schema_budget(schema, "verdict_schema")
    except InputError as exc:
        raise BundleError(f"{manifest_path}: {exc}") from None
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise BundleError(f"{manifest_path}: verdict_schema is not a valid JSON schema: {exc.message}") from None
    if schema.get("type") != "object":
        raise BundleError(f"{manifest_path}: verdict_schema must describe a JSON object")
    json.dumps(schema)


def _check_widths(bundle: Bundle, m: Manifest) -> None:
    """The vision output width, the manifest and the GGUF embedding width must all agree."""
    assert bundle.vision_path is not None  # format 1 always has one
    onnx_tokens, onnx_dim = onnx_output_shape(bundle.vision_path, m.vision.output)
    gguf_dim = gguf_embedding_width(bundle.language_path)
    if onnx_dim is not None and onnx_dim != m.vision.embedding_dim:
        raise BundleError(f"{bundle.vision_path} outputs embeddings of width {onnx_dim}, "
                          f"but bundle.yaml says {m.vision.embedding_dim}")
    if onnx_tokens is not None and onnx_tokens != m.vision.image_tokens:
        raise BundleError(f"{bundle.vision_path} outputs {onnx_tokens} image tokens, "
                          f"but bundle.yaml says {m.vision.image_tokens}")
    if gguf_dim != m.vision.embedding_dim:
        raise BundleError(f"{bundle.language_path} has embedding width {gguf_dim}, but the vision "
                          f"model outputs {m.vision.embedding_dim}: the two halves do not fit together")


def onnx_output_shape(path: Path, output: str) -> tuple[int | None, int | None]:
    """(N, D) of the named output of an ONNX file, None where the dimension is symbolic."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - onnx raises several unrelated types for bad files
        raise BundleError(f"{path} is not a readable ONNX model: {_first_line(exc)}") from None
    outputs = {o.name: o for o in model.graph.output}
    if output not in outputs:
        raise BundleError(f"{path} has no output named {output!r} (it has {sorted(outputs)})")
    dims = outputs[output].type.tensor_type.shape.dim
    if len(dims) != 3:
        raise BundleError(f"{path}: output {output!r} must be [batch, tokens, width], has {len(dims)} dims")
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in dims[1:])  # type: ignore[return-value]


def gguf_embedding_width(path: Path) -> int:
    """Read `<arch>.embedding_length` from a GGUF header without loading the weights (bounded reader)."""
    from edge_runtime.core.bundle.gguf_header import read_header

    header = read_header(path)
    return int(header.require(f"{header.architecture}.embedding_length", int))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def demo_bundle_dir(data_dir: Path) -> Path:
    """Where the demo bundle is built (`model_source.ensure_demo_bundle` builds it)."""
    return data_dir / "models" / "demo"
