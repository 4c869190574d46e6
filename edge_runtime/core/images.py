"""Untrusted image bytes -> a BGR frame, refusing hostile input before it costs memory.

Every path that turns image bytes into pixels (REST, OpenAI, the CLI, camera folders) comes through
here. The header is read first (Pillow, no pixel decode) and checked against the limits, so a
decompression bomb never allocates its pixels. JPEG is decoded strictly by libjpeg-turbo (simplejpeg):
a truncated scan is an error, not a picture with a grey tail, even when an end-of-image marker was
appended. PNG chunks are checked (CRCs, IEND) before OpenCV decodes; BMP, TIFF and WebP decoders
already fail on missing data. HEIC/HEIF (phone photos) is read by pillow-heif (libheif + libde265):
its header (the `ispe` size) is checked like the others' before a pixel is decoded, and libheif
refuses a stream whose decoded size differs from the header's. Animated, multi-page and multi-image
(HEIC bursts) files are refused: which frame to inspect would be a guess.
"""

from __future__ import annotations

import io
import os
import struct
import warnings
from pathlib import Path

import cv2
import numpy as np
import pillow_heif
import simplejpeg
from PIL import Image

from edge_runtime.core.errors import ImageError, ImageTooLarge
from edge_runtime.core.files import NotRegularFile, open_regular

# Our own max_pixels check replaces Pillow's global bomb warning.
Image.MAX_IMAGE_PIXELS = None
# OpenCV's own "[ WARN:0@1.2] ..." / "[ERROR:0@1.2] imdecode_ ..." lines bypass our logger and the
# one-line-per-event log; every failure is reported in our words (ImageError, a camera's last_error).
# A user who sets OPENCV_LOG_LEVEL (e.g. DEBUG) gets OpenCV's own output back.
if "OPENCV_LOG_LEVEL" not in os.environ:
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_FATAL)
# Pillow warns (on stderr) about the corrupt files we then refuse with our own one-line reason.
warnings.filterwarnings("ignore", category=UserWarning, module=r"PIL\.")
# HEIC/HEIF through Pillow's Image.open: only the primary images, never the thumbnails, depth maps
# and auxiliary images a phone stores beside them (each would cost a decode nobody inspects).
pillow_heif.register_heif_opener(thumbnails=False, depth_images=False, aux_images=False)

SUPPORTED_FORMATS = ("BMP", "HEIF", "JPEG", "PNG", "TIFF", "WEBP")
# Pillow opens only these: its other ~40 readers (GIF's extension blocks one by one in Python, EPS, PSD,
# ...) would parse hostile bytes for a format that is refused anyway. The common ones are still named.
_OTHER_FORMATS = ((b"GIF87a", "GIF"), (b"GIF89a", "GIF"), (b"\0\0\1\0", "ICO"), (b"8BPS", "PSD"),
                  (b"%!PS", "EPS"), (b"\0\0\0\x0cjP  ", "JPEG2000"), (b"\xff\x4f\xff\x51", "JPEG2000"))
MAX_PIXELS = 50_000_000
MIN_SIDE = 16
MAX_FILE_BYTES = 64 * 1024 * 1024
_EXIF_ORIENTATION = 0x0112
# A progressive JPEG may repeat a scan, each one a pass over every block: 343 KB of 31-byte scans kept
# libjpeg-turbo busy 13 s. Encoders write ~10 (libjpeg's script), a few dozen at most; its authors
# suggest a limit for this reason (TJPARAM_SCANLIMIT).
MAX_JPEG_SCANS = 100
MAX_TIFF_TILE_PIXELS = 1 << 20  # a tile of a small TIFF may be padded up to 1024x1024 (4 MiB decoded)
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_JPEG_SEGMENTS = 1000
_STANDALONE = frozenset([0x01, 0xD8, *range(0xD0, 0xD8)])  # markers without a length


