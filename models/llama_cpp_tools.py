"""llama.cpp's own GGUF converter and quantizer, used by `models export`.

The converter (`convert_hf_to_gguf.py` + its `conversion/` package + `gguf-py`) is taken at run time
from the released llama.cpp sources on the package index: the llama-cpp-python sdist of the installed
version vendors exactly the llama.cpp our runtime links, so the GGUF it writes is one our runtime
reads. Nothing of it is copied into this repository; it is unpacked into the user's cache once.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from platformdirs import user_cache_dir

# Members of the sdist the converter needs (prefix inside the archive's llama.cpp folder).
_NEEDED = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")

# llama.cpp quantization file types by the names its `llama-quantize` tool uses.
FTYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7, "Q5_0": 8, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18,
          "BF16": 32}


class ConverterError(RuntimeError):
    pass


def converter_dir(explicit: Path | None = None) -> Path:
    """A llama.cpp source folder holding convert_hf_to_gguf.py: given, from $EDGE_RUNTIME_LLAMA_CPP_SRC,
    cached, or unpacked from the llama-cpp-python sdist fetched from the package index."""
    for candidate in (explicit, os.environ.get("EDGE_RUNTIME_LLAMA_CPP_SRC")):
        if candidate:
            path = Path(candidate).expanduser()
            if not (path / "convert_hf_to_gguf.py").is_file():
                raise ConverterError(f"{path} has no convert_hf_to_gguf.py: point it at a llama.cpp source folder")
            return path
    version = importlib.metadata.version("llama-cpp-python")
    cached = Path(user_cache_dir("edge-runtime")) / f"llama.cpp-{version}"
    if (cached / "convert_hf_to_gguf.py").is_file():
        return cached
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
               "--dest", tmp, f"llama-cpp-python=={version}"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        archives = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if done.returncode != 0 or not archives:
            raise ConverterError(
                f"could not fetch the llama-cpp-python {version} sources from the package index "
                f"({(done.stderr or done.stdout).strip().splitlines()[-1:] or 'no archive'}); offline, pass "
                "--llama-cpp-src DIR or set EDGE_RUNTIME_LLAMA_CPP_SRC to a llama.cpp checkout")
        _unpack(archives[0], cached)
    return cached


def _unpack(archive: Path, target: Path) -> None:
    partial = target.with_name(target.name + ".partial")
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            parts = member.name.split("/", 3)  # llama_cpp_python-X/vendor/llama.cpp/<rest>
            if len(parts) == 4 and parts[1:3] == ["vendor", "llama.cpp"] and parts[3].startswith(_NEEDED):
                member.name = parts[3]
                members.append(member)
        tar.extractall(partial, members=members, filter="data")
    partial.rename(target)


def convert(hf_dir: Path, out_file: Path, outtype: str, source: Path) -> None:
    """Run llama.cpp's converter on a Hugging Face causal-LM folder."""
    cmd = [sys.executable, str(source / "convert_hf_to_gguf.py"), str(hf_dir), "--outfile", str(out_file),
           "--outtype", outtype]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not out_file.is_file():
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
        raise ConverterError(f"llama.cpp's convert_hf_to_gguf.py failed:\n{tail}")


def quantize(src: Path, dst: Path, quant: str, threads: int = 0) -> None:
    """llama.cpp's quantizer (llama_model_quantize) through llama-cpp-python."""
    from edge_runtime.inference.engines import llama_cpp

    if quant not in FTYPES:
        raise ConverterError(f"unknown quantization {quant!r}; choose one of {', '.join(FTYPES)}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[quant]
    params.nthread = threads
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params) != 0:
        raise ConverterError(f"llama.cpp could not quantize {src} to {quant}")
