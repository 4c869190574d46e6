"""Closing the ONNX vision encoder while another thread encodes (a reload during stage 1's encode)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.core.bundle.manifest import Bundle, Manifest
from edge_runtime.inference.vision import VisionEncoder


class _ClosedBetweenReads(VisionEncoder):
    """Stands for the interleaving of two threads: close() runs right after encode() first reads the session."""

    @property
    def session(self) -> Any:
        real = self.__dict__["_session"]
        if real is not None:
            self.__dict__["_session"] = None  # the other thread's close()
        return real

    @session.setter
    def session(self, value: Any) -> None:
        self.__dict__["_session"] = value


def _encoder(bundle: Bundle) -> VisionEncoder:
    m = bundle.manifest
    assert bundle.vision_path is not None and isinstance(m, Manifest)
    return VisionEncoder(Path(bundle.vision_path), m.vision.input, m.vision.output, ["CPUExecutionProvider"], 1)


def test_an_encode_that_began_before_close_finishes_on_the_session_it_read(demo_bundle: Bundle) -> None:
    encoder = _encoder(demo_bundle)
    assert encoder.session is not None
    shape = [d if isinstance(d, int) else 1 for d in encoder.session.get_inputs()[0].shape]
    pixels = np.zeros(shape, np.float32)
    want = encoder.encode(pixels)
    encoder.__class__ = _ClosedBetweenReads
    encoder.__dict__["_session"] = encoder.__dict__.pop("session")
    # Before: the check read a session and the run read None: AttributeError ('NoneType' ... 'run').
    np.testing.assert_array_equal(encoder.encode(pixels), want)
    with pytest.raises(RuntimeError, match="vision encoder is closed"):
        encoder.encode(pixels)  # later encodes are refused by name
