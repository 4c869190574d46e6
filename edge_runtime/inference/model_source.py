"""Where the model comes from: `--model`, then `model.path`, then the demo bundle (built on first use).

One place for the daemon and the CLI. It lives apart from `core/bundle/` because building the demo
bundle needs the offline builders (`edge_runtime_models`), which themselves import `core/bundle/manifest.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from edge_runtime.config import Config
from edge_runtime.core.bundle.manifest import Bundle, demo_bundle_dir, load_bundle
from edge_runtime.core.errors import BundleError

if TYPE_CHECKING:
    from edge_runtime.inference.inspector import Inspector


def ensure_demo_bundle(data_dir: Path) -> Bundle:
    """Load the demo bundle from the data folder, building it first when missing or damaged."""
    path = demo_bundle_dir(data_dir)
    try:
        return load_bundle(path)
    except BundleError:
        from edge_runtime_models.demo import build_demo_bundle  # torch-free, but slow to import

        build_demo_bundle(path)
        return load_bundle(path)


def resolve_bundle(config: Config, model_dir: str | None) -> Bundle:
    """--model, then config model.path, then the demo bundle."""
    path = model_dir or config.model.path
    if path:
        return load_bundle(path, verify_checksums=config.model.verify_checksums)
    return ensure_demo_bundle(config.data_dir)


def open_inspector(config: Config, model_dir: str | None) -> Inspector:
    """The bundle, loaded into a ready Inspector (the engines load on first call).

    It loads on a thread of its own that ends with the load: the load computes (libmtmd's and the
    inspector's warm-ups), and on the daemon's main thread, which lives on, that left an OpenMP team
    beside the inspection worker's that made every decode 1.4x slower (inference/openmp.py)."""
    from edge_runtime.inference.inspector import Inspector
    from edge_runtime.inference.memory_fit import check_fit, references_check
    from edge_runtime.inference.openmp import on_passing_thread

    bundle = resolve_bundle(config, model_dir)
    if config.model.memory_check:  # before a byte is allocated: refused with the figures, not OOM-killed
        from edge_runtime.inference.llm.runtime import engine_info

        check_fit(bundle, config, gpu_offload=bool(engine_info()["gpu_offload"]))
    inspector = on_passing_thread(Inspector, bundle, config.model, config.device_id, name="model-load")
    try:  # the programs' references, counted (memory) then encoded once (a missing one: one ConfigError line)
        inspector.use_programs(config.programs, config.cameras, config.images, config.line_io.stations,
                               references_check(bundle, config))
    except BaseException:
        inspector.close()
        raise
    return inspector
