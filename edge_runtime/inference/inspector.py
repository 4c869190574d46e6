"""Image -> Result: preprocess (OpenCV), encode (ONNX Runtime or libmtmd), generate (llama.cpp), timings.

Two bundle kinds (core/bundle/manifest.py): format 1 (ONNX vision encoder + language GGUF) and format 2 (a
language GGUF + its mmproj GGUF, encoded by libmtmd, llm/mtmd.py); both end in the same prompt
segments and the same generation path (prefix reuse, batched sequences, constraints).

The work is split in two halves so a caller can overlap them: `encode()` (preprocess + vision,
thread-safe) and `generate()` (the language model, one at a time under a lock).
"""

from __future__ import annotations

# The native engines load first, in their one safe order (engines.py).
from edge_runtime.inference import engines  # noqa: F401

# isort: split

import dataclasses
import json
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import cv2
import numpy as np
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from edge_runtime.config import CameraConfig, ImageLimits, ModelConfig
from edge_runtime.config.programs import ProgramConfig
from edge_runtime.core.batch import BatchJob, ChatWork, ClipFrame, Encoded
from edge_runtime.core.bundle.manifest import Bundle, Manifest
from edge_runtime.core.device import ChatJob
from edge_runtime.core.errors import BundleError, ConfigError, InferenceError, InputError
from edge_runtime.core.result import FrameInfo, Result
from edge_runtime.inference.clips import ClipEncoded, clip_stamps, encode_clip
from edge_runtime.inference.encoder_cache import Box, EncodeKey, EncoderCache, frozen, pixels_digest
from edge_runtime.inference.llm.feed import Generation, Head, ImagePart, Segment
from edge_runtime.inference.llm.grammar import schema_to_grammar
from edge_runtime.inference.llm.model import LanguageModel
from edge_runtime.inference.llm.mtmd import MAX_IMAGE_PIXELS, MediaEmbeds, MtmdContext
from edge_runtime.inference.llm.parallel import Item, Prompt
from edge_runtime.inference.llm.picker import GREEDY, Sampling
from edge_runtime.inference.programs import REFERENCE_TEXT, LoadedProgram, changed_references, load_programs
from edge_runtime.inference.prompt_layout import image_prompt, split_at_image_tokens  # moved: the exporter uses them
from edge_runtime.inference.regions import RegionOutcome, RegionsEncoded, RegionSpec, frame_regions, judge, overall
from edge_runtime.inference.token_cache import TokenCache
from edge_runtime.inference.vision import Preprocessor, VisionEncoder

log = logging.getLogger(__name__)
_IMAGE = "\x00image\x00"
_WARMUP_SIZE = (448, 336)  # the grey warm-up frame of a format-2 bundle (width, height)


_SCHEMAS_KEPT = 32  # per-request verdict schemas whose grammar and validator are kept (a line's recipes)


@dataclass(frozen=True)
class VerdictRules:
    """What a verdict schema becomes once: the grammar that constrains it and the validator that checks it."""

    grammar: str
    validator: Draft202012Validator


Work = BatchJob | ChatWork  # what `Inspector.serve` generates: a camera's verdict or a chat completion
Served = Callable[[Work, Result | Generation | Exception], None]


class SchemaRefused(InputError, InferenceError):
    """A request's own verdict schema is refused (an InputError naming `schema`; an InferenceError
    too, so a batch reports it in its place like any other failed verdict)."""


@dataclass
class MediaEncoded(Encoded):
    """A frame encoded by libmtmd: the prompt segments of its image (projector tokens, MediaEmbeds);
    `embeds` holds all its embeddings stacked, for what reads them as one block."""

    parts: list[Segment] = field(default_factory=list)


def check_crop(frame: np.ndarray, crop: Box) -> None:
    """A crop box must lie inside the frame and hold at least one pixel (InputError naming `crop`)."""
    x, y, w, h = crop
    fh, fw = frame.shape[:2]
    if w < 1 or h < 1 or x < 0 or y < 0 or x + w > fw or y + h > fh:
        raise InputError(f"crop: [{x}, {y}, {w}, {h}] is not inside the {fw}x{fh} frame", field="crop")


def encoded_bytes(enc: Encoded) -> int:
    """What an encoding holds in memory: its embeddings, and for libmtmd its chunks' blocks and positions."""
    total = enc.embeds.nbytes + 256
    if isinstance(enc, MediaEncoded):
        for part in enc.parts:
            if isinstance(part, MediaEmbeds):
                total += part.embeds.nbytes
                total += sum(a.nbytes for a in (part.mrope, part.mrope_shift) if a is not None)
            elif isinstance(part, np.ndarray):
                total += part.nbytes
            else:
                total += 8 * len(part)
    return total


def freeze(enc: Encoded) -> Encoded:
    """The encoding with its arrays read-only: the cache hands the same arrays to every hit."""
    frozen(enc.embeds)
    if isinstance(enc, MediaEncoded):
        for part in enc.parts:
            if isinstance(part, MediaEmbeds):
                frozen(part.embeds)
                for a in (part.mrope, part.mrope_shift):
                    if a is not None:
                        frozen(a)
            elif isinstance(part, np.ndarray):
                frozen(part)
    return enc


