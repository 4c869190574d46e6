"""A frame (or a crop of it) -> `Encoded`: the encoder cache in front of ONNX Runtime or libmtmd.

Format 1 bundles encode with their ONNX vision encoder (our preprocessing, inference/vision.py);
format 2 bundles with libmtmd (its own preprocessing and the mmproj's encoder, llm/mtmd.py), whose
encodings keep their prompt segments (`MediaEncoded`). `FrameEncoder` is thread-safe: the inspector
encodes the next frames while the language model generates.

With `model.encoder_lanes` above 1 a libmtmd bundle has that many contexts (lanes), each with its own
copy of the mmproj: a frame's region crops are encoded on them at the same time (one crop per lane),
and any encode takes whichever lane is free, so an API image does not wait behind a camera's regions.
"""

from __future__ import annotations

import dataclasses
import math
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import cv2
import numpy as np

from edge_runtime.config import ModelConfig
from edge_runtime.config.programs import ProgramConfig
from edge_runtime.core.batch import ClipFrame, Encoded
from edge_runtime.core.bundle.manifest import Manifest, MmprojManifest
from edge_runtime.core.errors import InferenceError, InputError
from edge_runtime.inference.clips import encode_clip
from edge_runtime.inference.encoder_cache import Box, EncodeKey, EncoderCache, frozen, pixels_digest
from edge_runtime.inference.llm.feed import Segment
from edge_runtime.inference.llm.mtmd import MAX_IMAGE_PIXELS, MediaEmbeds, MtmdContext
from edge_runtime.inference.programs import LoadedProgram
from edge_runtime.inference.regions import RegionsEncoded, frame_regions
from edge_runtime.inference.vision import Preprocessor, VisionEncoder


@dataclass
class MediaEncoded(Encoded):
    """A frame encoded by libmtmd: the prompt segments of its image (projector tokens, MediaEmbeds);
    `embeds` holds all its embeddings as one block, for what reads them so: the one chunk's own array
    (most models), a stacked copy of several (a slicing model's)."""

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
                total += part.embeds.nbytes if part.embeds is not enc.embeds else 0
                total += sum(a.nbytes for a in (part.mrope, part.mrope_shift) if a is not None)
            elif isinstance(part, np.ndarray):
                total += part.nbytes
            else:
                total += 8 * len(part)
    return total


def held_bytes(chunks: Sequence[int], n_embd: int, mrope: bool) -> int:
    """The bytes of the arrays a libmtmd encoding holds (`_encode_mtmd`), from its image chunks' token
    counts, before anything is encoded: each chunk's float32 embeddings [N, n_embd] and, with M-RoPE,
    its two int32 position arrays [4, N]; with several chunks, `embeds` stacks them into one more array."""
    tokens = sum(chunks)
    return tokens * n_embd * 4 + (2 * 4 * tokens * 4 if mrope else 0) + (tokens * n_embd * 4 if len(chunks) > 1 else 0)


def array_bytes(encodings: Sequence[Encoded]) -> int:
    """The bytes of the distinct arrays these encodings hold (an array shared by several counted once):
    their embeddings and M-RoPE positions, as `held_bytes` counts them."""
    seen: dict[int, int] = {}
    for enc in encodings:
        arrays = [enc.embeds]
        if isinstance(enc, MediaEncoded):
            for part in enc.parts:
                if isinstance(part, MediaEmbeds):
                    arrays += [a for a in (part.embeds, part.mrope, part.mrope_shift) if a is not None]
        for a in arrays:
            seen[id(a)] = a.nbytes
    return sum(seen.values())


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


def rgb(frame: np.ndarray) -> np.ndarray:
    """A decoded (BGR, grey or BGRA) frame as the RGB libmtmd reads."""
    if frame.ndim == 2:
        return cv2.cvtColor(frame, cv2.COLOR_GRAY2RGB)
    if frame.shape[2] == 4:
        return cv2.cvtColor(frame, cv2.COLOR_BGRA2RGB)
    return cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)


