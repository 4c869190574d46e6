"""`edge-runtime` with llama.cpp's extra CPU buffer types off: the same as llama-server's `--no-repack`.

Why: on CPUs with AMX (the 2-core Xeon of these machines reports amx_int8), the llama.cpp that
llama-cpp-python 0.3.36 vendors, built with -march=native, segfaults in `ggml_backend_amx_mul_mat` on
the first decode of Gemma 3 270M Q4_K_M, in llama-server and in llama-cpp-python alike. The extra
buffer types (AMX and the x86 weight repacking) are chosen in `llama_model_default_params()`, which
the daemon calls; this launcher turns them off there and then runs the ordinary CLI.

    PYTHONPATH=benchmarks python -m peers_lib.launch --config FILE run
"""

from __future__ import annotations

import sys
from typing import Any

from edge_runtime.inference import engines  # noqa: F401  # isort: skip - onnxruntime, then llama_cpp

import llama_cpp
import llama_cpp.llama_cpp as raw

_default_params = raw.llama_model_default_params


def _no_extra_buffers() -> Any:
    params = _default_params()
    params.use_extra_bufts = False
    return params


raw.llama_model_default_params = _no_extra_buffers  # llama_cpp.Llama looks it up here
llama_cpp.llama_model_default_params = _no_extra_buffers  # our handles look it up here

if __name__ == "__main__":
    from edge_runtime.cli.main import main

    sys.exit(main())
