"""Names of the buildable bench bundles, importable without numpy (the CLI reads it at start-up,
and numpy must not load before llama_cpp's CUDA build: FACTS.md)."""

BENCH_BUNDLE_NAMES = ("siglip224-qwen0.5b", "siglip224-qwen1.5b", "siglip224-qwen3b", "siglip384-qwen0.5b",
                      "siglip224-gemma270m")
