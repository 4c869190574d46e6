"""The encoder cache (inference/encoder_cache.py) on the real encoders: ONNX Runtime (the demo bundle)
and libmtmd (the tiny Qwen2.5-VL pair). A repeated image is a hit with the very embeddings an
uncached encode gives; a crop, another image or another token budget never gets someone else's
encoding; the counters reach /api/v1/status and /metrics."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import Config
from edge_runtime.core.batch import Encoded
from edge_runtime.core.bundle.manifest import Bundle, load_bundle
from edge_runtime.core.errors import InputError
from edge_runtime.core.samples import part_image
from edge_runtime.inference.encoder_cache import EncodeKey, EncoderCache
from edge_runtime.inference.encoding import MediaEncoded, encoded_bytes
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.mtmd import MediaEmbeds
from tests.support.flask_json import json_of
from tests.support.images import encode as encode_image
from tests.support.tiny_pairs import TinyPair, write_pair_bundle


def frames(n: int, seed: int, size: tuple[int, int] = (128, 96)) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8) for _ in range(n)]


@pytest.fixture(scope="module")
def onnx_inspector(demo_bundle: Bundle, config: Config) -> Iterator[Inspector]:
    ins = Inspector(demo_bundle, config.model.model_copy(update={"warmup": False}), config.device_id)
    yield ins
    ins.close()


@pytest.fixture(scope="module")
def qwen_inspector(tiny_pairs: Callable[[str], TinyPair], tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Inspector]:
    pair = tiny_pairs("qwen2.5-vl")
    settings = Config(device_id="t").model.model_copy(update={"threads": 2, "warmup": False})
    ins = Inspector(load_bundle(write_pair_bundle(pair, tmp_path_factory.mktemp("pair") / "q")), settings, "t")
    yield ins
    ins.close()


def same_encoding(a: Encoded, b: Encoded) -> bool:
    """Bit-identical embeddings and, for libmtmd, the same segments (tokens, blocks, positions)."""
    if a.embeds.shape != b.embeds.shape or not np.array_equal(a.embeds, b.embeds) or a.grid != b.grid:
        return False
    if isinstance(a, MediaEncoded) != isinstance(b, MediaEncoded):
        return False
    if isinstance(a, MediaEncoded) and isinstance(b, MediaEncoded):
        if len(a.parts) != len(b.parts):
            return False
        for pa, pb in zip(a.parts, b.parts, strict=True):
            if isinstance(pa, MediaEmbeds) and isinstance(pb, MediaEmbeds):
                if not (np.array_equal(pa.embeds, pb.embeds) and pa.n_pos == pb.n_pos
                        and (pa.mrope is None) == (pb.mrope is None)
                        and (pa.mrope is None or pb.mrope is None or np.array_equal(pa.mrope, pb.mrope))):
                    return False
            elif isinstance(pa, list) and isinstance(pb, list):
                if pa != pb:
                    return False
            else:
                return False
    return True


@pytest.mark.parametrize("kind", ["onnx", "mtmd"])
def test_a_repeated_image_is_a_hit_with_identical_embeddings(kind: str, onnx_inspector: Inspector,
                                                               qwen_inspector: Inspector) -> None:
    ins = onnx_inspector if kind == "onnx" else qwen_inspector
    ins.encoder_cache.clear()
    before = ins.encoder_cache.stats()
    frame = frames(1, seed=11)[0]
    first = ins.encode(frame)
    second = ins.encode(frame.copy())  # the same pixels in another buffer
    after = ins.encoder_cache.stats()
    assert (after["misses"] - before["misses"], after["hits"] - before["hits"]) == (1, 1)
    assert after["entries"] == 1 and after["bytes"] == encoded_bytes(first) > first.embeds.nbytes - 1
    uncached = ins.encoder.encode_uncached(frame)
    assert same_encoding(second, uncached) and same_encoding(first, uncached)
    assert second.embeds is first.embeds  # shared, not encoded again
    assert not second.embeds.flags.writeable  # so no holder can change another's embeddings


@pytest.mark.parametrize("kind", ["onnx", "mtmd"])
def test_a_crop_or_another_image_never_gets_another_encoding(kind: str, onnx_inspector: Inspector,
                                                              qwen_inspector: Inspector) -> None:
    """Each cached answer equals that crop's (that image's) own uncached encoding: a key without the
    crop, or a cache that hands back another image's entry, fails here."""
    ins = onnx_inspector if kind == "onnx" else qwen_inspector
    ins.encoder_cache.clear()
    before = ins.encoder_cache.stats()
    a, b = frames(2, seed=12, size=(160, 120))
    boxes = [None, (0, 0, 96, 64), (40, 30, 96, 64)]
    asked = [(img, box) for img in (a, b) for box in boxes]
    for _ in range(2):  # the first round fills the cache, the second is all hits
        for img, box in asked:
            got = ins.encode(img, crop=box)
            x, y, w, h = box if box is not None else (0, 0, img.shape[1], img.shape[0])
            assert same_encoding(got, ins.encoder.encode_uncached(img[y:y + h, x:x + w])), (box, kind)
            assert (got.width, got.height) == (w, h)
    stats = ins.encoder_cache.stats()
    assert (stats["entries"], stats["hits"] - before["hits"], stats["misses"] - before["misses"]) == (6, 6, 6)


