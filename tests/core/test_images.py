"""Decoding untrusted images: common formats work, broken ones give one clear reason."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from edge_runtime.api.admission import image_size
from edge_runtime.core.errors import ImageError, ImageTooLarge
from edge_runtime.core.images import decode_image, read_image_file
from edge_runtime.core.samples import part_image
from edge_runtime.inference.vision import Preprocessor
from tests.support.hostile import corpus, jpeg_scan_bomb, odd_but_valid, pil_bytes, tiff_strip_flood
from tests.support.images import encode, png_bomb

HOSTILE = corpus()


@pytest.mark.parametrize("ext", [".jpg", ".png", ".bmp", ".tiff", ".webp"])
def test_common_formats_decode_to_bgr(ext: str) -> None:
    frame = part_image(3, width=200, height=150)
    decoded = decode_image(encode(frame, ext))
    assert decoded.shape == (150, 200, 3) and decoded.dtype == np.uint8


@pytest.mark.parametrize(("data", "reason"), [
    (b"", "empty"),
    (b"hello, this is a text file\n" * 4, "not an image"),
    (encode(part_image(0), ".jpg")[:3000], "JPEG is corrupt or truncated"),
    (encode(part_image(0), ".png")[:2000], "truncated|corrupt"),
    (encode(np.zeros((1, 1, 3), np.uint8), ".png"), "1x1 pixels; each side must be at least 16"),
    (png_bomb(), "declares 60000x60000 pixels, more than the limit"),
    (b"GIF89a" + b"\0" * 64, "not an image|unsupported image format"),
])
def test_bad_images_are_refused_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(ImageError, match=reason):
        decode_image(data)


@pytest.mark.parametrize(("name", "data", "reason"), HOSTILE, ids=[name for name, _, _ in HOSTILE])
def test_every_hostile_file_is_refused_with_its_reason(name: str, data: bytes, reason: str) -> None:
    with pytest.raises(ImageError) as refused:
        decode_image(data)
    assert re.search(reason, str(refused.value)), str(refused.value)


def test_a_tiff_whose_tiles_dwarf_its_declared_size_is_refused_before_they_are_allocated() -> None:
    """A 200-byte TIFF declaring 16x16 pixels in 16000x16000 tiles: OpenCV allocated a whole tile (1 GiB)
    before finding the data short. Decoded in a child process, whose peak memory is the measure."""
    probe = ("import resource, sys\n"
             "from edge_runtime.core.images import decode_image\n"
             "from tests.support.hostile import tiff_tiled\n"
             "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
             "try:\n"
             "    decode_image(tiff_tiled(16, 16, 16000, 16000, bytes(64)))\n"
             "except Exception as exc:\n"
             "    print(type(exc).__name__, exc)\n"
             "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n")
    child = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                           cwd=Path(__file__).resolve().parents[2])
    refusal, grown_mib = child.stdout.strip().splitlines()
    assert refusal.startswith("ImageTooLarge") and "in tiles of 16000x16000" in refusal, child.stdout + child.stderr
    assert int(grown_mib) < 64, f"decoding the 16x16 TIFF grew the process by {grown_mib} MiB"


def test_a_progressive_jpeg_of_thousands_of_scans_is_refused_before_any_is_decoded() -> None:
    """343 KB of repeated 31-byte scans over a 16-MP grey image kept libjpeg-turbo busy 13 s."""
    data = jpeg_scan_bomb(4096, 4088, 10_000)
    started = time.monotonic()
    with pytest.raises(ImageError, match="10001 scans, more than 100"):
        decode_image(data)
    assert time.monotonic() - started < 1.0


def test_a_tiff_of_millions_of_strip_offsets_is_refused_before_pillow_unpacks_them() -> None:
    """11 MB of strip offsets around a 64x64 image: Pillow's header read took 2.8 s and +390 MB of ints."""
    data = tiff_strip_flood(1_500_000)
    started = time.monotonic()
    with pytest.raises(ImageError, match="3000007 numbers, more than 66048"):
        decode_image(data)
    assert time.monotonic() - started < 0.5


