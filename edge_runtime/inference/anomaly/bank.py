"""The bank file: the good parts' patch vectors, what made them, and the sha256 of it all.

Layout: 8 bytes `EDGEGATE`, a little-endian u32 format version, a u32 header length, the header
(UTF-8 JSON, at most 1 MiB), then `patches x dim` float32 values. The header names the encoder file
and its sha256, the image budget, the crop, the frame size and patch grid, the fit and the threshold.
`vectors.sha256` covers the header (with that field empty) and every value: one changed byte and the
file is refused as corrupt. It proves integrity, not origin (anyone can recompute it).

A bank for an inspection program's regions is one such section per region, one after the other in
one file: each header names its region (`part`: name, box, index, count), holds its own threshold
and sha256, and the sections must run 0..count-1 to the file's end (docs/decisions.md, issue 42).

Reading is bounded before it costs: the header's size, then the declared size of the vectors against
the file's length and the caller's memory bound, then the encoder, budget, crop and region against
what the caller runs; only then are the values read, in chunks, hashed and handed to the index.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edge_runtime.core import strict_json
from edge_runtime.core.errors import EdgeRuntimeError
from edge_runtime.core.files import NotRegularFile, open_regular
from edge_runtime.inference.anomaly.features import GateContext
from edge_runtime.inference.anomaly.search import PatchIndex, index_bytes

MAGIC = b"EDGEGATE"
FORMAT = 1
MAX_HEADER = 1 << 20
_PREFIX = struct.Struct("<8sII")
_CHUNK_ROWS_BYTES = 4 << 20
_SHA = r"^[0-9a-f]{64}$"
MAX_PARTS = 64  # sections of one file: a program has at most 32 regions and tiles (config/programs.py)


class BankError(EdgeRuntimeError):
    """A bank file cannot be used: the message is one line naming the file and why."""


class BankCorrupt(BankError):
    """Not a bank, truncated, or its sha256 does not match its contents."""


class BankTooLarge(BankError):
    """The bank would take more memory than the configured bound."""


class BankMismatch(BankError):
    """The bank was made with another encoder, image budget or crop than the frames it would score."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BankEncoder(_Strict):
    kind: Literal["onnx", "mmproj"]
    file: str = Field(max_length=500)
    sha256: str = Field(pattern=_SHA)
    bundle: str = Field("", max_length=500)


class BankVectors(_Strict):
    patches: int = Field(ge=1, le=1 << 31)
    dim: int = Field(ge=3, le=1 << 16)
    dtype: Literal["float32"] = "float32"
    sha256: str = Field("", pattern=r"^([0-9a-f]{64})?$")


class BankLayout(_Strict):
    width: int = Field(ge=1, le=1 << 16, description="Frame width the bank was fitted on.")
    height: int = Field(ge=1, le=1 << 16, description="Frame height the bank was fitted on.")
    grid: list[tuple[int, int]] = Field(min_length=1, max_length=4096, description="(rows, cols) per block.")
    embed_dim: int = Field(ge=1, le=1 << 16, description="Width of the encoder's embeddings.")
    position_weight: float = Field(ge=0, description="Distance one patch of displacement costs (0: none).")


class BankThreshold(_Strict):
    value: float | None = Field(None, ge=0, description="Scores under this are gated as OK; None: not chosen.")
    method: str = Field("none", max_length=100)
    target_escape: float | None = Field(None, ge=0, le=1)
    supported: bool = Field(False, description="The labelled data supports the escape claim.")
    note: str = Field("", max_length=2000)


class BankPart(_Strict):
    """The region of an inspection program a section of the bank was fitted on."""

    name: str = Field(min_length=1, max_length=200)
    box: tuple[int, int, int, int] = Field(description="[x, y, w, h] in the camera's (cropped) frame.")
    frame: tuple[int, int] = Field(description="(width, height) of the frames it was cut from (tiles follow it).")
    index: int = Field(ge=0, lt=MAX_PARTS)
    count: int = Field(ge=1, le=MAX_PARTS)


class BankHeader(_Strict):
    format: Literal[1] = 1
    created: str = Field(max_length=64)
    encoder: BankEncoder
    budget: dict[str, Any]
    region: tuple[int, int, int, int] | None = None
    layout: BankLayout
    vectors: BankVectors
    fit: dict[str, Any] = Field(default_factory=dict)
    threshold: BankThreshold = Field(default_factory=BankThreshold)
    part: BankPart | None = None  # a program's region; None: whole frames (and the only section)


