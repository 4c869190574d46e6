"""Shared fixtures: the real demo bundle and a real inspector (ONNX Runtime + llama.cpp)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from edge_runtime_models.demo import build_demo_bundle

import edge_runtime.inference.engines  # noqa: F401 - onnxruntime, then llama_cpp (see engines.py)
from edge_runtime.config import Config
from edge_runtime.core.bundle.manifest import Bundle, load_bundle
from edge_runtime.inference.inspector import Inspector
from tests.support.leftovers import LeftoverThreads, RootLogging
from tests.support.tiny_pairs import TinyPair, tiny_pair

# ---- what a test leaves behind (tests/support/leftovers.py) ----------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    """Threads a test module leaves running: listed at the end of the run; a non-daemon one of
    edge_runtime's own fails the module (an error at its last test's teardown)."""
    config.pluginmanager.register(LeftoverThreads(), "leftover-threads")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    """Around each test: the root logger's handlers and level are put back (the CLI's setup_logging
    replaces them with one on the test's capture stream, closed once the test ends)."""
    logging_before = RootLogging()
    yield
    logging_before.restore()


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_bundle(tmp_path_factory.mktemp("bundle") / "demo")


@pytest.fixture(scope="session")
def demo_bundle(demo_dir: Path) -> Bundle:
    return load_bundle(demo_dir)


@pytest.fixture
def bundle_copy(demo_dir: Path, tmp_path: Path) -> Path:
    """A private copy a test may damage."""
    return Path(shutil.copytree(demo_dir, tmp_path / "bundle"))


@pytest.fixture(scope="session")
def config() -> Config:
    cfg = Config(device_id="test-device")
    cfg.model.threads = 2
    return cfg


@pytest.fixture(scope="session")
def inspector(demo_bundle: Bundle, config: Config) -> Iterator[Inspector]:
    ins = Inspector(demo_bundle, config.model, config.device_id)
    yield ins
    ins.close()


@pytest.fixture(scope="session")
def gbnf_inspector(demo_bundle: Bundle, config: Config) -> Iterator[Inspector]:
    """The same inspector on llama.cpp's GBNF grammar sampler (model.constraint_engine: gbnf)."""
    settings = config.model.model_copy(update={"constraint_engine": "gbnf", "warmup": False})
    ins = Inspector(demo_bundle, settings, config.device_id)
    yield ins
    ins.close()


@pytest.fixture(scope="session")
def tiny_pairs() -> Callable[[str], TinyPair]:
    """`tiny_pairs(family)`: a random-weight LM GGUF + mmproj GGUF pair of one family ("qwen2.5-vl",
    "gemma3", "smolvlm", "qwen3-vl", "lfm2-vl", "internvl", "kimi-vl", "minicpm-v"),
    converted by llama.cpp's converter at first use and cached (tests/support/tiny_pairs.py)."""
    return tiny_pair


@pytest.fixture
def client(daemon: Any) -> Any:
    """A Flask test client of the module's running `daemon` fixture (modules that test the API)."""
    assert daemon.api is not None
    return daemon.api.app.test_client()