def decode_image(data: bytes, max_pixels: int = MAX_PIXELS, min_side: int = MIN_SIDE) -> np.ndarray:
    """Decode JPEG/PNG/BMP/TIFF/WebP/HEIC bytes to a BGR uint8 frame, or raise ImageError saying why."""
    if not data:
        raise ImageError("the image is empty (0 bytes)")
    too_many = header_flood(data)
    if too_many:
        raise ImageError(too_many)
    other = next((name for magic, name in _OTHER_FORMATS if data.startswith(magic)), None)
    if other is not None:
        raise ImageError(f"unsupported image format {other}; use one of {', '.join(sorted(SUPPORTED_FORMATS))}")
    try:
        with Image.open(io.BytesIO(data), formats=SUPPORTED_FORMATS) as header:
            fmt, (width, height) = header.format, header.size
            animated = bool(getattr(header, "is_animated", False))
            orientation = _orientation(header) if fmt == "JPEG" else 1
            tile = _tiff_tile(header) if fmt == "TIFF" else None
    except Exception:  # noqa: BLE001 - Pillow raises many types for garbage input
        raise ImageError("the data is not an image in a supported format "
                         f"({', '.join(sorted(SUPPORTED_FORMATS))})") from None
    if width * height > max_pixels:
        raise ImageTooLarge(f"the image declares {width}x{height} pixels, more than the limit of "
                            f"{max_pixels} pixels")
    if min(width, height) < min_side:
        raise ImageError(f"the image is {width}x{height} pixels; each side must be at least {min_side}")
    if tile is not None and tile[0] * tile[1] > max(_pad(width) * _pad(height), MAX_TIFF_TILE_PIXELS):
        # OpenCV allocates a whole tile (4 bytes a pixel) before reading it: a 200-byte file declaring
        # 16x16 pixels in 16000x16000 tiles took 1 GiB. A writer pads tiles of a small image, no more.
        raise ImageTooLarge(f"the TIFF declares {width}x{height} pixels in tiles of {tile[0]}x{tile[1]}, "
                            f"larger than the image they tile and than {MAX_TIFF_TILE_PIXELS} pixels")
    if animated:
        raise ImageError(f"the {fmt} image has several frames (animated or multi-page); send one still image")
    if fmt == "JPEG":
        # Counted in C; an FF DA inside entropy-coded data is always stuffed (FF 00), so only markers
        # count (and those of an EXIF thumbnail: a few more, never a hundred).
        scans = data.count(b"\xff\xda")
        if scans > MAX_JPEG_SCANS:
            raise ImageError(f"the JPEG has {scans} scans, more than {MAX_JPEG_SCANS} (each one a pass over "
                             "the whole image); re-encode it")
        return _orient(_decode_jpeg(data), orientation)
    if fmt == "PNG":
        return _decode_png(data)
    if fmt == "HEIF":
        return _decode_heif(data)
    try:
        decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    except cv2.error:  # some decoders raise where others return None
        decoded = None
    if decoded is None:
        raise ImageError(f"the {fmt} image is corrupt or truncated and could not be decoded")
    return decoded


