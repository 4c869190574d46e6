"""Decoding untrusted images: common formats work, broken ones give one clear reason."""

from __future__ import annotations

import numpy as np
import pytest
from images import encode, png_bomb

from edge_runtime.errors import ImageError
from edge_runtime.samples import part_image
from edge_runtime.vision import Preprocessor, decode_image


@pytest.mark.parametrize("ext", [".jpg", ".png", ".bmp", ".tiff", ".webp"])
def test_common_formats_decode_to_bgr(ext: str) -> None:
    frame = part_image(3, width=200, height=150)
    decoded = decode_image(encode(frame, ext))
    assert decoded.shape == (150, 200, 3) and decoded.dtype == np.uint8


@pytest.mark.parametrize(("data", "reason"), [
    (b"", "empty"),
    (b"hello, this is a text file\n" * 4, "not an image"),
    (encode(part_image(0), ".jpg")[:3000], "JPEG is truncated"),
    (encode(part_image(0), ".png")[:2000], "truncated|corrupt"),
    (encode(np.zeros((1, 1, 3), np.uint8), ".png"), "1x1 pixels; each side must be at least 16"),
    (png_bomb(), "declares 60000x60000 pixels, more than the limit"),
    (b"GIF89a" + b"\0" * 64, "not an image|unsupported image format"),
])
def test_bad_images_are_refused_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(ImageError, match=reason):
        decode_image(data)


def test_preprocess_matches_the_bundle_spec(demo_bundle) -> None:  # type: ignore[no-untyped-def]
    spec = demo_bundle.manifest.preprocess
    tensor = Preprocessor(spec)(part_image(1))
    assert tensor.shape == (1, 3, spec.height, spec.width) and tensor.dtype == np.float32
    # A mid-grey frame normalises to (0.5 - mean) / std per channel.
    grey = Preprocessor(spec)(np.full((50, 80, 3), 128, np.uint8))
    expected = (128 / 255 - np.array(spec.mean)) / np.array(spec.std)
    assert np.allclose(grey[0, :, 10, 10], expected, atol=1e-5)


def test_letterbox_and_clahe_keep_the_encoder_shape(demo_bundle) -> None:  # type: ignore[no-untyped-def]
    from edge_runtime.bundle import Clahe

    spec = demo_bundle.manifest.preprocess.model_copy(update={"keep_aspect": True, "clahe": Clahe()})
    tensor = Preprocessor(spec)(part_image(2, width=640, height=200))
    assert tensor.shape == (1, 3, spec.height, spec.width)
    # Letterbox padding is the mean colour, which normalises to ~0.
    assert np.abs(tensor[0, :, 0, spec.width // 2]).max() < 0.02