def encoder_identity(manifest: Manifest | MmprojManifest, settings: ModelConfig, vision: VisionEncoder | None,
                     mtmd: MtmdContext | None) -> str:
    """What, besides the pixels, crop and token budget, decides this encoder's output."""
    m = manifest
    if mtmd is not None:
        assert m.mtmd is not None and not isinstance(m, Manifest)
        return (f"mtmd:{m.files.mmproj.sha256}:{m.files.language.sha256}:"
                f"gpu={int(not mtmd.on_cpu)}:{m.mtmd.projector}")
    assert isinstance(m, Manifest) and vision is not None
    fp16 = settings.vision_precision == "fp16" and m.files.vision_fp16 is not None
    files = m.files.vision_fp16 if fp16 and m.files.vision_fp16 is not None else m.files.vision
    return f"onnx:{files.sha256}:{','.join(vision.providers)}:{m.preprocess.model_dump_json()}"


CLOSED = "the image encoder is closed (the model was reloaded or is shutting down)"


class FrameEncoder:
    """The image half of an inspection over engines the inspector owns (it builds and closes them)."""

    def __init__(self, preprocessor: Preprocessor | None, vision: VisionEncoder | None, mtmd: MtmdContext | None,
                 cache: EncoderCache[Encoded], identity: str, lanes: Sequence[MtmdContext] = ()) -> None:
        """`lanes`: libmtmd contexts beside `mtmd` (model.encoder_lanes - 1), built and closed by the inspector."""
        self.preprocessor, self.vision, self.mtmd = preprocessor, vision, mtmd
        self.cache = cache
        self.identity = identity
        contexts = ([mtmd] if mtmd is not None else []) + list(lanes)
        # Free lanes, first in first out: an encode takes the one free longest, so crops spread over all.
        self._free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for i in range(len(contexts)):
            self._free.put(i)
        self._contexts = contexts
        self.lane_encodes = [0] * max(1, len(contexts))  # encodes per lane (status, tests); ONNX: its one session
        self._onnx_count = threading.Lock()  # ONNX encodes run on any thread at once: no lane keeps their count
        self._pool = (ThreadPoolExecutor(len(contexts), thread_name_prefix="encoder-lane")
                      if len(contexts) > 1 else None)
        self._closing = self._closed = False  # close() began; it waited for the encodes in progress

    @property
    def lanes(self) -> int:
        """libmtmd contexts that encode at the same time (1: one encode at a time; ONNX bundles: 1)."""
        return max(1, len(self._contexts))

    def close(self) -> None:
        """Stop the lanes' threads (the crops handed to them are encoded first), then wait for every encode
        still inside libmtmd: each lane back, one on a caller's thread too (stage 1's frame, an API image,
        during a reload). The contexts are the inspector's to free, after this; an encode that comes later
        is refused (InferenceError), not run on them."""
        self._closing = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._closed = True
        held: list[int] = []
        try:
            for _ in self._contexts:
                held.append(self._free.get())
        finally:  # back for whoever waits: it finds the encoder closed
            for lane in held:
                self._free.put(lane)

    @property
    def image_budget(self) -> int:
        """The image token budget the encoder runs under (libmtmd's image_max_tokens; 0: fixed)."""
        return self.mtmd.image_max_tokens if self.mtmd is not None else 0

    @property
    def several_images(self) -> bool:
        """Whether a prompt may hold several images: a GGUF + mmproj bundle's (libmtmd lays out any
        number, each with its projector's markers); an ONNX-encoder bundle's template has one image slot."""
        return self.mtmd is not None

    def encode(self, frame: np.ndarray, crop: Box | None = None, digest: str | None = None,
               tokens: tuple[int, int] | None = None) -> Encoded:
        """The frame's (or its `crop`'s) image embeddings: from the encoder cache when these pixels were
        encoded the same way before (encoder_cache.py), else encoded and kept."""
        t0 = time.perf_counter()
        if crop is not None:
            check_crop(frame, crop)
        cached = self.cache.budget > 0  # without a cache (encoder_cache_mb 0) the pixels are not hashed
        key = EncodeKey(digest or pixels_digest(frame), self.identity, crop, tokens or self.image_budget) \
            if cached else None
        t1 = time.perf_counter()
        hit = self.cache.get(key) if key is not None else None
        if hit is not None:  # what the frame cost: hashing its pixels (preprocess), the lookup (encode)
            return dataclasses.replace(hit, preprocess_ms=(t1 - t0) * 1000,
                                       encode_ms=(time.perf_counter() - t1) * 1000)
        x, y, w, h = crop if crop is not None else (0, 0, frame.shape[1], frame.shape[0])
        enc = self.encode_uncached(frame[y:y + h, x:x + w], tokens)
        if key is not None:
            self.cache.put(key, freeze(enc))
        return enc

    def encode_program(self, frame: np.ndarray, camera: str, program: LoadedProgram | None,
                       clip: Sequence[ClipFrame] | None, n_embd: int) -> Encoded:
        """A camera's frame encoded as its program asks: each frame of its clip (clips.py), each region's
        crop, or the whole frame."""
        cfg = program.config if program is not None else None
        tokens = program.tokens if program is not None else None
        if program is not None and cfg is not None and cfg.clip is not None:
            return encode_clip(lambda f: self.encode(f, tokens=tokens), camera, program.name, cfg.clip.frames, clip,
                               n_embd)
        if cfg is None or not (cfg.regions or cfg.tiling):
            return self.encode(frame, tokens=tokens)
        return self.encode_regions(frame, cfg, tokens, n_embd)

    def encode_regions(self, frame: np.ndarray, cfg: ProgramConfig, tokens: tuple[int, int] | None,
                       n_embd: int) -> RegionsEncoded:
        """Each region's crop of a frame encoded (the frame hashed once for the encoder cache; regions
        with the same box share one encode); a region outside the frame keeps why it has no encoding."""
        t0 = time.perf_counter()
        digest = pixels_digest(frame) if self.cache.budget > 0 else None
        height, width = frame.shape[:2]
        specs = frame_regions(cfg, width, height)
        # One encode per box: on several lanes two regions of one box would encode at once, both missing
        # the cache (and with the cache off each would encode anyway).
        boxes = list(dict.fromkeys(spec.box for spec in specs))

        def one(box: Box) -> Encoded | Exception:
            try:
                return self.encode(frame, crop=box, digest=digest, tokens=tokens)
            except InputError as exc:  # e.g. a region outside this frame: that region has no verdict
                return exc

        t1 = time.perf_counter()
        # On several lanes the crops encode at the same time; anything but a refused crop is raised here.
        if self._pool is not None and len(boxes) > 1:
            try:
                done_boxes = list(self._pool.map(one, boxes))
            except RuntimeError:  # "cannot schedule new futures after shutdown": the encoder is closing
                if self._closing:
                    raise InferenceError(CLOSED) from None
                raise
        else:
            done_boxes = [one(box) for box in boxes]
        wall = (time.perf_counter() - t1) * 1000
        by_box = dict(zip(boxes, done_boxes, strict=True))
        outs = [by_box[spec.box] for spec in specs]
        done = [o for o in done_boxes if isinstance(o, Encoded)]
        pre, enc_ms = sum(o.preprocess_ms for o in done), sum(o.encode_ms for o in done)
        # The frame's times are wall times: the crops' own (which overlap on several lanes) split the
        # encoding's wall time in their proportion, the hashing of the frame is preprocessing.
        share = wall * pre / (pre + enc_ms) if pre + enc_ms > 0 else wall
        return RegionsEncoded(np.zeros((0, n_embd), np.float32), width, height, (t1 - t0) * 1000 + share,
                              max(0.0, wall - share), regions=list(zip(specs, outs, strict=True)))

    def encode_uncached(self, frame: np.ndarray, tokens: tuple[int, int] | None = None) -> Encoded:
        """The frame encoded by the bundle's encoder, past the cache."""
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
        with self._onnx_count:
            self.lane_encodes[0] += 1
        return Encoded(embeds, frame.shape[1], frame.shape[0], (t1 - t0) * 1000, (t2 - t1) * 1000, grid)

    def _encode_mtmd(self, frame: np.ndarray, tokens: tuple[int, int] | None = None) -> MediaEncoded:
        """libmtmd's half: its own preprocessing (resize, normalise, tiles) and the mmproj's encoder."""
        assert self.mtmd is not None
        lane = self._free.get()  # blocks while every lane encodes
        try:
            if self._closed:  # close() took every lane back before: no encode runs on a freed context
                raise InferenceError(CLOSED)
            mtmd = self._contexts[lane]
            t0 = time.perf_counter()
            pixels = rgb(frame)
            if tokens is not None:
                pixels = fit_tokens(mtmd, pixels, *tokens)
            t1 = time.perf_counter()
            parts = mtmd.image_segments(pixels)
            t2 = time.perf_counter()
            self.lane_encodes[lane] += 1
        finally:
            self._free.put(lane)
        blocks = [p.embeds for p in parts if isinstance(p, MediaEmbeds)]
        # one chunk (most models): its own array, not a copy that would hold every embedding twice
        embeds = blocks[0] if len(blocks) == 1 else np.concatenate(blocks) if blocks else \
            np.zeros((0, self.mtmd.n_embd), np.float32)
        return MediaEncoded(embeds, frame.shape[1], frame.shape[0], (t1 - t0) * 1000, (t2 - t1) * 1000,
                            parts=parts)

    def reference_bytes(self, frame: np.ndarray, tokens: tuple[int, int] | None) -> tuple[int, int]:
        """`reference_bytes` with this encoder's libmtmd context."""
        assert self.mtmd is not None
        return reference_bytes(self.mtmd, frame, tokens, self.mtmd.n_embd)

    def image_tokens(self, frame: np.ndarray) -> int:
        """How many image tokens libmtmd makes of a (BGR) frame, counted from its size: nothing is encoded."""
        assert self.mtmd is not None
        return self.mtmd.image_tokens(rgb(frame))

    def fit_tokens(self, pixels: np.ndarray, low: int, high: int) -> np.ndarray:
        """`fit_tokens` with this encoder's libmtmd context."""
        assert self.mtmd is not None
        return fit_tokens(self.mtmd, pixels, low, high)


