"""Issue 15 item 3: an inspector (or language model) whose construction fails frees every native
resource it had built (llama.cpp model, contexts and batches, the ONNX Runtime session), and
`close()` may be called twice."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
from collections.abc import Callable

import pytest

from edge_runtime.config import Config
from edge_runtime.core.bundle.manifest import Bundle
from edge_runtime.inference import inspector as inspector_module
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm import model as model_module
from edge_runtime.inference.llm.model import LanguageModel

_BUILDS = 50
_SETTLE = 10  # builds before the baseline: allocator pools and caches reach their steady size
# One leaked demo inspector holds ~8 MB (measured: RSS +8.2 MB per inspector never closed); what is
# allowed to grow over 40 failed builds is well under one leaked inspector's worth.
_ALLOWED_GROWTH_MB = 4.0


def _rss_mb() -> float:
    """Resident memory once garbage is gone: a failed build's traceback keeps its frames in reference
    cycles until the collector runs, and glibc keeps freed pages until trimmed. Without both, CI saw
    5.7 MB of "growth" over 40 builds that were not leaking (a real leak here is ~5 MB per build)."""
    gc.collect()
    libc_name = ctypes.util.find_library("c")
    if libc_name and hasattr(libc := ctypes.CDLL(libc_name), "malloc_trim"):
        libc.malloc_trim(0)
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _growth_over_failed_builds(build: Callable[[], object]) -> float:
    baseline = 0.0
    for i in range(_BUILDS):
        with pytest.raises(RuntimeError, match="injected"):
            build()
        if i == _SETTLE - 1:
            baseline = _rss_mb()
    return _rss_mb() - baseline


def _fail(*_: object, **__: object) -> None:
    raise RuntimeError("injected failure")


def test_inspector_failing_at_warm_up_50_times_keeps_native_memory_flat(
        demo_bundle: Bundle, config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    real_warm_up = Inspector.warm_up

    def warm_up_then_fail(self: Inspector) -> None:
        real_warm_up(self)  # everything is built and has run once: the most there is to leak
        _fail()

    monkeypatch.setattr(Inspector, "warm_up", warm_up_then_fail)
    settings = config.model.model_copy(update={"warmup": True})
    growth = _growth_over_failed_builds(lambda: Inspector(demo_bundle, settings, "test"))
    assert growth < _ALLOWED_GROWTH_MB, f"RSS grew {growth:.1f} MB over {_BUILDS - _SETTLE} failed builds"


def test_inspector_failing_at_the_grammar_step_50_times_keeps_native_memory_flat(
        demo_bundle: Bundle, config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inspector_module, "schema_to_grammar", _fail)
    growth = _growth_over_failed_builds(lambda: Inspector(demo_bundle, config.model, "test"))
    assert growth < _ALLOWED_GROWTH_MB, f"RSS grew {growth:.1f} MB over {_BUILDS - _SETTLE} failed builds"


def test_language_model_failing_after_its_context_50_times_keeps_native_memory_flat(
        demo_bundle: Bundle, config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    # The last native step of the constructor (the parallel-sequence owner) fails: the model, its
    # context and both batches were built before it.
    monkeypatch.setattr(model_module, "ParallelSequences", _fail)
    s = config.model
    growth = _growth_over_failed_builds(lambda: LanguageModel(demo_bundle.language_path, s.context_size, s.threads,
                                                              s.gpu_layers, s.batch_size))
    assert growth < _ALLOWED_GROWTH_MB, f"RSS grew {growth:.1f} MB over {_BUILDS - _SETTLE} failed builds"


def test_failed_inspector_build_frees_its_language_model(demo_bundle: Bundle, config: Config,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[LanguageModel] = []
    real_init = LanguageModel.__init__

    def recording_init(self: LanguageModel, *args: object, **kwargs: object) -> None:
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]
        built.append(self)

    monkeypatch.setattr(LanguageModel, "__init__", recording_init)
    monkeypatch.setattr(inspector_module, "schema_to_grammar", _fail)
    with pytest.raises(RuntimeError, match="injected"):
        Inspector(demo_bundle, config.model, "test")
    assert len(built) == 1 and built[0].closed


def test_closing_an_inspector_twice_is_harmless(demo_bundle: Bundle, config: Config) -> None:
    settings = config.model.model_copy(update={"warmup": False})
    with Inspector(demo_bundle, settings, "test") as ins:
        ins.close()
        assert ins.language.closed and ins.vision is not None and ins.vision.session is None
    ins.close()  # the with block closed it a second time; a third call is as harmless
    assert ins.language.closed


def test_closing_a_language_model_twice_is_harmless(demo_bundle: Bundle, config: Config) -> None:
    s = config.model
    with LanguageModel(demo_bundle.language_path, s.context_size, s.threads, s.gpu_layers, s.batch_size) as lm:
        assert lm.tokenize("hello")
    lm.close()
    assert lm.closed
    with pytest.raises(RuntimeError, match="closed"):
        lm.tokenize("hello")


def test_every_handle_wrapper_closes_once_and_refuses_use_after(demo_bundle: Bundle) -> None:
    from edge_runtime.inference.llm.handles import Batch, Model, Sampler

    with Model(str(demo_bundle.language_path), vocab_only=True) as model:
        vocab = model.vocab
        chain = Sampler.chain()
        grammar = Sampler.grammar(vocab, 'root ::= "yes" | "no"')
        chain.add(grammar)  # the chain owns it now: closing both must free it once
        for handle in (chain, grammar, Batch(8), Batch(8, 16)):
            handle.close()
            handle.close()
            assert handle.closed
            with pytest.raises(RuntimeError, match="closed"):
                _ = handle.ptr
    model.close()
    assert model.closed
