"""libmtmd (llama.cpp's multimodal library): the one owner of an mmproj's context; nobody else calls
`llama_cpp.mtmd_cpp`.

An image is tokenized with libmtmd's media marker into chunks (the projector's own begin/end tokens as
text chunks, the image as one or more image chunks), each image chunk is encoded and its embeddings
copied out at once (libmtmd reuses one output buffer per context: one context per model, behind a
lock). What comes out is a list of prompt segments the `Feed` decodes in our own `llama_batch`: token
ids, and `MediaEmbeds` carrying what decoding an image needs (rows `llama_model_n_embd_inp` wide,
the chunk's `n_pos`, M-RoPE positions, whether attention over it is non-causal).
"""

from __future__ import annotations

from edge_runtime.inference.engines import llama_cpp  # isort: skip - onnxruntime, then llama_cpp (see engines.py)

import ctypes
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from llama_cpp import mtmd_cpp

from edge_runtime.core.errors import BundleError, InferenceError, InputError
from edge_runtime.inference.llm.handles import Context, Handle
from edge_runtime.inference.openmp import on_passing_thread

log = logging.getLogger(__name__)
_TEXT, _IMAGE = 0, 1  # mtmd_input_chunk_type
_GGML_WARN = 3


@llama_cpp.llama_log_callback
def _log(level: int, text: bytes, _user: Any) -> None:
    """libmtmd's log (one line per image slice, the whole mmproj header at load) into ours: warnings
    and errors as warnings, the rest at debug."""
    line = (text or b"").decode("utf-8", "replace").rstrip()
    if line:
        log.log(logging.WARNING if level >= _GGML_WARN and level != 5 else logging.DEBUG, "libmtmd: %s", line)


mtmd_cpp.mtmd_log_set(_log, None)
mtmd_cpp.mtmd_helper_log_set(_log, None)
MAX_IMAGE_PIXELS = 8192 * 8192  # bounded before libmtmd sees the frame (it copies and resizes it)