@pytest.mark.parametrize("fmt", ["PCX", "PPM", "SGI", "TGA", "DDS", "QOI"])
def test_pillow_parses_no_format_the_device_refuses(fmt: str) -> None:
    """Pillow's other readers never see the bytes: each is attack surface (a GIF's extension blocks were
    read one by one in Python, 0.1 s a MB) for a file refused anyway."""
    try:
        data = pil_bytes(Image.fromarray(part_image(0, 64, 64)), fmt)
    except (KeyError, OSError):
        data = {"QOI": b"qoif" + bytes(10), "DDS": b"DDS |" + bytes(124)}[fmt]  # Pillow cannot write it
    with pytest.raises(ImageError, match="the data is not an image in a supported format"):
        decode_image(data)
    assert image_size(data) is None


def test_truncated_jpeg_with_an_end_marker_appended_is_refused() -> None:
    whole = encode(part_image(0), ".jpg")
    decode_image(whole)
    with pytest.raises(ImageError, match="JPEG is corrupt or truncated"):
        decode_image(whole[:len(whole) * 2 // 3] + b"\xff\xd9")


@pytest.mark.parametrize(("name", "make", "shape"), odd_but_valid(), ids=[n for n, _, _ in odd_but_valid()])
def test_unusual_but_valid_images_decode_to_bgr(name: str, make: Callable[[], bytes], shape: tuple[int, int]) -> None:
    frame = decode_image(make())
    assert frame.shape == (*shape, 3) and frame.dtype == np.uint8


def test_exif_orientation_is_applied_as_opencv_does() -> None:
    data = dict((n, m) for n, m, _ in odd_but_valid())["exif_rotated.jpg"]()
    ours = decode_image(data)
    reference = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert reference is not None
    assert ours.shape == reference.shape == (320, 240, 3)
    assert np.abs(ours.astype(int) - reference).mean() < 2


def test_cmyk_jpeg_keeps_its_colours() -> None:
    data = dict((n, m) for n, m, _ in odd_but_valid())["cmyk.jpg"]()
    assert np.abs(decode_image(data).astype(int) - part_image(0, 320, 240)).mean() < 4


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = tmp_path / "big.png"
    big.write_bytes(encode(part_image(0), ".png") + b"\0" * 300_000)
    with pytest.raises(ImageTooLarge, match=r"big.png: the file is 0.\d MiB, more than the limit of 0.2 MiB"):
        read_image_file(big, max_bytes=200_000)
    assert read_image_file(big).shape == (480, 640, 3)


def test_preprocess_matches_the_bundle_spec(demo_bundle) -> None:
    spec = demo_bundle.manifest.preprocess
    tensor = Preprocessor(spec)(part_image(1))
    assert tensor.shape == (1, 3, spec.height, spec.width) and tensor.dtype == np.float32
    # A mid-grey frame normalises to (0.5 - mean) / std per channel.
    grey = Preprocessor(spec)(np.full((50, 80, 3), 128, np.uint8))
    expected = (128 / 255 - np.array(spec.mean)) / np.array(spec.std)
    assert np.allclose(grey[0, :, 10, 10], expected, atol=1e-5)


def test_letterbox_and_clahe_keep_the_encoder_shape(demo_bundle) -> None:
    from edge_runtime.core.bundle.manifest import Clahe

    spec = demo_bundle.manifest.preprocess.model_copy(update={"keep_aspect": True, "clahe": Clahe()})
    tensor = Preprocessor(spec)(part_image(2, width=640, height=200))
    assert tensor.shape == (1, 3, spec.height, spec.width)
    # Letterbox padding is the mean colour, which normalises to ~0.
    assert np.abs(tensor[0, :, 0, spec.width // 2]).max() < 0.02


@pytest.mark.parametrize("name", ["rgb16.png", "grey16.png", "palette.png", "grey_alpha.png"])
def test_png_variants_decode_to_the_same_pixels_as_opencv(name: str) -> None:
    data = dict((n, m) for n, m, _ in odd_but_valid())[name]()
    reference = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert reference is not None
    assert np.array_equal(decode_image(data), reference)