def media_parts(encs: Sequence[Encoded]) -> tuple[list[int], list[Segment], list[int]]:
    """libmtmd encodings in order as (tokens before, segments, tokens after).

    The projector's begin and end markers go with the text around the images, as
    mtmd_helper_eval_chunks decodes them: two llama_decode calls fewer per image, and the first begin
    marker joins the cached prefix. Between two images, one's end marker and the next one's begin
    marker are one token run, as libmtmd tokenizes the (empty) text between two media markers."""
    head: list[int] = []
    middle: list[Segment] = []
    tail: list[int] = []
    for k, enc in enumerate(encs):
        if not isinstance(enc, MediaEncoded):
            raise InferenceError("this bundle's images are encoded by libmtmd: use Inspector.encode()")
        parts = list(enc.parts)
        begin: list[int] = []
        end: list[int] = []
        if parts and isinstance(first := parts[0], list):
            begin, parts = first, parts[1:]
        if parts and isinstance(last := parts[-1], list):
            end, parts = last, parts[:-1]
        if k == 0:
            head = begin
        elif tail or begin:
            middle.append(tail + begin)
        middle.extend(parts)
        tail = end
    return head, middle, tail


class _Collected:
    """A frame's regions as their sequences finish (serve's `done` hears of them one by one)."""

    def __init__(self, enc: RegionsEncoded, nok_field: str,
                 parse: Callable[[Generation, VerdictRules | None], dict[str, Any]]) -> None:
        self.enc, self.nok_field, self.parse = enc, nok_field, parse
        self.outcomes: list[RegionOutcome | None] = [None] * len(enc.regions)
        self.gens: list[Generation] = []
        self.pending = 0

    def add(self, k: int, rules: VerdictRules | None, outcome: Generation | Exception) -> None:
        spec = self.enc.regions[k][0]
        self.pending -= 1
        if isinstance(outcome, Exception):
            self.outcomes[k] = judge(spec, None, "", self.nok_field, str(outcome))
            return
        self.gens.append(outcome)
        try:
            verdict = self.parse(outcome, rules)
        except InferenceError as exc:
            self.outcomes[k] = judge(spec, None, outcome.text, self.nok_field, str(exc))
            return
        self.outcomes[k] = judge(spec, verdict, outcome.text, self.nok_field)


