"""Inspection programs as the inspector holds them: each reference read, bounded and encoded once
(through the encoder cache), and the fixed prefix they make (system text, then each reference's
caption and image, then the frame's introduction) built once per program and system text.

The prompt of a frame under a program (at the template's image slot, libmtmd's markers around each
image, as `mtmd_tokenize` lays out one media marker per image):

    {text before the image}Reference (golden OK sample):
    <image>
    Reference (known NOK: missing screw):
    <image>
    Image to inspect:
    <frame>{question and the rest of the template}

Everything up to the frame is a `Prefix` (llm/feed.py): its KV is decoded once and reused by every
frame of every camera that shares it (kept in a parallel slot, copied to the others).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import threading
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edge_runtime.config import CameraConfig, ImageLimits
from edge_runtime.config.programs import ProgramConfig, check_nok_field, reference_pixels
from edge_runtime.core.batch import Encoded
from edge_runtime.core.bundle.manifest import Bundle, MmprojManifest
from edge_runtime.core.errors import ConfigError, ImageError, InputError
from edge_runtime.core.images import read_image_file
from edge_runtime.inference.encoder_cache import pixels_digest
from edge_runtime.inference.llm.feed import Prefix, Segment

REFERENCE_TEXT = "Reference ({caption}):\n"
BETWEEN_TEXT = "\n"  # after each image, before the next caption
FRAME_TEXT = "Image to inspect:\n"
_PREFIXES_KEPT = 8  # per program: one per system text in use (cameras share the bundle's)
_uids = itertools.count(1)

# What a program needs of the inspector: libmtmd encodings split into (begin tokens, segments, end tokens).
Split = Callable[[Sequence[Encoded]], tuple[list[int], list[Segment], list[int]]]

log = logging.getLogger(__name__)


Key = tuple[str, tuple[int, int] | None]  # a reference's encoding: (sha256 of its pixels, image token budget)


@dataclass(frozen=True)
class Reference:
    caption: str
    path: Path
    encoded: Encoded
    stamp: tuple[int, int, int] | None = None  # the file's (mtime_ns, size, inode) when it was read
    key: Key | None = None  # references with the same key hold one encoding (load_programs)


@dataclass(frozen=True)
class ReferenceMemory:
    """What the programs' references hold in memory, counted before any is encoded: each distinct image
    (the same pixels under the same token budget, in one program or several) once."""

    programs: dict[str, int]  # each program's references' bytes (an image shared with another counted in both)
    images: int  # distinct encodings
    tokens: int  # their image tokens
    total: int  # their bytes (embeddings and positions, as held)
    new: int  # of which not held already: the running programs' encodings are reused, not encoded again
    n_embd: int


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """What tells a replaced or rewritten file from the one read (None: it cannot be stat'ed)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def read_reference(program: str, cameras: Sequence[CameraConfig], i: int, path: Path, limits: ImageLimits
                   ) -> np.ndarray:
    """A reference file decoded within `limits`; one that cannot be used is a ConfigError in one line naming
    the program, the cameras that use it and the file."""
    try:
        return read_image_file(path, reference_pixels(limits), limits.min_side, int(limits.max_file_mb * 2**20))
    except (ImageError, InputError) as exc:
        users = [cam.name for cam in cameras if cam.program == program]
        used = f" (cameras: {', '.join(users)})" if users else ""
        why = str(exc).removeprefix(f"{path}: ").removeprefix("image: ")
        raise ConfigError(f"programs.{program}{used}: references.{i}.image {path}: {why}") from None


@dataclass
class CountedReferences:
    """The programs' references read and counted, nothing encoded (`count_references`)."""

    # each reference's (program, index): its encoding's key and its file's stamp taken before the read
    keys: dict[tuple[str, int], tuple[Key, tuple[int, int, int] | None]]
    sizes: dict[Key, tuple[int, int]]  # each distinct encoding: (image tokens, bytes held)
    per_program: dict[str, int]  # each program's references' bytes (an image shared counted in each)

    def memory(self, n_embd: int, held: Container[Key] = ()) -> ReferenceMemory:
        """What they hold; `held`: encodings the running programs hold already (not new)."""
        return ReferenceMemory(self.per_program, len(self.sizes), sum(t for t, _ in self.sizes.values()),
                               sum(b for _, b in self.sizes.values()),
                               sum(b for k, (_, b) in self.sizes.items() if k not in held), n_embd)


