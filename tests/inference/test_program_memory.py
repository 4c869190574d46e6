"""What inspection programs' references hold in memory (inference/programs.py, memory_fit.py), on the tiny
GGUF + mmproj pairs with real llama.cpp / libmtmd:

- the count made before anything is encoded is, to the byte, what the loaded references' arrays hold, on
  every family (M-RoPE positions, a slicing model's several chunks);
- start (`open_inspector`), reload (`use_programs` with `references_check`) and `config validate`
  (`check_programs_offline`) refuse, in one line naming the programs and the figures, references that
  do not fit; a reload counts only what it does not hold already;
- the same picture (one file named twice, or two files with the same pixels, in one program or several)
  is encoded once and held once, with the encoder cache off or too small to keep it, and a reload with
  the same references encodes nothing.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.config import Config, ImageLimits, ProgramConfig, ReferenceConfig
from edge_runtime.core.batch import Encoded
from edge_runtime.core.bundle.gguf_header import read_header
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.core.errors import ConfigError
from edge_runtime.inference import memory_fit
from edge_runtime.inference.encoding import MediaEncoded, array_bytes, encoded_bytes
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm import runtime as engines_runtime
from edge_runtime.inference.llm.mtmd import MediaEmbeds
from edge_runtime.inference.memory_fit import HostMemory, language_shape, need_of, references_check
from edge_runtime.inference.model_source import open_inspector
from edge_runtime.inference.program_fit import check_programs_offline
from edge_runtime.inference.programs import LoadedProgram, ReferenceMemory
from tests.support.images import encode
from tests.support.tiny_pairs import FAMILIES, TinyPair, write_pair_bundle

GiB = 2**30


def picture(path: Path, seed: int, size: tuple[int, int] = (96, 72)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    path.write_bytes(encode(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), ".png"))
    return path


def refs(*paths: Path) -> ProgramConfig:
    return ProgramConfig(references=[ReferenceConfig(image=p, caption=f"sample {i}") for i, p in enumerate(paths)])


def held(programs: dict[str, LoadedProgram]) -> list[Encoded]:
    """The distinct encodings the programs hold."""
    return list({id(r.encoded): r.encoded for p in programs.values() for r in p.references}.values())


def encodes(ins: Inspector) -> int:
    return sum(ins.encoder.lane_encodes)


@pytest.fixture(scope="module")
def qwen(tiny_pairs: Callable[[str], TinyPair], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp_path_factory.mktemp("memory") / "bundle")


def inspector(bundle: Path, cache_mb: int = 0) -> Inspector:
    settings = Config(device_id="t").model.model_copy(
        update={"threads": 2, "warmup": False, "encoder_cache_mb": cache_mb})
    return Inspector(load_bundle(bundle), settings, "t")


@pytest.fixture
def qwen_ins(qwen: Path) -> Iterator[Inspector]:
    ins = inspector(qwen)
    yield ins
    ins.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_count_before_encoding_is_what_the_references_hold(
        family: str, tiny_pairs: Callable[[str], TinyPair], tmp_path: Path) -> None:
    """Counted from each file's size (libmtmd's chunks, no encode), then encoded: the bytes of the arrays
    the loaded references hold (embeddings, M-RoPE positions) equal the count, and so do the tokens."""
    ins = inspector(write_pair_bundle(tiny_pairs(family), tmp_path / "bundle"))
    try:
        a, b = picture(tmp_path / "a.png", 1), picture(tmp_path / "b.png", 2, (400, 300))  # b: MiniCPM slices it
        seen: list[ReferenceMemory] = []
        ins.use_programs({"p": refs(a, b), "q": refs(b)}, [], ImageLimits(), fit=seen.append)
        [counted] = seen
        programs = ins._programs[0]
        encodings = held(programs)
        assert counted.images == len(encodings) == 2
        assert counted.total == counted.new == array_bytes(encodings)
        assert counted.tokens == sum(len(e.embeds) for e in encodings)
        assert counted.programs == {"p": counted.total, "q": array_bytes(held({"q": programs["q"]}))}
        assert counted.n_embd == ins.language.n_embd
        # `config validate` counts with the width the GGUF's header gives (its vocabulary-only model says 0)
        assert language_shape(read_header(ins.bundle.language_path)).n_embd_inp == counted.n_embd
    finally:
        ins.close()


def small_host(bundle: Path, config: Config, spare: int) -> Callable[[], HostMemory]:
    """host_memory() of a device whose free memory holds the model (as check_fit counts it) and `spare`
    bytes more: before the model loads, then (the model's share taken) after."""
    need = need_of(load_bundle(bundle), config, gpu_offload=False)
    states = iter([HostMemory(need.host_resident(False) + spare, 8 * GiB, "MemAvailable"),
                   HostMemory(spare, 8 * GiB, "MemAvailable")])
    return lambda: next(states)


def test_start_refuses_references_that_do_not_fit_in_one_line(qwen: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The model fits what is free, its references do not: start used to load it and encode them all."""
    a, b = picture(tmp_path / "a.png", 1), picture(tmp_path / "b.png", 2)
    config = Config.model_validate({
        "device_id": "t", "data_dir": str(tmp_path / "data"),
        "model": {"path": str(qwen), "threads": 2, "warmup": False, "encoder_cache_mb": 0},
        "programs": {"housing": refs(a, b).model_dump(), "cover": refs(b).model_dump()},
        "cameras": [{"name": "belt", "source": "x.png", "program": "housing"}]})
    monkeypatch.setattr(memory_fit, "host_memory", small_host(qwen, config, 4096))
    monkeypatch.setattr(memory_fit, "unified_memory", lambda: False)
    monkeypatch.setattr(engines_runtime, "engine_info", lambda: {"gpu_offload": False})
    with pytest.raises(ConfigError) as refused:
        open_inspector(config, None)
    line = str(refused.value)
    assert "\n" not in line and line.startswith("the inspection programs' references do not fit this device's "
                                                "memory: "), line
    assert "more must be free in RAM but" in line and "(MemAvailable)" in line
    # two 96x72 pictures of 9 tokens each: a token is 64 float32 and 2 x 4 int32 M-RoPE positions, 288 B
    assert "5.1 KiB more must be free in RAM but 4.0 KiB is (MemAvailable)" in line, line
    assert "their embeddings take 5.1 KiB (2 distinct images, 18 image tokens at 288 B a token as held, " \
           "rows of 64 float32): programs.housing 5.1 KiB, programs.cover 2.5 KiB" in line, line
    assert "programs.housing " in line and "programs.cover " in line and "model.memory_check: false" in line
    # model.memory_check: false loads them anyway
    config.model.memory_check = False
    open_inspector(config, None).close()


def test_a_reload_counts_only_the_references_it_does_not_hold(qwen_ins: Inspector, qwen: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    ins = qwen_ins
    a, b, c = (picture(tmp_path / f"{n}.png", i) for i, n in enumerate("abc"))
    config = Config.model_validate({"model": {"path": str(qwen)}})
    seen: list[ReferenceMemory] = []
    ins.use_programs({"p": refs(a, b)}, [], ImageLimits(), fit=seen.append)
    ins.use_programs({"p": refs(a, b), "q": refs(c)}, [], ImageLimits(), fit=seen.append)
    first, second = seen
    assert second.images == 3 and second.new == second.total - first.total > 0
    # The device has room for the new picture but not for all three again: the reload takes it.
    monkeypatch.setattr(memory_fit, "host_memory", lambda: HostMemory(second.new, 8 * GiB, "MemAvailable"))
    ins.use_programs({"p": refs(a, b)}, [], ImageLimits())
    ins.use_programs({"p": refs(a, b), "q": refs(c)}, [], ImageLimits(), fit=references_check(ins.bundle, config))
    # One byte less: refused, the running programs stay.
    monkeypatch.setattr(memory_fit, "host_memory", lambda: HostMemory(second.new - 1, 8 * GiB, "MemAvailable"))
    running = ins._programs
    d = picture(tmp_path / "d.png", 9)
    with pytest.raises(ConfigError, match=r"^the inspection programs' references do not fit this device's memory: "
                                          r".* more must be free in RAM but .* of them are held already"):
        ins.use_programs({"p": refs(a, b), "q": refs(d)}, [], ImageLimits(),
                         fit=references_check(ins.bundle, config))
    assert ins._programs is running


def test_config_validate_refuses_references_the_devices_ram_cannot_hold(qwen: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """`config validate` may run beside a daemon holding its model: it checks the device's RAM, not what
    is free."""
    a = picture(tmp_path / "a.png", 1)
    config = Config.model_validate({
        "model": {"path": str(qwen)}, "programs": {"housing": refs(a, a).model_dump()},
        "cameras": [{"name": "belt", "source": "x.png", "program": "housing"}]})
    need = need_of(load_bundle(qwen), config, gpu_offload=False)
    model = need.host_resident(False) + need.weights
    monkeypatch.setattr(memory_fit, "unified_memory", lambda: False)
    monkeypatch.setattr(memory_fit, "host_memory", lambda: HostMemory(0, model + 1024, "MemAvailable"))
    with pytest.raises(ConfigError) as refused:
        check_programs_offline(load_bundle(qwen), config)
    line = str(refused.value)
    assert "\n" not in line and "of RAM is needed but the device has" in line, line
    assert "(1 distinct image, 9 image tokens at 288 B a token as held, rows of 64 float32): " \
           "programs.housing 2.5 KiB." in line, line  # its one picture, named twice, once
    monkeypatch.setattr(memory_fit, "host_memory", lambda: HostMemory(0, model + 10 * 2**20, "MemAvailable"))
    check_programs_offline(load_bundle(qwen), config)  # nothing free now (a daemon runs) is not a refusal


@pytest.mark.parametrize("cache_mb", [0, 1])  # off; on, with enough other references between to evict it
def test_the_same_picture_is_encoded_and_held_once_across_programs(qwen: Path, tmp_path: Path, cache_mb: int
                                                                   ) -> None:
    """One file in two programs, a byte copy of it under another name, twice in one program: one encode,
    one array. Another token budget is another encoding. A reload with the same references encodes
    nothing, whatever the encoder cache kept."""
    a = picture(tmp_path / "a.png", 1, (320, 240))
    copy = tmp_path / "copy" / "a.png"
    copy.parent.mkdir()
    shutil.copy(a, copy)
    b = picture(tmp_path / "b.png", 2)
    small = ProgramConfig.model_validate({"references": [{"image": str(a), "caption": "x"}],
                                          "image_tokens": {"max": 16}})
    # 40 other pictures of 29 KiB held each: more than a 1 MiB cache keeps
    fillers = {f"f{i}": refs(picture(tmp_path / f"f{i}.png", 100 + i, (320, 240)))
               for i in range(40 if cache_mb else 0)}
    programs = {"p": refs(a, b), **fillers, "q": refs(copy), "r": refs(a, a), "s": small}
    distinct = 3 + len(fillers)  # a, b, the fillers, and a under image_tokens.max 16
    ins = inspector(qwen, cache_mb)
    try:
        ins.use_programs(programs, [], ImageLimits())
        assert encodes(ins) == distinct  # it was 6 with the cache off; 44 with the fillers evicting a
        p = ins._programs[0]
        shared = p["p"].references[0].encoded
        assert all(r.encoded.embeds is shared.embeds for r in (*p["q"].references, *p["r"].references))
        assert p["s"].references[0].encoded.embeds is not shared.embeds
        assert len(p["s"].references[0].encoded.embeds) < len(shared.embeds)
        ins.use_programs(programs, [], ImageLimits())
        assert encodes(ins) == distinct
        assert ins._programs[0]["q"].references[0].encoded.embeds is shared.embeds
    finally:
        ins.close()


def test_a_one_chunk_encoding_holds_its_embeddings_once(qwen_ins: Inspector, tmp_path: Path) -> None:
    """A reference (any libmtmd encoding) of one image chunk keeps the chunk's array as its `embeds`, not
    a stacked copy: 64 float32 and 32 B of M-RoPE positions a token on the tiny Qwen2.5-VL, where it was
    twice the embeddings (544 B a token); the encoder cache counts the array once."""
    ins = qwen_ins
    ins.use_programs({"p": refs(picture(tmp_path / "a.png", 1, (320, 240)))}, [], ImageLimits())
    enc = ins._programs[0]["p"].references[0].encoded
    assert isinstance(enc, MediaEncoded)
    [chunk] = [p for p in enc.parts if isinstance(p, MediaEmbeds)]
    assert enc.embeds is chunk.embeds
    assert array_bytes([enc]) == len(enc.embeds) * (64 * 4 + 2 * 4 * 4) == 54 * 288
    text = sum(len(p) for p in enc.parts if isinstance(p, list))
    assert encoded_bytes(enc) == array_bytes([enc]) + 256 + 8 * text