def _digest(header: BankHeader) -> hashlib._Hash:
    blank = header.model_copy(update={"vectors": header.vectors.model_copy(update={"sha256": ""})})
    h = hashlib.sha256(b"edge-runtime gate bank 1\n")
    # A whole-frame header hashes as before `part` existed: banks fitted then still load.
    dumped = blank.model_dump(mode="json", exclude={"part"} if header.part is None else None)
    h.update(json.dumps(dumped, sort_keys=True, separators=(",", ":")).encode())
    return h


def _dumped(header: BankHeader) -> bytes:
    return json.dumps(header.model_dump(mode="json", exclude={"part"} if header.part is None else None),
                      sort_keys=True, separators=(",", ":")).encode()


def write_bank(path: Path, header: BankHeader, vectors: np.ndarray) -> BankHeader:
    """Write the bank atomically (a temporary file renamed over `path`); returns the header with its sha256."""
    return write_banks(path, [(header, vectors)])[0]


def write_banks(path: Path, sections: Sequence[tuple[BankHeader, np.ndarray]]) -> list[BankHeader]:
    """Write one section per (header, vectors) into one file, atomically: a whole-frame bank is one
    section without `part`; a program's regions one section each, `part.index` 0..count-1."""
    out: list[tuple[BankHeader, bytes, np.ndarray]] = []
    for header, vectors in sections:
        data = np.ascontiguousarray(vectors, dtype="<f4")
        if data.ndim != 2 or data.shape != (header.vectors.patches, header.vectors.dim):
            raise ValueError(f"vectors {data.shape} do not match the header's "
                             f"{header.vectors.patches}x{header.vectors.dim}")
        h = _digest(header)
        h.update(data.data)
        header = header.model_copy(update={"vectors": header.vectors.model_copy(update={"sha256": h.hexdigest()})})
        raw = _dumped(header)
        if len(raw) > MAX_HEADER:
            raise ValueError("the bank's header is over 1 MiB")
        out.append((header, raw, data))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for _, raw, data in out:
                f.write(_PREFIX.pack(MAGIC, FORMAT, len(raw)))
                f.write(raw)
                f.write(data.data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return [h for h, _, _ in out]


def read_header(path: Path) -> BankHeader:
    """The (first section's) header, values not read; BankCorrupt when the file is not a bank of its declared size."""
    return read_headers(path)[0]


def read_headers(path: Path) -> list[BankHeader]:
    """Every section's header (one for a whole-frame bank, one per region of a program's)."""
    with _open(path) as f:
        return [h for h, _ in _sections(f, path, os.fstat(f.fileno()).st_size)]


def _open(path: Path) -> BinaryIO:
    try:
        return open_regular(path)  # a FIFO would block the read forever
    except NotRegularFile as exc:
        raise BankError(f"gate bank {path}: {exc}") from None
    except FileNotFoundError:
        raise BankError(f"gate bank {path}: no such file") from None
    except OSError as exc:
        raise BankError(f"gate bank {path}: cannot be read ({exc.strerror or exc})") from None


def _header(f: BinaryIO, path: Path, size: int, at: int = 0) -> tuple[BankHeader, int, int]:
    """The header of the section starting at `at`, where its values start and where it ends."""
    f.seek(at)
    prefix = f.read(_PREFIX.size)
    if len(prefix) < _PREFIX.size or prefix[:8] != MAGIC:
        raise BankCorrupt(f"gate bank {path}: not a gate bank file (made by `edge-runtime gate fit`)")
    _, version, length = _PREFIX.unpack(prefix)
    if version != FORMAT:
        raise BankCorrupt(f"gate bank {path}: format {version} is not one this version reads ({FORMAT})")
    if length > MAX_HEADER or at + _PREFIX.size + length > size:
        raise BankCorrupt(f"gate bank {path}: corrupt (its header runs past the file)")
    try:
        header = BankHeader.model_validate(strict_json.loads(f.read(length)))
    except (strict_json.StrictJsonError, ValidationError) as exc:
        why = str(exc).splitlines()[0][:160]
        raise BankCorrupt(f"gate bank {path}: corrupt header ({why})") from None
    end = at + _PREFIX.size + length + header.vectors.patches * header.vectors.dim * 4
    if header.part is None and at:
        raise BankCorrupt(f"gate bank {path}: corrupt (a section after the first names no region)")
    if header.part is None and size != end:
        raise BankCorrupt(f"gate bank {path}: corrupt ({size} bytes where its header declares {end}: "
                          "truncated or appended to)")
    if end > size:
        raise BankCorrupt(f"gate bank {path}: corrupt (region {header.part.name if header.part else ''}'s values "
                          "run past the file: truncated)")
    return header, at + _PREFIX.size + length, end


def _sections(f: BinaryIO, path: Path, size: int) -> list[tuple[BankHeader, int]]:
    """Each section's header and where its values start: one whole-frame section, or a program's
    regions 0..count-1 ending exactly at the file's end."""
    out: list[tuple[BankHeader, int]] = []
    at = 0
    while True:
        header, offset, end = _header(f, path, size, at)
        out.append((header, offset))
        part = header.part
        if part is None:
            return out
        count = out[0][0].part.count if out[0][0].part else 0
        if part.index != len(out) - 1 or part.count != count:
            raise BankCorrupt(f"gate bank {path}: corrupt (section {len(out)} says region {part.index + 1} of "
                              f"{part.count}, after {count} were declared)")
        if part.index == part.count - 1:
            if end != size:
                raise BankCorrupt(f"gate bank {path}: corrupt ({size} bytes where its sections end at {end}: "
                                  "appended to)")
            return out
        if end >= size:
            raise BankCorrupt(f"gate bank {path}: corrupt (it ends after region {part.index + 1} of {part.count}: "
                              "truncated)")
        at = end


def check_context(header: BankHeader, context: GateContext, path: Path) -> None:
    """BankMismatch (one line) unless the bank was made the way `context` makes frames."""
    enc, want = header.encoder, context.encoder
    if enc.kind != want.kind or enc.sha256 != want.sha256:
        raise BankMismatch(f"gate bank {path}: made with another encoder ({enc.kind} {enc.file} sha256 "
                           f"{enc.sha256[:12]}… of {enc.bundle or 'an unnamed bundle'}); this model's is {want.file} "
                           f"sha256 {want.sha256[:12]}… of {want.bundle}: fit the gate again for this model")
    if header.budget != context.budget:
        keys = sorted(k for k in {*header.budget, *context.budget} if header.budget.get(k) != context.budget.get(k))
        raise BankMismatch(f"gate bank {path}: made with another image budget ({', '.join(keys)}: "
                           f"{_short(header.budget, keys)} in the bank, {_short(context.budget, keys)} now): "
                           "fit the gate again")
    if (header.region and tuple(header.region)) != (context.region and tuple(context.region)):
        raise BankMismatch(f"gate bank {path}: fitted on crop {_crop(header.region)}, but these frames are cut "
                           f"to {_crop(context.region)}: fit the gate again for this crop")
    part = None if header.part is None else (header.part.name, tuple(header.part.box))
    if part != context.part:
        raise BankMismatch(f"gate bank {path}: fitted on {_part(part)}, but these frames are {_part(context.part)}: "
                           "fit the gate again for the camera's program (gate fit --camera NAME)")


def check_parts(headers: Sequence[BankHeader], contexts: Sequence[GateContext], path: Path) -> None:
    """BankMismatch unless the bank's sections are the regions `contexts` ask for, in order, each made
    with that context's encoder, budget, crop and box."""
    have = [h.part.name if h.part else None for h in headers]
    want = [c.part[0] if c.part else None for c in contexts]
    if have != want:
        raise BankMismatch(f"gate bank {path}: holds {_names(have)}; these frames are {_names(want)}: fit the "
                           "gate again for the camera's program (gate fit --camera NAME)")
    for header, context in zip(headers, contexts, strict=True):
        check_context(header, context, path)


def _names(names: list[str | None]) -> str:
    return "whole frames" if names == [None] else "regions " + ", ".join(str(n) for n in names)


def _part(part: tuple[str, tuple[int, ...]] | None) -> str:
    return "whole frames" if part is None else f"region {part[0]} [{', '.join(str(v) for v in part[1])}]"


def _short(d: dict[str, Any], keys: list[str]) -> str:
    return json.dumps({k: d.get(k) for k in keys}, sort_keys=True)[:200]


def _crop(region: tuple[int, int, int, int] | None) -> str:
    return "the whole frame" if region is None else "[" + ", ".join(str(v) for v in region) + "]"


@dataclass
class LoadedBank:
    header: BankHeader
    index: PatchIndex
    path: Path


def read_bank(path: Path, max_bytes: int, context: GateContext | None = None,
              progress: Callable[[int], None] | None = None) -> LoadedBank:
    """Load a bank into a search index, refusing (one line) a file that is not a whole bank, one over
    `max_bytes` of memory, one of another encoder, budget, crop or region than `context`."""
    banks = read_banks(path, max_bytes, None if context is None else [context], progress)
    if len(banks) != 1:  # only without a context (a context of whole frames refuses regions above)
        raise BankMismatch(f"gate bank {path}: holds {len(banks)} regions of a program, not whole frames")
    return banks[0]


def read_banks(path: Path, max_bytes: int, contexts: Sequence[GateContext] | None = None,
               progress: Callable[[int], None] | None = None) -> list[LoadedBank]:
    """Every section of a bank, each into its own index (one for whole frames, one per region),
    checked like `read_bank`; `contexts`, when given, are the regions the camera asks, in order."""
    with _open(path) as f:
        sections = _sections(f, path, os.fstat(f.fileno()).st_size)
        headers = [h for h, _ in sections]
        n = sum(h.vectors.patches for h in headers)
        need = sum(index_bytes(h.vectors.patches, h.vectors.dim) for h in headers)
        if need > max_bytes:
            raise BankTooLarge(f"gate bank {path}: {n} patches of {headers[0].vectors.dim} values need "
                               f"{_mib(need)} in memory, over the bound of {_mib(max_bytes)} "
                               "(gate.max_bank_mb): fit a smaller bank (--max-patches) or raise the bound")
        for h in headers:
            if h.vectors.dim != h.layout.embed_dim + 2:
                raise BankCorrupt(f"gate bank {path}: corrupt header (vectors of {h.vectors.dim} values for "
                                  f"embeddings of {h.layout.embed_dim})")
        if contexts is not None:
            check_parts(headers, contexts, path)
        out, done = [], 0
        for header, offset in sections:
            index = _values(f, path, header, offset, done, progress)
            done += header.vectors.patches
            out.append(LoadedBank(header, index, path))
    return out


def _values(f: BinaryIO, path: Path, header: BankHeader, offset: int, done: int,
            progress: Callable[[int], None] | None) -> PatchIndex:
    """One section's values, read in chunks, hashed (BankCorrupt unless they match its sha256), indexed."""
    n, dim = header.vectors.patches, header.vectors.dim
    h = _digest(header)
    index = PatchIndex(dim)
    rows = max(1, _CHUNK_ROWS_BYTES // (dim * 4))
    f.seek(offset)
    read = 0
    while read < n:
        take = min(rows, n - read)
        raw = f.read(take * dim * 4)
        if len(raw) != take * dim * 4:
            raise BankCorrupt(f"gate bank {path}: corrupt (the file ended early)")
        h.update(raw)
        chunk = np.frombuffer(raw, dtype="<f4").reshape(take, dim)
        if not np.isfinite(chunk).all():
            raise BankCorrupt(f"gate bank {path}: corrupt (a value is not a finite number)")
        index.add(chunk)
        read += take
        if progress is not None:
            progress(done + read)
    if h.hexdigest() != header.vectors.sha256:
        raise BankCorrupt(f"gate bank {path}: corrupt (its sha256 does not match its contents)")
    return index


def verify_bank(path: Path) -> BankHeader:
    """The (first section's) header of a whole, uncorrupted bank (every value read and hashed)."""
    return verify_banks(path)[0]


def verify_banks(path: Path) -> list[BankHeader]:
    """Every section's header of a whole, uncorrupted bank (every value read and hashed; nothing kept)."""
    with _open(path) as f:
        sections = _sections(f, path, os.fstat(f.fileno()).st_size)
        for header, offset in sections:
            h = _digest(header)
            f.seek(offset)
            left = header.vectors.patches * header.vectors.dim * 4
            while left and (block := f.read(min(_CHUNK_ROWS_BYTES, left))):
                h.update(block)
                left -= len(block)
            if h.hexdigest() != header.vectors.sha256:
                raise BankCorrupt(f"gate bank {path}: corrupt (its sha256 does not match its contents)")
    return [h for h, _ in sections]


def _mib(n: float) -> str:
    """Two significant figures below 10 MiB, so a small bound never reads as "0 MiB" (review D11)."""
    value = n / 2**20
    return f"{value:.0f} MiB" if value >= 10 else f"{value:.2g} MiB"
