#!/usr/bin/env bash
# What the lent GPU machine (Python 3.12, torch, transformers, numpy, OpenCV; no network) lacks for
# gpu_pair.sh and gpu_peers.sh, gathered into .device/ (git-ignored, carried with `run --carry .device`,
# about 30 MB of the 64 MiB a call takes):
#   whl/                       the daemon's pure and manylinux wheels for CPython 3.12 that the image lacks
#   llama_cpp_python-*.tar.gz  the llama-cpp-python sdist less what no build reads (peers_lib/build.py trim)
#   peers-sdist.tar.gz         the same file: the llama-server build reads it (gpu_peers.sh)
#   convert/                   convert_hf_to_gguf.py, conversion/ and gguf-py/ of the llama.cpp it vendors
#   bash benchmarks/device_kit.sh      (needs PyPI; 1-2 minutes)
set -euo pipefail
KIT=${KIT:-.device}
PY=${PYTHON:-python3}
mkdir -p "$KIT/whl"
# The image has numpy, OpenCV, torch, transformers and onnxruntime (CPU); these it lacks.
WHEELS=(flask itsdangerous blinker waitress werkzeug jinja2 markupsafe click paho-mqtt
        "pydantic==2.14.4" "pydantic-core==2.50.5" annotated-types typing-inspection
        jsonschema jsonschema-specifications referencing rpds-py "llguidance==1.9.1" gguf platformdirs
        simplejpeg pillow-heif jetson-stats docker pymodbus cryptography cffi "protobuf>=7.35.1" diskcache pyyaml
        psutil prometheus-client regex tqdm nvidia-ml-py faiss-cpu threadpoolctl "semver>=3,<4")
"$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --no-deps -d "$KIT/whl" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_31_x86_64 --platform any "${WHEELS[@]}"
# The pin and the sdist as peers_lib/build.py knows them (pip's download, cached).
read -r VERSION SDIST < <("$PY" -c 'import sys; sys.path.insert(0, "benchmarks")
from peers_lib.build import LLAMA_CPP_PYTHON, find_sdist; print(LLAMA_CPP_PYTHON, find_sdist())')
"$PY" benchmarks/peers_lib/build.py trim "$KIT/peers-sdist.tar.gz" --sdist "$SDIST" > /dev/null
cp "$KIT/peers-sdist.tar.gz" "$KIT/llama_cpp_python-$VERSION.tar.gz"
rm -rf "$KIT/convert" && mkdir -p "$KIT/convert"
V=llama_cpp_python-$VERSION/vendor/llama.cpp
tar xzf "$SDIST" -C "$KIT/convert" --strip-components=3 "$V/convert_hf_to_gguf.py" "$V/conversion" "$V/gguf-py"
du -sh "$KIT" "$KIT"/*
