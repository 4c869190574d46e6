"""Loads the two native engines in the one order that works in a single process.

On the CUDA build of llama.cpp (seen on the H200 machine, Nov 2026), importing `llama_cpp` before
`onnxruntime` made the process segfault later — in the CUDA model load, or in ONNX Runtime's session
creation, whichever came second. Importing onnxruntime first, then llama_cpp, works in both orders of
use. Every module that needs llama_cpp (or its pure-Python grammar converter, whose import loads the
binding) imports it from here by name, so no module imports this one only for its side effect.
"""

import onnxruntime  # isort: skip - must precede llama_cpp
import llama_cpp  # isort: skip
from llama_cpp import llama_grammar  # isort: skip

__all__ = ["llama_cpp", "llama_grammar", "onnxruntime"]
