"""Model bundles (docs/bundles.md), in a folder of their own: every layer that loads or checks a model
reads them, so they stay in core (which imports no sibling). `manifest.py` both bundle formats and
`bundle.yaml`; `pair.py` checks a GGUF + mmproj pair; `verify.py` the step-by-step `models verify`;
`gguf_header.py` walks an untrusted GGUF header within bounds; `mmproj.py` decides whether an mmproj
fits a language model."""