class Inspector:
    """One loaded bundle serving every camera and API request."""

    def __init__(self, bundle: Bundle, settings: ModelConfig, device_id: str,
                 encoder_cache: EncoderCache[Encoded] | None = None) -> None:
        self.bundle = bundle
        self.settings = settings
        self.device_id = device_id
        m = bundle.manifest
        onnx = m if isinstance(m, Manifest) else None
        self.preprocessor: Preprocessor | None = Preprocessor(onnx.preprocess) if onnx is not None else None
        self.vision: VisionEncoder | None = None
        self.mtmd: MtmdContext | None = None
        self._lock = threading.Lock()
        self.ready = False
        # Every step below may fail (a bad file, a refused grammar, the warm-up): the stack frees
        # what the steps before it built, so a failed load or reload leaks no native memory.
        with ExitStack() as stack:
            self.language = stack.enter_context(LanguageModel(
                bundle.language_path, settings.context_size, settings.threads, settings.gpu_layers,
                settings.batch_size, settings.reuse_prefix_cache, settings.kv_cache_type,
                settings.constraint_engine, settings.fast_forward, m.files.language.sha256,
                settings.batch_kv_cache, settings.flash_attention_on(), settings.draft_model,
                settings.draft_tokens, settings.steady_steps))
            if onnx is None:  # format 2: libmtmd encodes with the mmproj, over the loaded language model
                assert bundle.mmproj_path is not None and m.mtmd is not None
                self.mtmd = stack.enter_context(MtmdContext(
                    bundle.mmproj_path, self.language.model_ptr, settings.threads, settings.gpu_layers != 0,
                    m.mtmd.image_max_tokens))
            else:
                vision_path = bundle.vision_path
                if settings.vision_precision == "fp16" and bundle.vision_fp16_path is not None:
                    vision_path = bundle.vision_fp16_path
                assert vision_path is not None
                self.vision = stack.enter_context(VisionEncoder(vision_path, onnx.vision.input, onnx.vision.output,
                                                                settings.providers, settings.threads))
            self.encoder_id = self._encoder_identity()
            self.encoder_cache: EncoderCache[Encoded] = (
                encoder_cache if encoder_cache is not None
                else EncoderCache(settings.encoder_cache_mb * 1024 * 1024, encoded_bytes))
            self.default_prompt = settings.prompt or m.prompt.default
            self.max_tokens = settings.max_tokens or m.generation.max_tokens
            try:  # a schema the grammar cannot hold the model to, or the engine cannot take
                self.grammar = schema_to_grammar(m.verdict_schema, "verdict_schema")
                self.language.check_grammar(self.grammar)
            except InputError as exc:
                why = str(exc).removeprefix("response_format.json_schema: ").removeprefix("verdict_schema: ")
                raise BundleError(f"{bundle.root / 'bundle.yaml'}: verdict_schema: {why}") from None
            self.validator = Draft202012Validator(m.verdict_schema)
            self._bundle_rules = VerdictRules(self.grammar, self.validator)
            self._rules: OrderedDict[str, VerdictRules] = OrderedDict()  # per-request schemas (verdict_rules)
            self._rules_lock = threading.Lock()
            self._token_cache = TokenCache(settings.token_cache_bytes)
            # Inspection programs (programs.py): by name, and the one each camera names; replaced whole.
            self._programs: tuple[dict[str, LoadedProgram], dict[str, LoadedProgram]] = ({}, {})
            self.max_prompt_bytes = self.language.n_ctx * self.language.max_token_bytes
            self._image_token = -1
            if onnx is not None and onnx.vision.layout is not None:
                ids = self.language.tokenize(onnx.vision.layout.image_token)
                if len(ids) != 1:
                    raise BundleError(f"{bundle.root / 'bundle.yaml'}: vision.layout.image_token "
                                      f"{onnx.vision.layout.image_token!r} is not one token of the language model")
                self._image_token = ids[0]
            if settings.warmup:
                self.warm_up()
            self._stack = stack.pop_all()
        self.ready = True

    def __enter__(self) -> Inspector:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def model_name(self) -> str:
        return self.bundle.name

    def warm_up(self) -> None:
        """One full inspection of a grey frame: allocates buffers, fills the prefix cache."""
        t0 = time.perf_counter()
        m = self.bundle.manifest
        width, height = (m.preprocess.width, m.preprocess.height) if isinstance(m, Manifest) else _WARMUP_SIZE
        self.inspect(np.full((height, width, 3), 127, np.uint8), camera="warmup")
        log.info("inspector: warmed up in %.0f ms", (time.perf_counter() - t0) * 1000)

    def _encoder_identity(self) -> str:
        """What, besides the pixels, crop and token budget, decides this encoder's output."""
        m = self.bundle.manifest
        if self.mtmd is not None:
            assert m.mtmd is not None and not isinstance(m, Manifest)
            return (f"mtmd:{m.files.mmproj.sha256}:{m.files.language.sha256}:"
                    f"gpu={int(not self.mtmd.on_cpu)}:{m.mtmd.projector}")
        assert isinstance(m, Manifest) and self.vision is not None
        fp16 = self.settings.vision_precision == "fp16" and m.files.vision_fp16 is not None
        vision = m.files.vision_fp16 if fp16 and m.files.vision_fp16 is not None else m.files.vision
        return f"onnx:{vision.sha256}:{','.join(self.vision.providers)}:{m.preprocess.model_dump_json()}"

    @property
    def image_budget(self) -> int:
        """The image token budget the encoder runs under (libmtmd's image_max_tokens; 0: fixed)."""
        return self.mtmd.image_max_tokens if self.mtmd is not None else 0

    def encode(self, frame: np.ndarray, crop: Box | None = None, digest: str | None = None,
               tokens: tuple[int, int] | None = None) -> Encoded:
        """The frame's (or its `crop`'s) image embeddings: from the encoder cache when these pixels were
        encoded the same way before (encoder_cache.py), else encoded and kept."""
        t0 = time.perf_counter()
        if crop is not None:
            check_crop(frame, crop)
        key = EncodeKey(digest or pixels_digest(frame), self.encoder_id, crop, tokens or self.image_budget)
        t1 = time.perf_counter()
        hit = self.encoder_cache.get(key) if self.encoder_cache.budget > 0 else None
        if hit is not None:  # what the frame cost: hashing its pixels (preprocess), the lookup (encode)
            return dataclasses.replace(hit, preprocess_ms=(t1 - t0) * 1000,
                                       encode_ms=(time.perf_counter() - t1) * 1000)
        x, y, w, h = crop if crop is not None else (0, 0, frame.shape[1], frame.shape[0])
        enc = self._encode(frame[y:y + h, x:x + w], tokens)
        if self.encoder_cache.budget > 0:
            self.encoder_cache.put(key, freeze(enc))
        return enc

    def _encode(self, frame: np.ndarray, tokens: tuple[int, int] | None = None) -> Encoded:
        if self.mtmd is not None:
            return self._encode_mtmd(frame, tokens)
        if tokens is not None:
            raise InputError("image_tokens: this bundle's ONNX encoder makes a fixed number of image tokens",
                             field="image_tokens")
        assert self.preprocessor is not None and self.vision is not None
        t0 = time.perf_counter()
        pixels, grid = self.preprocessor.process(frame)
        t1 = time.perf_counter()
        out = self.vision.encode(pixels)
        embeds = out.reshape(-1, out.shape[-1])
        t2 = time.perf_counter()
        return Encoded(embeds, frame.shape[1], frame.shape[0], (t1 - t0) * 1000, (t2 - t1) * 1000, grid)

    def _encode_mtmd(self, frame: np.ndarray, tokens: tuple[int, int] | None = None) -> MediaEncoded:
        """libmtmd's half: its own preprocessing (resize, normalise, tiles) and the mmproj's encoder."""
        assert self.mtmd is not None
        t0 = time.perf_counter()
        rgb = _rgb(frame)
        if tokens is not None:
            rgb = self._fit_tokens(rgb, *tokens)
        t1 = time.perf_counter()
        parts = self.mtmd.image_segments(rgb)
        t2 = time.perf_counter()
        blocks = [p.embeds for p in parts if isinstance(p, MediaEmbeds)]
        embeds = np.concatenate(blocks) if blocks else np.zeros((0, self.mtmd.n_embd), np.float32)
        return MediaEncoded(embeds, frame.shape[1], frame.shape[0], (t1 - t0) * 1000, (t2 - t1) * 1000,
                            parts=parts)

    @property
    def several_images(self) -> bool:
        """Whether a prompt may hold several images: a GGUF + mmproj bundle's (libmtmd lays out any
        number, each with its projector's markers); an ONNX-encoder bundle's template has one image slot."""
        return self.mtmd is not None

    def _fit_tokens(self, rgb: np.ndarray, low: int, high: int) -> np.ndarray:
        """`rgb` resized until libmtmd makes low..high image tokens of it (a dynamic-resolution projector;
        a few tries, each scaled by the square root of the miss). InputError naming `image_tokens` when the
        projector cannot go under `high` (its own floor, or a fixed size); under `low` it stays as it can."""
        assert self.mtmd is not None
        for _ in range(6):
            n = self.mtmd.image_tokens(rgb)
            if low <= n <= high or n == 0:
                break
            factor = math.sqrt(high / n) * 0.97 if n > high else math.sqrt(low / n) * 1.03
            h, w = rgb.shape[:2]
            size = (max(1, round(w * factor)), max(1, round(h * factor)))
            if size == (w, h) or size[0] * size[1] > MAX_IMAGE_PIXELS:
                break
            rgb = cv2.resize(rgb, size, interpolation=cv2.INTER_AREA if factor < 1 else cv2.INTER_CUBIC)
        else:
            n = self.mtmd.image_tokens(rgb)
        if n > high:  # the projector's own floor (or a fixed size) is above the budget
            raise InputError(f"image_tokens: the projector makes at least {n} image tokens of this image, more "
                             f"than the budget's max of {high}", field="image_tokens")
        return rgb

    def sequence(self, prompt: str, enc: Encoded | Sequence[Encoded] | None, system: str | None = None,
                 field: str = "messages") -> tuple[list[int], ImagePart, list[int]]:
        """(prefix, image part, suffix) of one inspection: the prompt template with the image in place.

        Bundles with an image token (exported models) tokenize the whole prompt with the image
        expanded to image tokens, as the model's own processor does, then put an embedding at each
        image token; the tokens before the first one are the cached prefix. Several encodings (a
        GGUF + mmproj bundle only) go at the image slot in order, as libmtmd lays out one media
        marker per image there.
        """
        encs = [] if enc is None else [enc] if isinstance(enc, Encoded) else list(enc)
        if len(encs) > 1 and not self.several_images:
            raise InputError(f"{field}: this model ({self.bundle.kind} bundle) takes one image per request; "
                             "several images need a GGUF + mmproj bundle (docs/models.md)", field=field)
        m = self.bundle.manifest
        p = m.prompt
        layout = m.vision.layout if isinstance(m, Manifest) else None
        if layout is None:
            text = p.template.format(system=p.system if system is None else system, image=_IMAGE, prompt=prompt)
            before, after = text.split(_IMAGE)
            prefix = self._tokenize(before, field)
            image: ImagePart = encs[0].embeds if encs else None
            if self.mtmd is not None:  # the GGUF's own BOS (llama.cpp adds it where the vocabulary asks)
                prefix = self.language.with_bos(prefix)
                if encs:
                    head, parts, tail = media_parts(encs)
                    return prefix + head, parts, tail + self._tokenize(after, field)
            return prefix, image, self._tokenize(after, field)
        assert isinstance(m, Manifest)
        first = encs[0] if encs else None
        image_text = "" if first is None else image_prompt(layout, m.vision.image_tokens, first.grid)
        ids = self._tokenize(
            p.template.format(system=p.system if system is None else system, image=image_text, prompt=prompt),
            field)
        if first is None:
            return ids, None, []
        return split_at_image_tokens(ids, self._image_token, first.embeds)

    def use_programs(self, programs: Mapping[str, ProgramConfig], cameras: Sequence[CameraConfig],
                     limits: ImageLimits) -> None:
        """Load the config's inspection programs: every reference read and encoded (through the encoder
        cache: a reload with the same references encodes nothing). All or nothing: on a ConfigError
        (one line naming the program and the file) the programs in use stay."""
        loaded = load_programs(programs, cameras, limits, lambda f, t: self.encode(f, tokens=t),
                               self.several_images, self.bundle.name, self.image_budget,
                               self.bundle.manifest.verdict_schema)
        self._check_frame_budgets(loaded[0], cameras)
        self._check_references_fit(loaded[0], cameras)
        self._programs = loaded

    def _check_frame_budgets(self, programs: Mapping[str, LoadedProgram], cameras: Sequence[CameraConfig]) -> None:
        """ConfigError when a camera of known size gets frames the projector cannot bring under its
        program's image_tokens.max: every frame would be refused (libmtmd counts tokens from the size,
        nothing is encoded)."""
        if self.mtmd is None:
            return
        for cam in cameras:
            program = programs.get(cam.program) if cam.program is not None else None
            size = (cam.roi[2], cam.roi[3]) if cam.roi else (cam.width, cam.height)
            if program is None or program.tokens is None or size[0] is None or size[1] is None:
                continue
            try:
                self._fit_tokens(np.zeros((size[1], size[0], 3), np.uint8), *program.tokens)
            except InputError as exc:
                why = str(exc).removeprefix("image_tokens: ").replace("this image", f"its {size[0]}x{size[1]} frame")
                raise ConfigError(f"programs.{program.name} (camera {cam.name}): image_tokens.max "
                                  f"{program.tokens[1]} is below what the camera's frames can have: {why}") from None

    def _check_references_fit(self, programs: Mapping[str, LoadedProgram], cameras: Sequence[CameraConfig]) -> None:
        """ConfigError when a program's references (their image tokens and captions), a frame of each
        camera of known size and the answer's max_tokens cannot fit the context: every frame would be
        refused. The references are encoded already; the frame is counted from its size."""
        users = {name: [c for c in cameras if c.program == name] for name in programs}
        for name, program in programs.items():
            clip = program.config.clip if program.config is not None else None
            if not program.references and clip is None:
                continue
            shown = "a frame" if clip is None else f"a clip of {clip.frames} frames"
            refs = sum(len(r.encoded.embeds) + len(self._tokenize(REFERENCE_TEXT.format(caption=r.caption)))
                       for r in program.references)
            listed: list[CameraConfig | None] = list(users[name]) or [None]
            for cam in listed:
                size = None if cam is None else (cam.roi[2], cam.roi[3]) if cam.roi else (cam.width, cam.height)
                frame = 0
                if self.mtmd is not None and size is not None and size[0] is not None and size[1] is not None:
                    rgb = np.zeros((size[1], size[0], 3), np.uint8)
                    frame = self.mtmd.image_tokens(self._fit_tokens(rgb, *program.tokens) if program.tokens else rgb)
                    frame *= clip.frames if clip is not None else 1
                need = refs + frame + self.max_tokens
                if need >= self.language.n_ctx:
                    where = f" (camera {cam.name})" if cam is not None else ""
                    raise ConfigError(
                        f"programs.{name}{where}: the references take {refs} tokens, {shown} {frame} and the answer "
                        f"up to {self.max_tokens}: {need}, more than the context of {self.language.n_ctx} tokens "
                        "(model.context_size; or fewer/smaller references, image_tokens.max)")

    def changed_references(self) -> list[str]:
        """The running programs' references whose file changed on disk since it was encoded."""
        return changed_references(self._programs[0])

    def program_of(self, camera: str, program: str | None = None) -> LoadedProgram | None:
        """The program a frame is inspected with: `program` by name (a line recipe's), else the camera's.
        InputError naming `program` when that name is not loaded (a reload refused the programs)."""
        if program is None:
            return self._programs[1].get(camera)
        found = self._programs[0].get(program)
        if found is None:
            raise InputError(f"program: no inspection program {program!r} is loaded", field="program")
        return found

    def frame_sequence(self, camera: str, prompt: str, enc: Encoded, field: str = "prompt",
                       program_name: str | None = None) -> tuple[Head, ImagePart, list[int]]:
        """A camera's frame as a prompt: under its program (references before the frame, all of it up
        to the frame one shared `Prefix`), or the plain layout of `sequence`."""
        program = self.program_of(camera, program_name)
        encs = enc.frames if isinstance(enc, ClipEncoded) else [enc]  # a clip: its frames, oldest first
        if program is None or not program.references:
            return self.sequence(prompt, encs, field=field)
        p = self.bundle.manifest.prompt
        before, after = p.template.format(system=p.system, image=_IMAGE, prompt=prompt).split(_IMAGE)
        begin, parts, end = media_parts(encs)
        prefix = program.prefix(before, begin, lambda text: self._tokenize(text, field), self.language.with_bos,
                                media_parts)
        return prefix, parts, end + self._tokenize(after, field)

    def _tokenize(self, text: str, field: str = "messages") -> list[int]:
        """The same prompt texts come back every frame (one per question and tile grid): tokenize once.

        A text too long to fit the context is refused before it is tokenized (InputError naming
        `field`): no token can hold more than `max_token_bytes` bytes, so a longer text cannot fit."""
        ids = self._token_cache.get(text)
        if ids is None:
            size = len(text.encode("utf-8", "surrogatepass"))
            if size > self.max_prompt_bytes:
                raise InputError(f"{field}: the prompt is {size} bytes; the model's context of "
                                 f"{self.language.n_ctx} tokens holds at most {self.max_prompt_bytes}",
                                 field=field)
            ids = self.language.tokenize(text)
            self._token_cache.put(text, ids)
        return list(ids)

    def prompt_parts(self, prompt: str) -> tuple[list[int], list[int]]:
        """Token ids before and after the image for this question (bundles without an image layout)."""
        m = self.bundle.manifest
        if isinstance(m, Manifest) and m.vision.layout is not None:
            raise InferenceError("this bundle lays the image out with tokens: use Inspector.sequence()")
        prefix, _, suffix = self.sequence(prompt, None)
        return prefix, suffix

    def constraint(self, schema: dict[str, Any]) -> str:
        """A client's JSON schema as a grammar, checked by the budget and by this model's constraint
        engine before anything is queued (InputError naming response_format.json_schema)."""
        grammar = schema_to_grammar(schema)
        self.language.check_grammar(grammar)
        return grammar

    def generate(self, prefix: Head, image: ImagePart, suffix: list[int],
                 grammar: str | None, max_tokens: int, sampling: Sampling = GREEDY,
                 on_text: Callable[[str], None] | None = None, stop: list[str] | None = None) -> Generation:
        with self._lock:
            return self.language.generate(prefix, image, suffix, grammar, max_tokens, sampling, on_text, stop)

    def generate_batch(self, items: Sequence[Item | Prompt], grammar: str | None, max_tokens: int) -> list[Generation]:
        """Several prompts as parallel sequences of one batch: a (prefix, image, suffix) item greedy
        under `grammar`, a `Prompt` with its own grammar, sampling and length."""
        with self._lock:
            return self.language.generate_batch(items, grammar, max_tokens)

    def verdict_rules(self, schema: dict[str, Any] | None) -> VerdictRules:
        """The grammar and validator of a verdict schema (None: the bundle's), built once per schema
        and kept in a bounded LRU (a station's recipes come back every part). InputError naming
        `schema` when the schema is over the complexity budget or beyond the constraint engine."""
        if schema is None:
            return self._bundle_rules
        key = json.dumps(schema, sort_keys=True, separators=(",", ":"))
        with self._rules_lock:
            rules = self._rules.get(key)
            if rules is not None:
                self._rules.move_to_end(key)
                return rules
        try:
            Draft202012Validator.check_schema(schema)
            grammar = schema_to_grammar(schema, "schema")
            self.language.check_grammar(grammar)
        except SchemaError as exc:
            raise SchemaRefused(f"schema: not a valid JSON schema ({exc.message[:160]})", field="schema") from None
        except InputError as exc:
            why = str(exc).removeprefix("response_format.json_schema: ").removeprefix("schema: ")
            raise SchemaRefused(f"schema: {why}", field="schema") from None
        except Exception as exc:  # noqa: BLE001 - the converter raises bare exceptions for odd schemas
            raise SchemaRefused(f"schema: unsupported JSON schema ({str(exc)[:160]})", field="schema") from None
        rules = VerdictRules(grammar, Draft202012Validator(schema))
        with self._rules_lock:
            self._rules[key] = rules
            while len(self._rules) > _SCHEMAS_KEPT:
                self._rules.popitem(last=False)
        return rules

    def inspect(self, frame: np.ndarray, *, camera: str = "api", prompt: str | None = None,
                seq: int = 0, capture_ms: float = 0.0, governor: dict[str, Any] | None = None,
                encoded: Encoded | None = None, schema: dict[str, Any] | None = None,
                program: str | None = None) -> Result:
        """Run the whole pipeline on one BGR frame and return a Result valid against `schema`
        (None: the bundle's verdict_schema), under `program` by name (None: the camera's)."""
        rules = self.verdict_rules(schema)  # a refused schema costs no encode
        enc = encoded or self.encode_frame(camera, frame, program_name=program)
        loaded = self.program_of(camera, program)
        if isinstance(enc, RegionsEncoded) or (loaded is not None and loaded.references):
            # Regions: every region a sequence of one batch. References: the parallel slots keep the
            # program's prefix KV beside other prefixes (the main context keeps one: a camera without
            # references, or an API request, between two frames would make it decode the references again).
            served: list[Result | Generation | Exception] = []
            self.serve([BatchJob(enc, camera, prompt, seq, capture_ms, governor, schema, program)],
                       lambda _w, outcome: served.append(outcome))
            if isinstance(served[0], Exception):
                raise served[0]
            assert isinstance(served[0], Result)
            return served[0]
        t0 = time.perf_counter()
        question = prompt or self.default_prompt
        prefix, image, suffix = self.frame_sequence(camera, question, enc, program_name=program)
        gen = self.generate(prefix, image, suffix, rules.grammar, self.max_tokens)
        return self._result(enc, gen, question, camera, seq, capture_ms, governor, t0, rules)

    def inspect_batch(self, jobs: list[BatchJob]) -> list[Result | InferenceError]:
        """Several encoded frames (e.g. from different cameras) generated as parallel sequences, each
        under its own job's schema. A job whose schema is refused fails alone (InputError inside)."""
        if any(isinstance(job.encoded, RegionsEncoded) for job in jobs):  # frames of several sequences each
            served: dict[int, Result | InferenceError] = {}

            def finished(w: Work, outcome: Result | Generation | Exception) -> None:
                served[id(w)] = outcome if isinstance(outcome, Result | InferenceError) else \
                    InferenceError(str(outcome))

            self.serve(jobs, finished)
            return [served[id(job)] for job in jobs]
        t0 = time.perf_counter()
        questions = [job.prompt or self.default_prompt for job in jobs]
        out: list[Result | InferenceError | None] = [None] * len(jobs)
        prompts, ruled = [], []
        for i, (job, question) in enumerate(zip(jobs, questions, strict=True)):
            try:
                rules = self.verdict_rules(job.schema)
            except SchemaRefused as exc:
                out[i] = exc
                continue
            prompts.append(Prompt(*self.frame_sequence(job.camera, question, job.encoded, program_name=job.program),
                                  rules.grammar,
                                  self.max_tokens))
            ruled.append((i, rules))
        gens = self.generate_batch(prompts, self.grammar, self.max_tokens) if prompts else []
        for (i, rules), gen in zip(ruled, gens, strict=True):
            job = jobs[i]
            try:
                out[i] = self._result(job.encoded, gen, questions[i], job.camera, job.seq, job.capture_ms,
                                      job.governor, t0, rules)
            except InferenceError as exc:
                out[i] = exc
        return [o for o in out if o is not None]

    def serve(self, work: Sequence[Work], finished: Served, admit: Callable[[int], Sequence[Work]] | None = None
              ) -> int:
        """Camera verdicts and chat completions as parallel sequences that join and leave between
        steps; `finished` hears of each piece of work once: its Result (a verdict), its Generation (a
        chat) or why it failed. `admit(n)` hands over up to n more that are ready now (never blocks).
        Returns the most sequences that ran at once."""
        started: dict[int, float] = {}

        def prompts(batch: Sequence[Work]) -> list[Prompt]:
            out = []
            for w in batch:
                started[id(w)] = time.perf_counter()
                try:
                    if isinstance(w, BatchJob) and isinstance(w.encoded, RegionsEncoded):
                        regions, collected = self._region_prompts(w, w.encoded)
                        if not regions:  # no region could be asked: the frame's outcome is known now
                            finished(w, self._settled(w, collected, started.pop(id(w))))
                        out.extend(regions)
                    else:
                        out.append(self._prompt(w))
                except (InputError, InferenceError) as exc:
                    finished(w, exc)
            return out

        def done(prompt: Prompt, outcome: Generation | Exception) -> None:
            w, rules, *region = prompt.tag
            if region:  # one region of a frame: the frame is finished with its last region
                collected: _Collected = region[0]
                collected.add(region[1], rules, outcome)
                if collected.pending == 0:
                    finished(w, self._settled(w, collected, started.pop(id(w), time.perf_counter())))
                return
            t0 = started.pop(id(w), time.perf_counter())
            served: Result | Generation | Exception = outcome
            if isinstance(w, BatchJob) and isinstance(outcome, Generation):
                try:
                    served = self._result(w.encoded, outcome, w.prompt or self.default_prompt, w.camera, w.seq,
                                          w.capture_ms, w.governor, t0, rules)
                except InferenceError as exc:
                    served = exc
            finished(w, served)

        more = None if admit is None else (lambda n: prompts(admit(n)))
        with self._lock:
            return self.language.serve(prompts(work), done, more)

    def encode_frame(self, camera: str, frame: np.ndarray, clip: Sequence[ClipFrame] | None = None,
                     program_name: str | None = None) -> Encoded:
        """A camera's frame encoded as its program asks: each region's crop (the frame hashed once for
        the encoder cache), each frame of its clip (clips.py), or the whole frame. `program_name`: a line
        recipe's program in place of the camera's."""
        program = self.program_of(camera, program_name)
        cfg = program.config if program is not None else None
        tokens = program.tokens if program is not None else None
        if program is not None and cfg is not None and cfg.clip is not None:
            return encode_clip(lambda f: self.encode(f, tokens=tokens), camera, program.name, cfg.clip.frames, clip,
                               self.language.n_embd)
        if cfg is None or not (cfg.regions or cfg.tiling):
            return self.encode(frame, tokens=tokens)
        t0 = time.perf_counter()
        digest = pixels_digest(frame)
        height, width = frame.shape[:2]
        regions: list[tuple[RegionSpec, Encoded | Exception]] = []
        pre = enc_ms = 0.0
        for spec in frame_regions(cfg, width, height):
            try:
                enc = self.encode(frame, crop=spec.box, digest=digest, tokens=tokens)
            except InputError as exc:  # e.g. a region outside this frame: that region has no verdict
                regions.append((spec, exc))
                continue
            pre, enc_ms = pre + enc.preprocess_ms, enc_ms + enc.encode_ms
            regions.append((spec, enc))
        hashed = (time.perf_counter() - t0) * 1000 - pre - enc_ms
        return RegionsEncoded(np.zeros((0, self.language.n_embd), np.float32), width, height, pre + max(0.0, hashed),
                              enc_ms, regions=regions)

    def _region_prompts(self, w: BatchJob, enc: RegionsEncoded) -> tuple[list[Prompt], _Collected]:
        """One prompt per region that has an encoding, tagged with what collects the frame's regions."""
        program = self.program_of(w.camera, w.program)
        nok_field = program.config.nok_field if program is not None and program.config is not None else "defect"
        collected = _Collected(enc, nok_field, self.parse_verdict)
        prompts = []
        for k, (spec, renc) in enumerate(enc.regions):
            if isinstance(renc, Exception):
                collected.outcomes[k] = judge(spec, None, "", nok_field, str(renc))
                continue
            if k in enc.answered:  # the anomaly gate's OK (skip_ok): this region is not asked
                verdict = enc.answered[k]
                collected.outcomes[k] = dataclasses.replace(
                    judge(spec, verdict, json.dumps(verdict, separators=(",", ":")), nok_field), engine="gate")
                continue
            try:
                rules = self.verdict_rules(spec.schema if spec.schema is not None else w.schema)
                question = spec.prompt or w.prompt or self.default_prompt
                prompts.append(Prompt(*self.frame_sequence(w.camera, question, renc, "prompt", w.program),
                                      rules.grammar, self.max_tokens, tag=(w, rules, collected, k)))
            except (InputError, InferenceError) as exc:
                collected.outcomes[k] = judge(spec, None, "", nok_field, str(exc))
        collected.pending = len(prompts)
        return prompts, collected

    def _settled(self, w: BatchJob, collected: _Collected, t0: float) -> Result | Exception:
        """A frame's Result from its regions' outcomes (or why it has none: no region NOK, one without a verdict)."""
        enc, gens = collected.enc, collected.gens
        outcomes = [o for o in collected.outcomes if o is not None]
        try:
            best = overall(outcomes)
        except InferenceError as exc:
            return exc
        total = w.capture_ms + enc.preprocess_ms + enc.encode_ms + (time.perf_counter() - t0) * 1000
        timings = {
            "capture": round(w.capture_ms, 3), "preprocess": round(enc.preprocess_ms, 3),
            "encode": round(enc.encode_ms, 3), "prefill": round(sum(g.prefill_ms for g in gens), 3),
            "decode": round(sum(g.decode_ms for g in gens), 3), "total": round(total, 3),
        }
        assert best.verdict is not None
        return Result(device=self.device_id, camera=w.camera, frame=FrameInfo(w.seq, enc.width, enc.height),
                      verdict=best.verdict, text=best.text, model=self.model_name, timings_ms=timings,
                      prompt=w.prompt or self.default_prompt, governor=w.governor,
                      regions=[o.to_dict() for o in outcomes])

    def _prompt(self, w: Work) -> Prompt:
        """The sequence of one piece of work with how it is generated."""
        if isinstance(w, BatchJob):
            rules = self.verdict_rules(w.schema)
            question = w.prompt or self.default_prompt
            return Prompt(*self.frame_sequence(w.camera, question, w.encoded, program_name=w.program), rules.grammar,
                          self.max_tokens,
                          tag=(w, rules))
        job = w.job
        enc = w.encoded
        if enc is None and job.image is not None:
            enc = self.encode(job.image)  # not encoded ahead (overlap off, or a reload meanwhile)
        if self.mtmd is not None and job.more_images:
            self._refuse_unfitting_images(job, enc)
        encs = ([] if enc is None else [enc]) + [self.encode(img) for img in job.more_images]
        prefix, image, suffix = self.sequence(job.prompt, encs, job.system)
        return Prompt(prefix, image, suffix, job.grammar, job.max_tokens or self.max_tokens,
                      Sampling(job.temperature, job.top_p, job.seed), tuple(job.stops), job.on_text, tag=(w, None))

    def _refuse_unfitting_images(self, job: ChatJob, enc: Encoded | None) -> None:
        """InputError naming `messages` before any further image is encoded when the images' tokens
        (libmtmd counts them from the sizes) and the text's alone fill the context: the model's own
        check would refuse the prompt only after every image went through the projector."""
        assert self.mtmd is not None
        pending = ([job.image] if enc is None and job.image is not None else []) + list(job.more_images)
        images = (0 if enc is None else len(enc.embeds)) + sum(self.mtmd.image_tokens(_rgb(i)) for i in pending)
        text = len(self._tokenize(job.prompt)) + len(self._tokenize(job.system or ""))
        if images + text >= self.language.n_ctx:
            raise InputError(f"messages: the request's {len(pending) + (enc is not None)} images make {images} "
                             f"image tokens and its text at least {text}; the context holds {self.language.n_ctx}",
                             field="messages")

    def _result(self, enc: Encoded, gen: Generation, question: str, camera: str, seq: int, capture_ms: float,
                governor: dict[str, Any] | None, t0: float, rules: VerdictRules | None = None) -> Result:
        verdict = self.parse_verdict(gen, rules)
        total = capture_ms + enc.preprocess_ms + enc.encode_ms + (time.perf_counter() - t0) * 1000
        timings = {
            "capture": round(capture_ms, 3), "preprocess": round(enc.preprocess_ms, 3),
            "encode": round(enc.encode_ms, 3), "prefill": round(gen.prefill_ms, 3),
            "decode": round(gen.decode_ms, 3), "total": round(total, 3),
        }
        return Result(device=self.device_id, camera=camera, frame=FrameInfo(seq, enc.width, enc.height),
                      verdict=verdict, text=gen.text, model=self.model_name, timings_ms=timings,
                      prompt=question, governor=governor, clip=clip_stamps(enc))

    def parse_verdict(self, gen: Generation, rules: VerdictRules | None = None) -> dict[str, Any]:
        """The verdict of a generation, checked against `rules`' schema (None: the bundle's)."""
        validator = (rules or self._bundle_rules).validator
        if gen.finish_reason == "length":
            raise InferenceError(f"the model used all {self.max_tokens} tokens before finishing the "
                                 "verdict; raise model.max_tokens")
        try:
            verdict = json.loads(gen.text)
        except json.JSONDecodeError as exc:
            raise InferenceError(f"the model's output is not valid JSON ({exc.msg})") from None
        errors = sorted(validator.iter_errors(verdict), key=str)
        if errors:
            whose = "the bundle's" if validator is self.validator else "its request's"
            raise InferenceError(f"the verdict does not match {whose} schema: {errors[0].message}")
        return dict(verdict)

    def close(self) -> None:
        """Free the language model and the vision encoder (waits for a generation in progress)."""
        self.ready = False
        with self._lock:
            self._stack.close()  # idempotent: a second close() finds the stack empty


def _rgb(frame: np.ndarray) -> np.ndarray:
    """A decoded (BGR, grey or BGRA) frame as the RGB libmtmd reads."""
    if frame.ndim == 2:
        return cv2.cvtColor(frame, cv2.COLOR_GRAY2RGB)
    if frame.shape[2] == 4:
        return cv2.cvtColor(frame, cv2.COLOR_BGRA2RGB)
    return cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