def count_references(programs: Mapping[str, ProgramConfig], cameras: Sequence[CameraConfig], limits: ImageLimits,
                     budgets: Mapping[str, tuple[int, int] | None],
                     count: Callable[[np.ndarray, tuple[int, int] | None], tuple[int, int]],
                     each: Callable[[str, np.ndarray], None] | None = None) -> CountedReferences:
    """Every reference read (`read_reference`), hashed and counted from its size, then dropped: `count`
    gives an image's (tokens, bytes held) under its program's budget, once per distinct encoding (the
    same pixels under the same budget, in one program or several). `each(program, frame)` sees every
    reference as it is read (duplicates included). What start (`load_programs`) and `config validate`
    (`program_fit`) both count."""
    keys: dict[tuple[str, int], tuple[Key, tuple[int, int, int] | None]] = {}
    sizes: dict[Key, tuple[int, int]] = {}
    per_program: dict[str, int] = {}
    for name, cfg in programs.items():
        for i, ref in enumerate(cfg.references):
            stamp = file_stamp(ref.image)  # before the read: a write during it shows at the next reload
            frame = read_reference(name, cameras, i, ref.image, limits)
            if each is not None:
                each(name, frame)
            key = (pixels_digest(frame), budgets[name])
            keys[name, i] = key, stamp
            if key not in sizes:
                sizes[key] = count(frame, budgets[name])
        mine = {keys[name, i][0] for i in range(len(cfg.references))}
        if mine:
            per_program[name] = sum(sizes[k][1] for k in mine)
    return CountedReferences(keys, sizes, per_program)


def changed_references(programs: Mapping[str, LoadedProgram]) -> list[str]:
    """The references (programs.<p>.references.<i>) whose file changed since it was encoded: a reload
    with the same config must still encode the new picture, not keep inspecting against the old one."""
    return [f"programs.{name}.references.{i}" for name, program in programs.items()
            for i, ref in enumerate(program.references) if file_stamp(ref.path) != ref.stamp]


@dataclass
class LoadedProgram:
    """One program with its references encoded; `uid` tells its prefix's KV apart from an older
    load of the same name (a reload with a changed reference never reuses the old KV)."""

    name: str
    references: tuple[Reference, ...]
    config: ProgramConfig | None = None  # regions, tiling and the overall rule (regions.py)
    tokens: tuple[int, int] | None = None  # the image token budget (min, max) of its frames and references
    uid: int = field(default_factory=lambda: next(_uids))
    _prefixes: dict[tuple[str, tuple[int, ...]], Prefix] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def prefix(self, before: str, frame_begin: list[int], tokenize: Callable[[str], list[int]],
               with_bos: Callable[[list[int]], list[int]], split: Split) -> Prefix:
        """The fixed head of a frame's prompt: `before` (the template's text before the image slot)
        then the references, ending with the frame's begin marker. Built once per `before` and
        marker; the text between two images is tokenized as one string, as libmtmd tokenizes it."""
        key = (before, tuple(frame_begin))
        with self._lock:
            found = self._prefixes.get(key)
        if found is not None:
            return found
        segments: list[Segment] = []
        text, run = before, list[int]()
        for ref in self.references:
            begin, middle, end = split([ref.encoded])
            tokens = tokenize(text + REFERENCE_TEXT.format(caption=ref.caption))
            segments.append((with_bos(tokens) if not segments else run + tokens) + begin)
            segments.extend(middle)
            text, run = BETWEEN_TEXT, end
        tokens = tokenize(text + FRAME_TEXT)
        segments.append((with_bos(tokens) if not segments else run + tokens) + frame_begin)
        digest = hashlib.sha256(repr((key, [list(s) for s in segments if isinstance(s, list)])).encode())
        built = Prefix(f"program:{self.name}:{self.uid}:{digest.hexdigest()[:16]}",
                       tuple(s for s in segments if len(s)))
        with self._lock:
            if len(self._prefixes) >= _PREFIXES_KEPT:
                self._prefixes.pop(next(iter(self._prefixes)))
            self._prefixes[key] = built
        return built


def check_programs(programs: Mapping[str, ProgramConfig], cameras: Sequence[CameraConfig], several_images: bool,
                   bundle: str, ceiling: int, schema: Mapping[str, Any]) -> dict[str, tuple[int, int] | None]:
    """What a program needs of the bundle, checked without encoding anything (so `config validate`,
    start and reload refuse alike): references need several images, image_tokens a GGUF + mmproj bundle
    and a max within its image_max_tokens (`ceiling`), nok_field a boolean property of the bundle's
    verdict `schema` where a region or tile without its own schema reads it. Returns each program's
    token budget; ConfigError in one line naming the program and its cameras."""
    users: dict[str, list[str]] = {}
    for cam in cameras:
        if cam.program is not None:
            users.setdefault(cam.program, []).append(cam.name)
    budgets: dict[str, tuple[int, int] | None] = {}
    for name, cfg in programs.items():
        used = f" (cameras: {', '.join(users[name])})" if users.get(name) else ""
        if cfg.references and not several_images:
            raise ConfigError(f"programs.{name}{used}: references need a bundle that takes several images "
                              f"(a GGUF + mmproj pair); {bundle} takes one (docs/models.md)")
        if cfg.clip is not None and not several_images:
            raise ConfigError(f"programs.{name}{used}: a clip needs a bundle that takes several images "
                              f"(a GGUF + mmproj pair); {bundle} takes one (docs/models.md)")
        tokens = None
        if cfg.image_tokens is not None and (cfg.image_tokens.min or cfg.image_tokens.max):
            if ceiling <= 0:
                raise ConfigError(f"programs.{name}{used}: image_tokens needs a GGUF + mmproj bundle; {bundle}'s "
                                  "ONNX encoder makes a fixed number of image tokens")
            high = cfg.image_tokens.max or ceiling
            if high > ceiling:
                raise ConfigError(f"programs.{name}{used}: image_tokens.max {high} is more than {bundle}'s "
                                  f"image_max_tokens {ceiling}")
            if (cfg.image_tokens.min or 1) > high:  # max unset: the ceiling; a min over it is never met
                raise ConfigError(f"programs.{name}{used}: image_tokens.min {cfg.image_tokens.min} is more than "
                                  f"{bundle}'s image_max_tokens {ceiling}")
            tokens = (cfg.image_tokens.min or 1, high)
        if cfg.tiling is not None or any(r.verdict_schema is None for r in cfg.regions):
            try:
                check_nok_field(name, cfg.nok_field, dict(schema), f"{bundle}'s", users)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        budgets[name] = tokens
    return budgets