def read_image_file(path: Path | str, max_pixels: int = MAX_PIXELS, min_side: int = MIN_SIDE,
                    max_bytes: int = MAX_FILE_BYTES) -> np.ndarray:
    """decode_image on a file, its size checked before a byte is read."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise ImageError(f"{path} is a folder, not an image file")
        if size > max_bytes:
            raise ImageTooLarge(f"{path}: the file is {_mib(size)}, more than the limit of {_mib(max_bytes)}")
        with open_regular(path) as f:  # a FIFO would block the read forever
            data = f.read(max_bytes + 1)  # the file may have grown since stat()
    except NotRegularFile as exc:
        raise ImageError(f"{path}: {exc}") from None
    except FileNotFoundError:
        raise ImageError(f"{path}: no such file") from None
    except OSError as exc:
        raise ImageError(f"{path} cannot be read: {exc.strerror}") from None
    if len(data) > max_bytes:
        raise ImageTooLarge(f"{path}: the file is larger than the limit of {_mib(max_bytes)}")
    try:
        return decode_image(data, max_pixels, min_side)
    except ImageTooLarge as exc:
        raise ImageTooLarge(f"{path}: {exc}") from None
    except ImageError as exc:
        raise ImageError(f"{path}: {exc}") from None


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 10 * 2**20 else f"{n / 2**20:.0f} MiB"


def _decode_jpeg(data: bytes) -> np.ndarray:
    # strict: libjpeg's "recoverable" warnings (premature end of data, corrupt segments) are errors.
    try:
        return np.asarray(simplejpeg.decode_jpeg(data, colorspace="BGR", strict=True))
    except (ValueError, RuntimeError) as exc:
        reason = str(exc).strip().rstrip(".") or "decoder error"
        raise ImageError(f"the JPEG is corrupt or truncated ({reason})") from None


def _decode_png(data: bytes) -> np.ndarray:
    """Chunks first (every CRC, IEND), then Pillow's decoder, which raises on a short zlib stream
    where libpng (in OpenCV) would print to stderr. Converted as OpenCV's IMREAD_COLOR does."""
    try:
        with Image.open(io.BytesIO(data)) as png:
            png.verify()
        with Image.open(io.BytesIO(data)) as png:
            png.load()
            if png.mode.startswith("I"):  # 16-bit grey: keep the high byte, as OpenCV does
                grey = (np.asarray(png).astype(np.uint32) >> 8).clip(0, 255).astype(np.uint8)
                return cv2.cvtColor(grey, cv2.COLOR_GRAY2BGR)
            return cv2.cvtColor(np.asarray(png.convert("RGB")), cv2.COLOR_RGB2BGR)
    except Exception as exc:  # noqa: BLE001 - Pillow raises SyntaxError, OSError, struct.error...
        raise ImageError(f"the PNG is corrupt or truncated ({exc})") from None


def _decode_heif(data: bytes) -> np.ndarray:
    """libheif applies the file's rotation and mirroring (irot/imir) and brings 10-bit HEIC to 8 bits."""
    try:
        with Image.open(io.BytesIO(data)) as heif:
            heif.load()
            return cv2.cvtColor(np.asarray(heif.convert("RGB")), cv2.COLOR_RGB2BGR)
    except Exception as exc:  # noqa: BLE001 - libheif's errors arrive as ValueError, RuntimeError, OSError
        reason = " ".join(str(exc).split())[:160].rstrip(".") or "decoder error"
        raise ImageError(f"the HEIF image is corrupt or truncated ({reason})") from None


def header_flood(data: bytes) -> str | None:
    """Why Pillow must not read this file's header (too many PNG chunks or JPEG segments for its size),
    or None. Pillow reads them one by one in Python before it knows the image's size."""
    return png_chunks_over(data) or jpeg_segments_over(data) or tiff_values_over(data)


def tiff_values_over(data: bytes) -> str | None:
    """Why a TIFF's first two directories hold too many numbers for its height (None: they do not, or it
    is no TIFF). Pillow unpacks each SHORT/LONG/RATIONAL value of a tag into a Python int: 11 MB of strip
    offsets around a 64x64 image took 5 s and +390 MB. A strip a row, per sample, is 8 per row at most."""
    endian = {b"II": "little", b"MM": "big"}.get(data[:2])
    if endian is None or len(data) < 16:
        return None

    def number(at: int, size: int) -> int:
        return int.from_bytes(data[at:at + size], endian)  # type: ignore[arg-type]

    big = number(2, 2) == 43  # BigTIFF: 8-byte counts and offsets, 20-byte entries
    word, entry = (8, 20) if big else (4, 12)
    at, values, height = number(8 if big else 4, word), 0, 0
    for _ in range(2):  # Pillow reads the second directory to see whether the file is multi-page
        if not 0 < at <= len(data) - word:
            break
        n = number(at, 8 if big else 2)
        pos = at + (8 if big else 2)
        for _ in range(min(n, 65536)):
            if pos + entry > len(data):
                break
            tag, kind, count = number(pos, 2), number(pos + 2, 2), number(pos + 4, word)
            if tag == 257:  # ImageLength: a SHORT or LONG at the start of the value field
                height = number(pos + 4 + word, 2 if kind == 3 else 4)
            if kind not in (1, 2, 6, 7):  # bytes and text stay bytes; every other type becomes ints
                values += count
            pos += entry
        at = number(pos, word) if pos + word <= len(data) else 0
    limit = 65536 + 8 * min(height, 65536)
    if values > limit:
        return f"the TIFF's directories hold {values} numbers, more than {limit} for its {height} rows"
    return None