def reference_bytes(mtmd: MtmdContext, frame: np.ndarray, tokens: tuple[int, int] | None, n_embd: int
                    ) -> tuple[int, int]:
    """(image tokens, bytes held) of the encoding of a (BGR) frame under the budget `tokens`, counted from
    its size as libmtmd lays it out (`held_bytes`, rows of `n_embd`): nothing is encoded."""
    pixels = rgb(frame)
    if tokens is not None:
        try:
            pixels = fit_tokens(mtmd, pixels, *tokens)
        except InputError:
            pass  # under a budget it cannot meet: the encode refuses it, check_frame_budgets says why
    chunks = mtmd.image_chunks(pixels)
    return sum(chunks), held_bytes(chunks, n_embd, mtmd.use_mrope)


def fit_tokens(mtmd: MtmdContext, pixels: np.ndarray, low: int, high: int) -> np.ndarray:
    """RGB `pixels` resized until libmtmd makes low..high image tokens of them (a dynamic-resolution
    projector; a few tries, each scaled by the square root of the miss). InputError naming
    `image_tokens` when the projector cannot go under `high` (its own floor, or a fixed size); under
    `low` it stays as it can."""
    for _ in range(6):
        n = mtmd.image_tokens(pixels)
        if low <= n <= high or n == 0:
            break
        factor = math.sqrt(high / n) * 0.97 if n > high else math.sqrt(low / n) * 1.03
        h, w = pixels.shape[:2]
        size = (max(1, round(w * factor)), max(1, round(h * factor)))
        if size == (w, h) or size[0] * size[1] > MAX_IMAGE_PIXELS:
            break
        pixels = cv2.resize(pixels, size, interpolation=cv2.INTER_AREA if factor < 1 else cv2.INTER_CUBIC)
    else:
        n = mtmd.image_tokens(pixels)
    if n > high:  # the projector's own floor (or a fixed size) is above the budget
        raise InputError(f"image_tokens: the projector makes at least {n} image tokens of this image, more "
                         f"than the budget's max of {high}", field="image_tokens")
    return pixels
