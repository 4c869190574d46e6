"""The hostile image corpus: files a decoder must refuse with a reason, generated (no binaries in git).

    python tests/support/hostile.py [DIR]      writes every file into DIR (default tests/fixtures/hostile/)

Each entry is (file name, bytes, regex the refusal must match). `odd_but_valid()` gives the unusual
images that must decode (CMYK, 16-bit, palette, grey+alpha, EXIF-rotated, HEIC).
HEIC files are encoded by pillow-heif itself (libheif + x265), as a phone would write them.
"""

from __future__ import annotations

import io
import struct
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pillow_heif
from PIL import Image

from edge_runtime.core.samples import part_image

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "hostile"


def encode(frame: np.ndarray, ext: str) -> bytes:
    ok, buf = cv2.imencode(ext, frame)
    assert ok, ext
    return buf.tobytes()


def pil_bytes(image: Image.Image, fmt: str, **kwargs: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kwargs)
    return buf.getvalue()


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width: int, height: int, idat: bytes, color_type: int = 2) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def png_chunk_flood(megabytes: float, kind: bytes = b"abCd") -> bytes:
    """A valid 64x64 PNG whose image data follows `megabytes` of empty ancillary chunks (12 bytes each)."""
    raw = b"".join(b"\0" + bytes(range(192)) for _ in range(64))
    flood = chunk(kind, b"") * int(megabytes * 2**20 // 12)
    full = png(64, 64, zlib.compress(raw))
    return full[:33] + flood + full[33:]  # after the signature and IHDR


def jpeg_segment_flood(megabytes: float, segment: bytes = b"\xff\xfe\x00\x02") -> bytes:
    """A valid 64x64 JPEG whose header holds `megabytes` of empty segments (COM by default) or fill bytes."""
    jpg = encode(part_image(0, 64, 64), ".jpg")
    return jpg[:2] + segment * int(megabytes * 2**20 // len(segment)) + jpg[2:]


def png_in_idats(data: bytes, size: int) -> bytes:
    """The same PNG with its image data split into IDAT chunks of `size` bytes (as streaming encoders do)."""
    i = data.index(b"IDAT") - 4
    (length,) = struct.unpack(">I", data[i:i + 4])
    idat = data[i + 8:i + 8 + length]
    split = b"".join(chunk(b"IDAT", idat[k:k + size]) for k in range(0, length, size))
    return data[:i] + split + data[i + 12 + length:]


def png_zero_bomb(width: int, height: int) -> bytes:
    """A complete, valid black RGB PNG: tiny on disk, width*height*3 bytes once decoded."""
    z = zlib.compressobj(1)  # fast; the file size does not matter
    row = b"\0" * (1 + 3 * width)  # filter byte + pixels
    parts = [z.compress(row) for _ in range(height)]
    parts.append(z.flush())
    return png(width, height, b"".join(parts))


def jpeg_declaring(width: int, height: int) -> bytes:
    """A real JPEG whose SOF0 is rewritten to declare another size (a header-only bomb)."""
    data = bytearray(encode(part_image(0, 64, 64), ".jpg"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def heic(frame: np.ndarray, *more: np.ndarray, quality: int = 90) -> bytes:
    """A real HEIC (HEVC in HEIF) of a BGR frame, encoded by libheif's x265; `more` frames make a
    multi-image file (a phone's burst)."""
    images = [Image.fromarray(np.ascontiguousarray(f[:, :, ::-1])) for f in (frame, *more)]
    heif = pillow_heif.from_pillow(images[0])
    for image in images[1:]:
        heif.add_from_pillow(image)
    buf = io.BytesIO()
    heif.save(buf, quality=quality)
    return buf.getvalue()


def heic_declaring(width: int, height: int, data: bytes | None = None) -> bytes:
    """A real HEIC whose `ispe` box (the size the header declares) is rewritten."""
    data = data if data is not None else heic(_part())
    i = data.index(b"ispe")  # box: size, 'ispe', version+flags, width, height
    return data[:i + 8] + struct.pack(">II", width, height) + data[i + 16:]


def _part(width: int = 320, height: int = 240) -> np.ndarray:
    return part_image(0, width, height)


def _rgb(frame: np.ndarray) -> Image.Image:
    return Image.fromarray(np.ascontiguousarray(frame[:, :, ::-1]))


def corpus() -> list[tuple[str, bytes, str]]:
    jpg = encode(_part(), ".jpg")
    progressive = pil_bytes(_rgb(_part()), "JPEG", progressive=True)
    good_png = encode(_part(), ".png")
    bad_crc = bytearray(good_png)
    bad_crc[100] ^= 0xFF
    raw = b"".join(b"\0" + _part()[y, :, ::-1].tobytes() for y in range(240))
    frames = [_rgb(_part()), _rgb(part_image(1, 320, 240))]
    photo = heic(_part())
    return [
        ("empty.jpg", b"", "empty"),
        ("text.png", b"hello, this is a text file\n" * 8, "not an image"),
        ("random.jpg", np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes(), "not an image"),
        ("svg.png", b'<svg xmlns="http://www.w3.org/2000/svg" width="9999" height="9999"/>', "not an image"),
        ("gif.gif", pil_bytes(_rgb(_part()), "GIF"), "unsupported image format GIF"),
        ("icon.png", pil_bytes(_rgb(_part(64, 64)), "ICO"), "unsupported image format ICO"),
        ("jpeg_truncated.jpg", jpg[:len(jpg) // 2], "JPEG is corrupt or truncated"),
        ("jpeg_truncated_eoi.jpg", jpg[:len(jpg) // 2] + b"\xff\xd9", "JPEG is corrupt or truncated"),
        ("jpeg_progressive_truncated_eoi.jpg", progressive[:len(progressive) // 2] + b"\xff\xd9",
         "JPEG is corrupt or truncated"),
        ("jpeg_header_only.jpg", jpg[:400], "JPEG is corrupt or truncated|not an image"),
        ("jpeg_scan_bomb.jpg", jpeg_scan_bomb(1536, 1024, 1000), "1001 scans, more than 100"),
        ("jpeg_bomb.jpg", jpeg_declaring(60000, 60000), "declares 60000x60000 pixels, more than the limit"),
        ("png_bomb_header.png", png(60000, 60000, zlib.compress(b"\0" * 1024)), "declares 60000x60000 pixels"),
        ("png_bomb_zeros.png", png_zero_bomb(8000, 8000), "declares 8000x8000 pixels, more than the limit"),
        ("jpeg_comment_flood.jpg", jpeg_segment_flood(1), "more than 1000 marker segments"),
        ("jpeg_fill_flood.jpg", jpeg_segment_flood(0.1, b"\xff"), "more than 1000 marker segments or fill bytes"),
        ("png_chunk_flood.png", png_chunk_flood(1), "more than 2088 chunks"),
        ("png_truncated.png", good_png[:len(good_png) // 2], "truncated|corrupt"),
        ("png_truncated_iend.png", good_png[:len(good_png) // 2] + chunk(b"IEND", b""), "truncated|corrupt"),
        ("png_bad_crc.png", bytes(bad_crc), "PNG is corrupt or truncated"),
        ("png_short_zlib.png", png(320, 240, zlib.compress(raw)[:5000]), "corrupt or truncated"),
        ("png_animated.png", pil_bytes(frames[0], "PNG", save_all=True, append_images=frames[1:]),
         "several frames"),
        ("png_1x1.png", encode(np.zeros((1, 1, 3), np.uint8), ".png"), "each side must be at least 16"),
        ("png_thin.png", png_zero_bomb(20000, 1), "each side must be at least 16"),
        ("webp_animated.webp", pil_bytes(frames[0], "WEBP", save_all=True, append_images=frames[1:]),
         "several frames"),
        ("webp_truncated.webp", encode(_part(), ".webp")[:600], "corrupt or truncated|not an image"),
        ("tiff_multipage.tif", pil_bytes(frames[0], "TIFF", save_all=True, append_images=frames[1:]),
         "several frames"),
        ("tiff_truncated.tif", encode(_part(), ".tiff")[:5000], "corrupt or truncated|not an image"),
        ("tiff_tile_bomb.tif", tiff_tiled(16, 16, 16000, 16000, b"\0" * 64), "in tiles of 16000x16000"),
        ("tiff_strip_flood.tif", tiff_strip_flood(100_000), "200007 numbers, more than 66048 for its 64 rows"),
        ("bmp_truncated.bmp", encode(_part(), ".bmp")[:20000], "corrupt or truncated"),
        ("bmp_bomb.bmp", _bmp_declaring(70000, 70000), "declares 70000x70000 pixels"),
        ("heic_bomb.heic", heic_declaring(60000, 60000, photo), "declares 60000x60000 pixels, more than the limit"),
        ("heic_stream_larger_than_header.heic", heic_declaring(64, 48, photo), "HEIF image is corrupt"),
        ("heic_stream_smaller_than_header.heic", heic_declaring(640, 480, photo), "HEIF image is corrupt"),
        ("heic_burst.heic", heic(_part(), part_image(1, 320, 240)), "several frames"),
        ("heic_truncated.heic", photo[:len(photo) // 2], "HEIF image is corrupt or truncated"),
        ("heic_header_only.heic", photo[:300], "not an image|HEIF image is corrupt"),
    ]


def tiff_tiled(width: int, height: int, tile_w: int, tile_h: int, tile_data: bytes | None = None) -> bytes:
    """A grey, uncompressed, tiled TIFF (Pillow writes strips only). Its tiles hold a ramp unless
    `tile_data` (what every tile offset points at) is given: a short one makes a tile bomb, a file
    whose tiles are far larger than the image it declares."""
    across, down = -(-width // tile_w), -(-height // tile_h)
    count = across * down
    if tile_data is None:
        tile_data = bytes(i % 251 for i in range(tile_w * tile_h))
    tags = [(256, 4, 1, width), (257, 4, 1, height), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
            (277, 3, 1, 1), (322, 4, 1, tile_w), (323, 4, 1, tile_h), (324, 4, count, 0), (325, 4, count, 0)]
    ifd_size = 2 + 12 * len(tags) + 4
    arrays = 8 + ifd_size  # the offsets and byte counts arrays, then the tile data
    data_at = arrays + (8 * count if count > 1 else 0)
    out = bytearray(b"II*\0" + struct.pack("<I", 8) + struct.pack("<H", len(tags)))
    for tag, kind, n, value in tags:
        if tag == 324:
            value = arrays if count > 1 else data_at
        elif tag == 325:
            value = arrays + 4 * count if count > 1 else len(tile_data)
        out += struct.pack("<HHII", tag, kind, n, value) if kind == 4 else struct.pack("<HHIHH", tag, kind, n, value, 0)
    out += b"\0\0\0\0"
    if count > 1:
        out += struct.pack(f"<{count}I", *[data_at] * count) + struct.pack(f"<{count}I", *[len(tile_data)] * count)
    return bytes(out + tile_data)


def tiff_strip_flood(strips: int, width: int = 64, height: int = 64) -> bytes:
    """A valid grey 64x64 TIFF whose StripOffsets and StripByteCounts list `strips` entries, all the same
    row (far more strips than rows: Pillow unpacks every entry into a Python int)."""
    tags = [(256, 4, 1, width), (257, 4, 1, height), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
            (273, 4, strips, 0), (277, 3, 1, 1), (278, 4, 1, 1), (279, 4, strips, 0)]
    arrays = 8 + 2 + 12 * len(tags) + 4
    pixels = arrays + 8 * strips
    out = bytearray(b"II*\0" + struct.pack("<IH", 8, len(tags)))
    for tag, kind, count, value in tags:
        value = {273: arrays, 279: arrays + 4 * strips}.get(tag, value)
        out += struct.pack("<HHII", tag, kind, count, value) if kind == 4 else struct.pack("<HHIHH", tag, kind, count,
                                                                                           value, 0)
    out += b"\0\0\0\0" + struct.pack(f"<{strips}I", *[pixels] * strips) + struct.pack(f"<{strips}I", *[width] * strips)
    return bytes(out + bytes(range(width)))


def _stuffed_bits(bits: str) -> bytes:
    """Entropy-coded bytes of a bit string, padded with 1s, each FF followed by 00 as JPEG stuffs it."""
    bits += "1" * (-len(bits) % 8)
    out = bytearray()
    for i in range(0, len(bits), 8):
        out.append(int(bits[i:i + 8], 2))
        if out[-1] == 0xFF:
            out.append(0)
    return bytes(out)


def _segment(marker: int, payload: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload


def jpeg_scan_bomb(width: int, height: int, scans: int) -> bytes:
    """A valid grey progressive JPEG: one DC scan, then `scans` identical AC first scans (Ah=0, which
    libjpeg accepts again without a warning), each ending every block through EOB runs: ~30 bytes a
    scan, each a pass over every block. Its blocks must make EOB runs of 16384..32767."""
    blocks = -(-width // 8) * -(-height // 8)
    runs = [32767] * (blocks // 32767) + ([blocks % 32767] if blocks % 32767 else [])
    assert all(r >= 16384 for r in runs), "pick a size whose blocks make runs of 16384..32767"
    head = b"\xff\xd8" + _segment(0xDB, b"\0" + bytes([1] * 64))
    head += _segment(0xC2, struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00")  # SOF2, grey
    # One symbol per table, so each has a 1-bit code: DC category 0, AC EOB14 (a run of 2^14 + 14 bits).
    head += _segment(0xC4, b"\x00" + bytes([1] + [0] * 15) + b"\x00")
    head += _segment(0xC4, b"\x10" + bytes([1] + [0] * 15) + b"\xe0")
    dc = _segment(0xDA, b"\x01\x01\x00\x00\x00\x00") + _stuffed_bits("0" * blocks)
    ac = _segment(0xDA, b"\x01\x01\x00\x01\x3f\x00") + _stuffed_bits("".join(
        "0" + format(r - 16384, "014b") for r in runs))
    return head + dc + ac * scans + b"\xff\xd9"


def _bmp_declaring(width: int, height: int) -> bytes:
    data = bytearray(encode(_part(32, 32), ".bmp"))
    data[18:26] = struct.pack("<ii", width, height)
    return bytes(data)


def _exif_rotated() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 clockwise to display
    return pil_bytes(_rgb(_part(320, 240)), "JPEG", exif=exif.tobytes())


def odd_but_valid() -> list[tuple[str, Callable[[], bytes], tuple[int, int]]]:
    """(name, bytes factory, expected (height, width)) of unusual images that must decode to BGR."""
    part = _part()
    return [
        ("cmyk.jpg", lambda: pil_bytes(_rgb(part).convert("CMYK"), "JPEG"), (240, 320)),
        ("grey.jpg", lambda: pil_bytes(_rgb(part).convert("L"), "JPEG"), (240, 320)),
        ("exif_rotated.jpg", _exif_rotated, (320, 240)),
        ("rgb16.png", lambda: encode(part.astype(np.uint16) * 257, ".png"), (240, 320)),
        ("grey16.png", lambda: encode(part[:, :, 0].astype(np.uint16) * 257, ".png"), (240, 320)),
        ("palette.png", lambda: pil_bytes(_rgb(part).convert("P"), "PNG", transparency=0), (240, 320)),
        ("grey_alpha.png", lambda: pil_bytes(_rgb(part).convert("LA"), "PNG"), (240, 320)),
        ("rgba.webp", lambda: pil_bytes(_rgb(part).convert("RGBA"), "WEBP"), (240, 320)),
        ("rgb16.tif", lambda: encode(part.astype(np.uint16) * 257, ".tiff"), (240, 320)),
        ("tiled.tif", lambda: tiff_tiled(300, 200, 64, 64), (200, 300)),
        ("tiled_padded.tif", lambda: tiff_tiled(40, 40, 256, 256), (40, 40)),
        ("jpeg_99_scans.jpg", lambda: jpeg_scan_bomb(1536, 1024, 98), (1024, 1536)),
        ("png_row_idats.png", lambda: png_in_idats(encode(part, ".png"), 64), (240, 320)),
        ("tiff_strip_a_row.tif", lambda: tiff_strip_flood(64), (64, 64)),
        ("jpeg_trailing_bytes.jpg", lambda: encode(part, ".jpg") + b"\0" * 64, (240, 320)),
        ("photo.heic", lambda: heic(part), (240, 320)),
    ]


def write_corpus(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data, _ in corpus():
        (folder / name).write_bytes(data)
        paths.append(folder / name)
    return paths


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    print("\n".join(str(p) for p in write_corpus(out)))
