"""A draft model for speculative decoding cut from a GGUF: its first N layers, the same embeddings,
vocabulary and output head. On random weights it is the only draft that agrees with its model often
enough to measure speculation (an independent random model agrees about never); on real weights a
smaller model of the same family (Qwen2.5-0.5B for Qwen2.5-VL-3B) is the usual draft.

    python -m edge_runtime_models.draft SRC.gguf DST.gguf --layers 2
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf


def write_layer_draft(src: Path, dst: Path, layers: int) -> int:
    """Write `src` cut to its first `layers` blocks to `dst`; returns the layers `src` had."""
    reader = gguf.GGUFReader(str(src))
    arch_field = reader.fields[gguf.Keys.General.ARCHITECTURE]
    arch = str(arch_field.contents())
    count_key = gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)
    total = int(reader.fields[count_key].contents())
    if not 1 <= layers <= total:
        raise ValueError(f"--layers must be 1..{total} for {src}")
    writer = gguf.GGUFWriter(str(dst), arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = layers if field.name == count_key else field.contents()
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    kept = [t for t in reader.tensors if _block(t.name) < layers]
    for t in kept:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in kept:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    return total


def _block(name: str) -> int:
    """The block a tensor belongs to (blk.N....), or -1 for the embeddings, head and norms."""
    parts = name.split(".")
    return int(parts[1]) if parts[0] == "blk" and len(parts) > 1 and parts[1].isdigit() else -1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()
    total = write_layer_draft(args.src, args.dst, args.layers)
    print(f"{args.dst}: {args.layers} of {total} layers")


if __name__ == "__main__":
    main()
