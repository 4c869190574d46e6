"""A bounded reader of GGUF headers (metadata and tensor table), run before llama.cpp sees a file.

llama.cpp aborts the whole process on some corrupt files, and the `gguf` package's `GGUFReader` loops
once per *declared* array element (a 49-byte file declaring 2^40 elements hangs it: docs/decisions.md),
so untrusted files are walked here with every count, length and offset checked against the file's
size and a limit before it is used. The value types, block sizes and magic come from the `gguf`
package. Every failure is a `BundleError` naming the file.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType

from edge_runtime.core.errors import BundleError

MAX_KV = 1 << 16            # metadata keys (real models: ~40)
MAX_TENSORS = 1 << 20       # tensors (a 671B MoE has ~1,100 after expert merging)
MAX_ARRAY = 1 << 24         # elements of one array (vocabularies: ~262k)
MAX_STRING = 16 << 20       # bytes of one string value (chat templates: a few kB)
MAX_KEY = 1 << 10           # bytes of a key
MAX_NAME = 64               # llama.cpp's GGML_MAX_NAME
MAX_DIMS = 4                # llama.cpp's GGML_MAX_DIMS
KEEP_ARRAY = 4096           # arrays up to this length keep their values; longer ones only their length

_SCALARS: dict[int, str] = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: str
    shape: tuple[int, ...]   # ggml order: shape[0] is ne[0], the contiguous dimension
    offset: int              # absolute byte offset of its data in the file
    nbytes: int


@dataclass(frozen=True)
class ArrayInfo:
    """A metadata array too long to keep: its element type and length."""

    type: str
    length: int


@dataclass
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str, kind: type | tuple[type, ...]) -> Any:
        value = self.metadata.get(key)
        if value is None:
            raise BundleError(f"{self.path} has no {key} key in its GGUF header")
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
            raise BundleError(f"{self.path}: GGUF key {key} has the wrong type ({type(value).__name__})")
        return value

    @property
    def architecture(self) -> str:
        return str(self.require("general.architecture", str))


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes, path: Path, keep: frozenset[str] = frozenset()) -> None:
        self.buf, self.path, self.pos, self.size, self.keep = buf, path, 0, len(buf), keep

    def fail(self, what: str) -> BundleError:
        return BundleError(f"{self.path} is not a readable GGUF file: {what} (at byte {self.pos})")

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"truncated while reading {what}")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return bytes(out)

    def unpack(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def count(self, limit: int, min_item: int, what: str) -> int:
        n = int(self.unpack("<Q", what))
        if n > limit:
            raise self.fail(f"{what} {n} is over the limit of {limit}")
        if n * min_item > self.size - self.pos:
            raise self.fail(f"truncated: {what} {n} needs more than the {self.size - self.pos} bytes left")
        return n

    def string(self, limit: int, what: str) -> str:
        n = self.count(limit, 1, f"length of {what}")
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None


def _type_name(raw: int, cur: _Cursor, what: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise cur.fail(f"unknown value type {raw} for {what}") from None


def _value(cur: _Cursor, vtype: GGUFValueType, key: str) -> Any:
    if vtype == GGUFValueType.STRING:
        return cur.string(MAX_STRING, f"the value of {key}")
    if vtype != GGUFValueType.ARRAY:
        return cur.unpack(_SCALARS[vtype], f"the value of {key}")
    itype = _type_name(cur.unpack("<I", f"the element type of {key}"), cur, key)
    if itype == GGUFValueType.ARRAY:
        raise cur.fail(f"{key} is an array of arrays (llama.cpp reads none)")
    min_item = 8 if itype == GGUFValueType.STRING else struct.calcsize(_SCALARS[itype])
    n = cur.count(MAX_ARRAY, min_item, f"the length of {key}")
    if itype != GGUFValueType.STRING:
        raw = cur.take(n * min_item, f"the elements of {key}")
        if n > KEEP_ARRAY:
            return ArrayInfo(itype.name, n)
        return list(struct.unpack(f"<{n}{_SCALARS[itype][1]}", raw))
    keep = n <= KEEP_ARRAY or key in cur.keep
    items = _strings(cur, n, key, keep)  # a vocabulary: 150k-260k strings, so one tight loop
    return items if keep else ArrayInfo(itype.name, n)


_U64 = struct.Struct("<Q").unpack_from


def _strings(cur: _Cursor, n: int, key: str, keep: bool) -> list[str]:
    """n length-prefixed strings, each bounded by the file and MAX_STRING; decoded only when kept."""
    buf, pos, size, out = cur.buf, cur.pos, cur.size, []
    for _ in range(n):
        if pos + 8 > size:
            cur.pos = pos
            raise cur.fail(f"truncated while reading an element of {key}")
        (length,) = _U64(buf, pos)
        if length > MAX_STRING or pos + 8 + length > size:
            cur.pos = pos
            raise cur.fail(f"an element of {key} is {length} bytes long: over the limit or past the end")
        if keep:
            try:
                out.append(bytes(buf[pos + 8:pos + 8 + length]).decode("utf-8"))
            except UnicodeDecodeError:
                cur.pos = pos
                raise cur.fail(f"an element of {key} is not UTF-8") from None
        pos += 8 + length
    cur.pos = pos
    return out


def read_header(path: Path | str, keep: frozenset[str] = frozenset()) -> GGUFHeader:
    """Walk a GGUF file's header and tensor table; raise BundleError with one sentence on anything wrong.
    Arrays longer than KEEP_ARRAY keep only their length, unless their key is in `keep`."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            size = path.stat().st_size
            if size < 24:
                raise BundleError(f"{path} is not a readable GGUF file: {size} bytes is too short for a GGUF header")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _walk(_Cursor(buf, path, keep))
    except OSError as exc:
        raise BundleError(f"{path} cannot be read: {exc.strerror or exc}") from None


