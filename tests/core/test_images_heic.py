"""HEIC phone photos: decoded by pillow-heif (libheif) under the same pixel and size budgets as every
other format, the header read before a pixel is decoded. The files are encoded by pillow-heif itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_runtime.core import images
from edge_runtime.core.errors import ImageError, ImageTooLarge
from edge_runtime.core.images import decode_image, read_image_file
from edge_runtime.core.samples import part_image
from tests.support.hostile import heic, heic_declaring


def test_a_heic_photo_decodes_to_the_pixels_it_was_encoded_from() -> None:
    part = part_image(2, defect=True)
    frame = decode_image(heic(part, quality=95))
    assert frame.shape == part.shape and frame.dtype == np.uint8
    assert np.abs(frame.astype(int) - part).mean() < 4  # lossy HEVC, colours and layout kept (BGR)


def test_a_heic_over_the_pixel_budget_is_refused_from_its_header_before_any_decode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[int] = []
    monkeypatch.setattr(images, "_decode_heif", lambda data: decoded.append(1))
    with pytest.raises(ImageTooLarge, match="declares 640x480 pixels, more than the limit of 100000"):
        decode_image(heic(part_image(2)), max_pixels=100_000)
    with pytest.raises(ImageTooLarge, match="declares 60000x60000 pixels"):
        decode_image(heic_declaring(60000, 60000))
    assert decoded == []


def test_a_heic_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    photo = tmp_path / "IMG_0001.HEIC"
    photo.write_bytes(heic(part_image(2)))
    assert read_image_file(photo).shape == (480, 640, 3)
    with pytest.raises(ImageTooLarge, match="more than the limit of"):
        read_image_file(photo, max_bytes=photo.stat().st_size - 1)


def test_a_heic_burst_is_refused_like_an_animation() -> None:
    with pytest.raises(ImageError, match="several frames"):
        decode_image(heic(part_image(1), part_image(2)))


def test_a_heic_whose_stream_is_not_the_size_its_header_declares_is_refused() -> None:
    photo = heic(part_image(2))
    for width, height in ((64, 48), (1280, 960)):  # a small header over a larger picture, and back
        with pytest.raises(ImageError, match="HEIF image is corrupt"):
            decode_image(heic_declaring(width, height, photo))
