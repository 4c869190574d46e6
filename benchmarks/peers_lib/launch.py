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

from edge_runtime.inference.llm.runtime import disable_extra_buffer_types

disable_extra_buffer_types()

if __name__ == "__main__":
    from edge_runtime.cli.main import main

    sys.exit(main())