def jpeg_segments_over(data: bytes) -> str | None:
    """Why a JPEG has too many marker segments or fill bytes before its first scan (None: it has not, or
    it is no JPEG); walked up to the bound. 4 MB of empty COM segments took 1.8 s to read the header and
    as long again to decode; cameras write a dozen (EXIF, ICC, tables)."""
    if not data.startswith(b"\xff\xd8"):
        return None
    pos, steps = 2, 0
    while pos + 4 <= len(data) and data[pos] == 0xFF:  # junk instead of a marker: the strict decoder says so
        marker = data[pos + 1]
        if marker == 0xDA:  # the first scan: libjpeg (C) reads the rest
            return None
        if marker == 0xFF:  # a fill byte
            pos += 1
        elif marker in _STANDALONE:
            pos += 2
        else:
            pos += 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
        steps += 1
        if steps > MAX_JPEG_SEGMENTS:
            return f"the JPEG has more than {MAX_JPEG_SEGMENTS} marker segments or fill bytes before its image data"
    return None


def png_chunks_over(data: bytes) -> str | None:
    """Why a PNG has too many chunks for its size (None: it has not, or it is no PNG), found by walking
    chunk headers and stopping at the bound. Pillow reads every chunk in Python, the header too: 11 MB of
    empty unknown chunks around a 64x64 image took 14 s. Encoders write about one chunk per 8 KB of image
    data (or one per row); the bound is a thousand more than either."""
    if not data.startswith(_PNG_SIGNATURE) or len(data) < 24:
        return None
    (height,) = struct.unpack_from(">I", data, 20)  # IHDR comes first
    limit = 1000 + len(data) // 1024 + min(height, 1 << 16)
    pos, count = len(_PNG_SIGNATURE), 0
    while pos + 8 <= len(data):
        (length,) = struct.unpack_from(">I", data, pos)
        if data[pos + 4:pos + 8] == b"IEND":  # what follows is not read by any decoder
            return None
        pos += 12 + length
        count += 1
        if count > limit:
            return f"the PNG has more than {limit} chunks in {len(data)} bytes (each read on its own); re-encode it"
    return None


def _tiff_tile(header: Image.Image) -> tuple[int, int] | None:
    """(width, height) of a tiled TIFF's tiles, from its header; None when it is in strips (a strip is
    never wider than the image, and OpenCV clips its rows to the image's)."""
    tags = getattr(header, "tag_v2", None)
    tile_w, tile_h = (tags.get(322), tags.get(323)) if tags is not None else (None, None)
    if not isinstance(tile_w, int) or not isinstance(tile_h, int):
        return None
    return tile_w, tile_h


def _pad(side: int) -> int:
    return -(-side // 16) * 16  # TIFF tiles are multiples of 16 pixels


def _orientation(header: Image.Image) -> int:
    try:
        value = header.getexif().get(_EXIF_ORIENTATION, 1)
    except Exception:  # noqa: BLE001 - broken EXIF is ignored, as cameras' viewers do
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _orient(frame: np.ndarray, orientation: int) -> np.ndarray:
    """Apply the EXIF orientation (as OpenCV's imread does), so every decode path agrees."""
    if orientation == 2:
        return cv2.flip(frame, 1)
    if orientation == 3:
        return cv2.rotate(frame, cv2.ROTATE_180)
    if orientation == 4:
        return cv2.flip(frame, 0)
    if orientation == 5:
        return cv2.transpose(frame)
    if orientation == 6:
        return cv2.rotate(frame, cv2.ROTATE_90_CLOCKWISE)
    if orientation == 7:
        return cv2.flip(cv2.transpose(frame), -1)
    if orientation == 8:
        return cv2.rotate(frame, cv2.ROTATE_90_COUNTERCLOCKWISE)
    return frame