def test_without_a_cache_the_pixels_are_not_hashed(demo_bundle: Bundle, config: Config,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """encoder_cache_mb 0: every encode is the encoder's own, and no frame pays for the hash of its pixels
    (a 1080p frame's sha256 costs milliseconds on a Jetson's cores)."""
    import edge_runtime.inference.encoding as encoding

    settings = config.model.model_copy(update={"warmup": False, "encoder_cache_mb": 0})
    ins = Inspector(demo_bundle, settings, config.device_id)
    try:
        def hashed(frame: np.ndarray) -> str:
            raise AssertionError("the pixels were hashed with the cache off")

        monkeypatch.setattr(encoding, "pixels_digest", hashed)
        img = frames(1, seed=14)[0]
        assert same_encoding(ins.encode(img, crop=(0, 0, 64, 64)), ins.encoder.encode_uncached(img[:64, :64]))
        assert ins.encoder_cache.stats()["entries"] == 0
    finally:
        ins.close()


def test_a_crop_outside_the_frame_is_refused_naming_it(onnx_inspector: Inspector) -> None:
    with pytest.raises(InputError, match=r"crop: \[100, 0, 64, 64\] is not inside the 128x96 frame"):
        onnx_inspector.encode(frames(1, seed=13)[0], crop=(100, 0, 64, 64))


def test_the_cache_is_bounded_by_bytes_least_recently_used_out() -> None:
    cache: EncoderCache[np.ndarray] = EncoderCache(4000, lambda a: a.nbytes)
    keys = [EncodeKey(str(i), "enc", None, 0) for i in range(5)]
    for k in keys[:3]:
        cache.put(k, np.zeros(250, np.float32))  # 1000 bytes each
    assert cache.get(keys[0]) is not None  # keys[0] is now the most recently used
    cache.put(keys[3], np.zeros(250, np.float32))
    cache.put(keys[4], np.zeros(250, np.float32))  # 5000 > 4000: the least recently used (keys[1]) goes
    assert cache.get(keys[1]) is None and cache.get(keys[0]) is not None
    assert cache.stats()["bytes"] == 4000 and len(cache) == 4
    cache.put(EncodeKey("big", "enc", None, 0), np.zeros(251, np.float32))  # over a quarter: not kept
    assert cache.stats()["too_large"] == 1 and len(cache) == 4


def test_another_encoder_or_token_budget_is_another_key(tiny_pairs: Callable[[str], TinyPair],
                                                        tmp_path: Path, qwen_inspector: Inspector) -> None:
    """Two inspectors sharing one cache: a smaller image token budget makes fewer embeddings, and
    the second never gets the first's."""
    shared: EncoderCache[Encoded] = EncoderCache(64 << 20, encoded_bytes)
    settings = Config(device_id="t").model.model_copy(update={"threads": 2, "warmup": False})
    import dataclasses
    small = dataclasses.replace(tiny_pairs("qwen2.5-vl"), image_max_tokens=8)
    frame = frames(1, seed=14, size=(256, 192))[0]
    with Inspector(load_bundle(write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp_path / "big")), settings, "t",
                   encoder_cache=shared) as big, \
            Inspector(load_bundle(write_pair_bundle(small, tmp_path / "small")), settings, "t",
                      encoder_cache=shared) as little:
        full, reduced = big.encode(frame), little.encode(frame)
        assert len(reduced.embeds) <= 8 < len(full.embeds)
        assert same_encoding(reduced, little.encoder.encode_uncached(frame))
        assert shared.stats()["misses"] == 2 and shared.stats()["entries"] == 2


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    from tests.api.test_api import make_daemon

    d = make_daemon(tmp_path_factory.mktemp("cache"), demo_dir, camera=False)
    yield d
    d.stop()


def test_repeated_api_images_show_as_hits_in_status_and_metrics(client: object, daemon: Daemon) -> None:
    jpeg = base64.b64encode(encode_image(part_image(5, defect=False), ".jpg")).decode()
    before = json_of(client.get("/api/v1/status"))["inspection"]["encoder_cache"]  # type: ignore[attr-defined]
    results = [json_of(client.post("/api/v1/infer", json={"image": jpeg})) for _ in range(3)]  # type: ignore[attr-defined]
    assert len({r["text"] for r in results}) == 1
    after = json_of(client.get("/api/v1/status"))["inspection"]["encoder_cache"]  # type: ignore[attr-defined]
    assert after["hits"] - before["hits"] == 2 and after["misses"] - before["misses"] == 1
    assert after["entries"] >= 1 and after["bytes"] > 0
    text = client.get("/metrics").get_data(as_text=True)  # type: ignore[attr-defined]
    assert f'edge_encoder_cache_lookups_total{{outcome="hit"}} {float(after["hits"])}' in text
    assert f"edge_encoder_cache_entries {float(after['entries'])}" in text