def _walk(cur: _Cursor) -> GGUFHeader:
    magic = cur.take(4, "the magic")
    if magic != b"GGUF":
        raise BundleError(f"{cur.path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    version = cur.unpack("<I", "the version")
    if version not in (2, 3):
        raise BundleError(f"{cur.path} is GGUF version {version}; llama.cpp reads versions 2 and 3")
    n_tensors = cur.count(MAX_TENSORS, 32, "tensor count")
    n_kv = cur.count(MAX_KV, 13, "metadata key count")
    header = GGUFHeader(cur.path, version)
    for _ in range(n_kv):
        key = cur.string(MAX_KEY, "a metadata key")
        vtype = _type_name(cur.unpack("<I", f"the type of {key}"), cur, key)
        if key in header.metadata:
            raise cur.fail(f"the key {key} appears twice")
        header.metadata[key] = _value(cur, vtype, key)
    alignment = header.metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise cur.fail(f"general.alignment {alignment!r} is not a power of two")
    table = [_tensor_entry(cur) for _ in range(n_tensors)]
    data_start = -(-cur.pos // alignment) * alignment
    for name, shape, qtype, rel in table:
        if name in header.tensors:
            raise cur.fail(f"the tensor {name} appears twice")
        block, type_size = GGML_QUANT_SIZES[qtype]
        elements = 1
        for d in shape:
            elements *= d
        if shape[0] % block:
            raise cur.fail(f"tensor {name}: row length {shape[0]} is not a multiple of {qtype.name}'s block {block}")
        nbytes = elements // block * type_size
        start = data_start + rel
        if rel % alignment or start + nbytes > cur.size:
            raise BundleError(f"{cur.path} is truncated or corrupt: tensor {name} ({nbytes} bytes at offset "
                              f"{start}) lies outside the file's {cur.size} bytes")
        header.tensors[name] = TensorInfo(name, qtype.name, shape, start, nbytes)
    return header


def _tensor_entry(cur: _Cursor) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
    name = cur.string(MAX_NAME - 1, "a tensor name")
    n_dims = cur.unpack("<I", f"the dimension count of {name}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cur.fail(f"tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
    shape = tuple(int(cur.unpack("<Q", f"a dimension of {name}")) for _ in range(n_dims))
    elements = 1
    for d in shape:
        elements *= d
    if elements > cur.size * 8 or 0 in shape:  # no ggml type packs more than ~5 elements into a byte
        raise cur.fail(f"tensor {name} has an absurd shape {list(shape)}")
    raw_type = cur.unpack("<I", f"the type of {name}")
    try:
        qtype = GGMLQuantizationType(raw_type)
    except ValueError:
        raise cur.fail(f"tensor {name} has an unknown type {raw_type}") from None
    if qtype not in GGML_QUANT_SIZES:
        raise cur.fail(f"tensor {name} has a type {qtype.name} without a known size")
    return name, shape, qtype, int(cur.unpack("<Q", f"the data offset of {name}"))
