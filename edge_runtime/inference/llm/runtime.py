"""The llama.cpp library as a whole, not one of its handles (handles.py): where its log goes, its extra
CPU buffer types, what its build offloads and was compiled for. With handles.py and mtmd.py the only
module that calls llama.cpp.
"""

from __future__ import annotations

from edge_runtime.inference.engines import llama_cpp  # isort: skip - onnxruntime, then llama_cpp (see engines.py)

import ctypes
from collections.abc import Callable
from typing import Any

_log_hook: list[Any] = []  # the ctypes callback llama.cpp holds: alive as long as it may be called


def log_to(sink: Callable[[bytes], None]) -> None:
    """Hand every later llama.cpp and ggml log line (debug lines included) to `sink`, instead of
    llama-cpp-python's logger: for benchmarks that count what llama.cpp says (benchmarks/step_graphs.py)."""
    @llama_cpp.llama_log_callback
    def hook(_level: int, text: bytes, _user: Any) -> None:
        sink(text)

    _log_hook[:] = [hook]
    llama_cpp.llama_log_set(hook, ctypes.c_void_p(0))


def disable_extra_buffer_types() -> None:
    """Load every later model without llama.cpp's extra CPU buffer types (AMX, x86 weight repacking),
    as llama-server's `--no-repack` does: for like-for-like runs beside it (benchmarks/peers_lib/launch.py)."""
    raw = llama_cpp.llama_cpp
    default = raw.llama_model_default_params

    def no_extra_buffers() -> Any:
        params = default()
        params.use_extra_bufts = False
        return params
    raw.llama_model_default_params = no_extra_buffers  # llama-cpp-python's Llama looks it up there
    llama_cpp.llama_model_default_params = no_extra_buffers  # handles.Model looks it up here


def engine_info() -> dict[str, object]:
    """The llama.cpp build: the binding's version and whether it offloads to a GPU."""
    return {"llama_cpp_python": llama_cpp.__version__, "gpu_offload": bool(llama_cpp.llama_supports_gpu_offload())}


def system_info() -> str:
    """llama.cpp's own line about its build: per backend, e.g. `CPU : NEON = 1 | DOTPROD = 1 | ...`, the
    instruction sets its CPU backend was compiled to use (ggml's `ggml_cpu_has_*`, compile-time answers)."""
    return bytes(llama_cpp.llama_print_system_info()).decode(errors="replace")