def check_bundle_programs(bundle: Bundle, programs: Mapping[str, ProgramConfig], cameras: Sequence[CameraConfig]
                          ) -> None:
    """`check_programs` against a bundle's manifest, the model not loaded (`config validate`)."""
    m = bundle.manifest
    ceiling = m.mtmd.image_max_tokens if isinstance(m, MmprojManifest) else 0
    check_programs(programs, cameras, isinstance(m, MmprojManifest), bundle.name, ceiling, m.verdict_schema)


def load_programs(programs: Mapping[str, ProgramConfig], cameras: Sequence[CameraConfig], limits: ImageLimits,
                  encode: Callable[[np.ndarray, tuple[int, int] | None], Encoded], several_images: bool, bundle: str,
                  ceiling: int, schema: Mapping[str, Any],
                  count: Callable[[np.ndarray, tuple[int, int] | None], tuple[int, int]] | None = None,
                  fit: Callable[[ReferenceMemory], None] | None = None, n_embd: int = 0,
                  running: Mapping[str, LoadedProgram] | None = None,
                  ) -> tuple[dict[str, LoadedProgram], dict[str, LoadedProgram]]:
    """(programs by name, the program of each camera that names one); ConfigError in one line naming
    the program, its cameras and the reference file that cannot be used (`check_programs` first).

    Every reference is read and counted first, nothing encoded: `count` gives an image's (tokens, bytes
    held) from its size, and `fit` sees the whole (ReferenceMemory) and may refuse it (memory_fit.py).
    Then each distinct image (sha256 of its pixels, under its program's token budget) is encoded once and
    its encoding held by every reference showing it, in any program; one the `running` programs hold
    already is taken from them, not encoded again."""
    budgets = check_programs(programs, cameras, several_images, bundle, ceiling, schema)
    users: dict[str, list[str]] = {}
    for cam in cameras:
        if cam.program is not None:
            users.setdefault(cam.program, []).append(cam.name)

    held = {ref.key: ref.encoded for p in (running or {}).values() for ref in p.references if ref.key is not None}
    # 1. Read and count: each file decoded, hashed and counted from its size, then dropped.
    counted = count_references(programs, cameras, limits, budgets, count or (lambda frame, tokens: (0, 0)))
    keys, sizes = counted.keys, counted.sizes
    if fit is not None and sizes:
        fit(counted.memory(n_embd, held))
    # 2. Encode each distinct image once (decoded again: what step 1 read is not kept, it would be all of
    # the references' pixels at once).
    encoded: dict[Key, Encoded] = {k: held[k] for k in sizes if k in held}
    loaded: dict[str, LoadedProgram] = {}
    for name, cfg in programs.items():
        used = f" (cameras: {', '.join(users[name])})" if users.get(name) else ""
        tokens = budgets[name]
        todo = {keys[name, i][0] for i in range(len(cfg.references))} - encoded.keys()
        if todo:  # each one decoded and encoded: seconds on a Jetson, said so a reload does not look hung
            log.info("programs.%s: encoding %d reference(s)", name, len(todo))
        refs = []
        for i, ref in enumerate(cfg.references):
            key, stamp = keys[name, i]
            if key not in encoded:
                frame = read_reference(name, cameras, i, ref.image, limits)
                if pixels_digest(frame) != key[0]:  # rewritten since step 1 counted it
                    raise ConfigError(f"programs.{name}{used}: references.{i}.image {ref.image}: the file "
                                      "changed while the references were read; reload again")
                try:
                    encoded[key] = encode(frame, tokens)
                except (ImageError, InputError) as exc:
                    why = str(exc).removeprefix(f"{ref.image}: ").removeprefix("image: ")
                    raise ConfigError(f"programs.{name}{used}: references.{i}.image {ref.image}: {why}") from None
            refs.append(Reference(ref.caption, ref.image, encoded[key], stamp, key))
        loaded[name] = LoadedProgram(name, tuple(refs), cfg, tokens)
    by_camera = {cam.name: loaded[cam.program] for cam in cameras if cam.program is not None and cam.program in loaded}
    return loaded, by_camera
