"""`model.flash_attention` reaches llama.cpp, in the main context and in the parallel sequences' context.

Fused attention computes the same softmax in another order (and, on the CPU, Q·K in f16), so its logits
differ from the unfused kernels' by rounding: a setting that did not reach llama.cpp would give the
same logits both ways. The parallel context copies the main context's choice, so a prompt's logits are
the same there as in the one-at-a-time context under either setting. Real llama.cpp on the demo bundle."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_runtime.config import Config, load_config
from edge_runtime.core.bundle.manifest import Bundle
from edge_runtime.inference.inspector import Inspector
from tests.support.images import synthetic_frames


def _logits(demo_bundle: Bundle, config: Config, flash: bool) -> tuple[np.ndarray, np.ndarray]:
    """The first token's logits of one inspection prompt: (main context, parallel context)."""
    settings = config.model.model_copy(update={"warmup": False, "flash_attention": flash})
    with Inspector(demo_bundle, settings, config.device_id) as ins:
        prefix, image, suffix = ins.sequence(ins.default_prompt, ins.encode(synthetic_frames(1, seed=5)[0]))
        main = ins.language.prompt_logits(prefix, image, suffix)
        parallel = ins.language.parallel.prompt_logits([(prefix, image, suffix)])[0]
    return main, parallel


@pytest.fixture(scope="module")
def logits(demo_bundle: Bundle, config: Config) -> dict[bool, tuple[np.ndarray, np.ndarray]]:
    return {flash: _logits(demo_bundle, config, flash) for flash in (True, False)}


def test_flash_attention_on_and_off_run_different_attention_kernels(
        logits: dict[bool, tuple[np.ndarray, np.ndarray]]) -> None:
    on, off = logits[True][0], logits[False][0]
    assert not np.array_equal(on, off)  # the setting reached llama.cpp
    # ... and it is the same model: rounding, not another answer
    assert np.abs(on - off).max() < 0.05 * max(1.0, float(np.abs(off).max()))
    assert int(on.argmax()) == int(off.argmax())


@pytest.mark.parametrize("flash", [True, False])
def test_the_parallel_context_attends_as_the_main_context_does(
        logits: dict[bool, tuple[np.ndarray, np.ndarray]], flash: bool) -> None:
    main, parallel = logits[flash]
    np.testing.assert_array_equal(parallel, main)


@pytest.mark.parametrize(("setting", "kv", "on"), [("auto", "f16", True), ("auto", "f32", False), (True, "f32", True),
                                                   (False, "f16", False)])
def test_auto_turns_fused_attention_on_except_for_a_float32_kv_cache(
        config: Config, setting: bool | str, kv: str, on: bool) -> None:
    assert config.model.model_copy(update={"flash_attention": setting, "kv_cache_type": kv}).flash_attention_on() is on


def test_yaml_on_and_off_read_as_forcing_it(tmp_path: Path) -> None:
    for text, value in (("on", True), ("off", False), ("auto", "auto")):
        (tmp_path / "c.yaml").write_text(f"model:\n  flash_attention: {text}\n")
        assert load_config(tmp_path / "c.yaml").model.flash_attention == value