@dataclass(frozen=True, eq=False)
class MediaEmbeds:
    """One image chunk's embeddings, ready to decode at any position.

    `mrope` holds the chunk's M-RoPE positions for a first position of 0, [4, N] section-major
    (t, y, x, z as libmtmd's `mtmd_image_tokens_get_decoder_pos` gives them); `mrope_shift` [4, N] says
    how much each moves per unit of first position (per token: HunyuanVL's layout moves only t inside
    the image). None for models with plain positions."""

    embeds: np.ndarray  # [N, n_embd_inp] float32
    n_pos: int  # positions the chunk takes: n_past advances by this, not by N
    non_causal: bool  # attention over the image is bidirectional (Gemma 3): one micro-batch, causal off
    mrope: np.ndarray | None = None
    mrope_shift: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.embeds.shape[0])

    def positions(self, pos0: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Section-major positions of rows start..stop: [4 * n] with M-RoPE, else [n]."""
        stop = len(self) if stop is None else stop
        if self.mrope is None or self.mrope_shift is None:
            return np.arange(pos0 + start, pos0 + stop, dtype=np.int32)
        rows = self.mrope[:, start:stop] + pos0 * self.mrope_shift[:, start:stop]
        return np.ascontiguousarray(rows, dtype=np.int32).ravel()


class Chunks(Handle):
    """An owned `mtmd_input_chunks` list."""

    def __init__(self) -> None:
        super().__init__(mtmd_cpp.mtmd_input_chunks_init(), mtmd_cpp.mtmd_input_chunks_free, "an mtmd chunk list")

    def __len__(self) -> int:
        return int(mtmd_cpp.mtmd_input_chunks_size(self.ptr))

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield mtmd_cpp.mtmd_input_chunks_get(self.ptr, i)


def chunk_is_image(chunk: Any) -> bool:
    return int(mtmd_cpp.mtmd_input_chunk_get_type(chunk)) == _IMAGE


def chunk_tokens(chunk: Any) -> list[int]:
    """The token ids of a text chunk (read as one array, not one ctypes call per token)."""
    n = ctypes.c_size_t()
    ptr = mtmd_cpp.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
    if n.value == 0:
        return []
    return np.ctypeslib.as_array(ptr, shape=(n.value,)).astype(np.int32).tolist()


class MtmdContext(Handle):
    """libmtmd's context for one mmproj over one loaded language model. Thread-safe (one lock)."""

    def __init__(self, mmproj: Path, model: Any, threads: int, use_gpu: bool, image_max_tokens: int,
                 warmup: bool = True) -> None:
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = threads
        params.print_timings = False
        params.warmup = warmup  # off where only image tokens are counted (config validate)
        params.image_max_tokens = image_max_tokens  # caps the warm-up's compute reservation too
        ptr = mtmd_cpp.mtmd_init_from_file(str(mmproj).encode(), model, params)
        if not ptr:
            raise BundleError(f"{mmproj} could not be loaded by libmtmd as a projector for this language model")
        super().__init__(ptr, mtmd_cpp.mtmd_free, "an mtmd context")
        if not mtmd_cpp.mtmd_support_vision(ptr):
            self.close()
            raise BundleError(f"{mmproj} has no vision encoder (an audio-only projector?)")
        self.lock = threading.Lock()
        self.on_cpu = not use_gpu
        self.image_max_tokens = image_max_tokens
        self.n_embd = int(llama_cpp.llama_model_n_embd_inp(model))
        self.use_mrope = bool(mtmd_cpp.mtmd_decode_use_mrope(ptr))
        self.marker = mtmd_cpp.mtmd_default_marker().decode()

    def tokenize(self, text: str, images: list[np.ndarray], add_special: bool = False) -> Chunks:
        """`text` with one media marker per image (RGB uint8 [H, W, 3]) as libmtmd's chunks."""
        bitmaps = [_bitmap(img) for img in images]
        chunks = Chunks()
        try:
            raw = text.encode("utf-8")
            inp = mtmd_cpp.mtmd_input_text()
            inp.text, inp.text_len, inp.add_special, inp.parse_special = raw, len(raw), add_special, True
            arr = (mtmd_cpp.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*[b.ptr for b in bitmaps])
            with self.lock:
                rc = mtmd_cpp.mtmd_tokenize(self.ptr, chunks.ptr, ctypes.byref(inp), arr, len(bitmaps))
            if rc != 0:
                raise InferenceError(f"libmtmd could not tokenize the prompt with its image (code {rc})")
        except BaseException:
            chunks.close()
            raise
        finally:
            for b in bitmaps:
                b.close()
        return chunks

    def encode_chunk(self, chunk: Any) -> np.ndarray:
        """The image chunk's embeddings [N, n_embd_inp], copied out before the next encode reuses the buffer."""
        n = int(mtmd_cpp.mtmd_input_chunk_get_n_tokens(chunk))
        with self.lock:
            if self.on_cpu:  # not on the caller's thread, which may live on (the encode stage's): openmp.py
                rc = on_passing_thread(mtmd_cpp.mtmd_encode_chunk, self.ptr, chunk, name="mtmd-encode")
            else:
                rc = mtmd_cpp.mtmd_encode_chunk(self.ptr, chunk)
            if rc != 0:
                raise InferenceError(f"libmtmd could not encode the image (code {rc})")
            out = mtmd_cpp.mtmd_get_output_embd(self.ptr)
            return np.ctypeslib.as_array(out, shape=(n, self.n_embd)).copy()

    def media(self, chunk: Any) -> MediaEmbeds:
        """Encode one image chunk into what the feed decodes."""
        embeds = self.encode_chunk(chunk)
        n_pos = int(mtmd_cpp.mtmd_input_chunk_get_n_pos(chunk))
        non_causal = bool(mtmd_cpp.mtmd_decode_use_non_causal(self.ptr, chunk))
        if not self.use_mrope:
            return MediaEmbeds(embeds, n_pos, non_causal)
        # Positions are affine in the first position: two reads give them for any pos0 (feed.py).
        at0, at1 = decoder_positions(chunk, 0), decoder_positions(chunk, 1)
        return MediaEmbeds(embeds, n_pos, non_causal, at0, at1 - at0)

    def image_tokens(self, rgb: np.ndarray) -> int:
        """How many image tokens libmtmd makes of `rgb` (its preprocessing, no encode)."""
        with self.tokenize(self.marker, [rgb]) as chunks:
            return sum(int(mtmd_cpp.mtmd_input_chunk_get_n_tokens(c)) for c in chunks if chunk_is_image(c))

    def image_chunks(self, rgb: np.ndarray) -> list[int]:
        """The image tokens of each image chunk libmtmd makes of `rgb` (one, or a slicing model's several):
        the rows of each `MediaEmbeds` `image_segments` would return, counted without encoding."""
        with self.tokenize(self.marker, [rgb]) as chunks:
            return [int(mtmd_cpp.mtmd_input_chunk_get_n_tokens(c)) for c in chunks if chunk_is_image(c)]

    def prompt_tokens(self, rgb: np.ndarray) -> int:
        """How many prompt tokens `rgb` takes: its image tokens and the text tokens libmtmd lays around and
        inside it (the projector's begin and end markers, a slicing model's slice and row markers)."""
        with self.tokenize(self.marker, [rgb]) as chunks:
            return sum(int(mtmd_cpp.mtmd_input_chunk_get_n_tokens(c)) for c in chunks)

    def image_segments(self, rgb: np.ndarray) -> list[np.ndarray | list[int] | MediaEmbeds]:
        """One image as prompt segments: the projector's tokens and each chunk's encoded embeddings.

        An image whose chunks hold more than `image_max_tokens` embeddings in all is refused (InputError)
        before any of them is encoded."""
        with self.tokenize(self.marker, [rgb]) as chunks:
            listed = list(chunks)
            total = sum(int(mtmd_cpp.mtmd_input_chunk_get_n_tokens(c)) for c in listed if chunk_is_image(c))
            if total > self.image_max_tokens:
                raise InputError(f"image: {rgb.shape[1]}x{rgb.shape[0]} makes {total} image tokens, more than "
                                 f"the bundle's budget of {self.image_max_tokens} (mtmd.image_max_tokens)",
                                 field="image")
            out: list[np.ndarray | list[int] | MediaEmbeds] = []
            for chunk in listed:
                if chunk_is_image(chunk):
                    out.append(self.media(chunk))
                else:
                    out.append(chunk_tokens(chunk))
            return out

    def eval_chunks(self, ctx: Context, chunks: Chunks, n_past: int, seq: int, n_batch: int) -> int:
        """libmtmd's own path (`mtmd_helper_eval_chunks`): every chunk into `ctx`, logits of the last
        token kept. The reference the engine's own decoding is tested and benchmarked against."""
        new_past = llama_cpp.llama_pos(n_past)
        with self.lock:
            rc = mtmd_cpp.mtmd_helper_eval_chunks(self.ptr, ctx.ptr, chunks.ptr, n_past, seq, n_batch, True,
                                                  ctypes.byref(new_past))
        if rc != 0:
            raise InferenceError(f"mtmd_helper_eval_chunks failed (code {rc})")
        return int(new_past.value)


def decoder_positions(chunk: Any, pos0: int) -> np.ndarray:
    """M-RoPE positions [4, N] (t, y, x, z) of an image chunk whose first position is `pos0`: every
    token's in one call of libmtmd's `mtmd_helper_image_get_decoder_pos` (the loop
    `mtmd_helper_decode_image_chunk` runs), not one ctypes call per token."""
    image = mtmd_cpp.mtmd_input_chunk_get_tokens_image(chunk)
    n = int(mtmd_cpp.mtmd_image_tokens_get_n_tokens(image))
    raw = np.zeros((n, 4), np.uint32)  # an array of struct mtmd_decoder_pos {t, x, y, z}
    if n:
        mtmd_cpp.mtmd_helper_image_get_decoder_pos(image, pos0, raw.ctypes.data_as(_DECODER_POS_P))
    # section-major (t, y, x, z): llama.cpp's set_position_mrope_2d puts y before x
    return np.ascontiguousarray(raw[:, [0, 2, 1, 3]].T.astype(np.int32))


_DECODER_POS_P = ctypes.POINTER(mtmd_cpp.mtmd_decoder_pos)
# The numpy view above relies on the struct's layout: four uint32 in the order t, x, y, z.
if ([f[0] for f in mtmd_cpp.mtmd_decoder_pos._fields_] != ["t", "x", "y", "z"]
        or ctypes.sizeof(mtmd_cpp.mtmd_decoder_pos) != 4 * ctypes.sizeof(ctypes.c_uint32)):
    raise ImportError("llama_cpp.mtmd_cpp.mtmd_decoder_pos is not {t, x, y, z} uint32: this llama-cpp-python "
                      "is not the one edge-runtime was built against")


class _Bitmap(Handle):
    def __init__(self, ptr: Any, data: np.ndarray) -> None:
        super().__init__(ptr, mtmd_cpp.mtmd_bitmap_free, "an mtmd bitmap")
        self._data = data  # libmtmd copies it, but keep it alive until the bitmap is made


def _bitmap(rgb: np.ndarray) -> _Bitmap:
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise InputError(f"image: expected an RGB uint8 image, got shape {rgb.shape} {rgb.dtype}", field="image")
    h, w = rgb.shape[:2]
    if h * w > MAX_IMAGE_PIXELS or h < 1 or w < 1:
        raise InputError(f"image: {w}x{h} pixels is outside 1..{MAX_IMAGE_PIXELS} pixels", field="image")
    data = np.ascontiguousarray(rgb)
    ptr = mtmd_cpp.mtmd_bitmap_init(w, h, data.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)))
    return _Bitmap(ptr, data)
