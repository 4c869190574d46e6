"""Whether the inspection programs fit this model, checked at start and reload (the model loaded) and at
`config validate` (libmtmd over the language model's vocabulary alone: no weights, no warm-up, nothing
encoded): a program whose every frame would be refused never runs. ConfigError, one line naming the
program and who asks it: a camera, a line station or one of its recipes (they ask a program in place
of their camera's).

libmtmd counts an image's tokens from its size, so a frame of known size (the camera's width/height or
roi; a station's camera), a region's box and a reference file are counted without encoding anything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from edge_runtime.config import CameraConfig, Config
from edge_runtime.config.line_io import StationConfig
from edge_runtime.config.programs import ProgramConfig
from edge_runtime.core.bundle.gguf_header import read_header
from edge_runtime.core.bundle.manifest import Bundle, Manifest, MmprojManifest
from edge_runtime.core.errors import ConfigError, InputError
from edge_runtime.inference import memory_fit
from edge_runtime.inference.encoding import fit_tokens, reference_bytes
from edge_runtime.inference.llm import mtmd as mtmd_module
from edge_runtime.inference.llm.handles import Model
from edge_runtime.inference.llm.mtmd import MAX_IMAGE_PIXELS, MtmdContext
from edge_runtime.inference.llm.runtime import log_to
from edge_runtime.inference.programs import (
    BETWEEN_TEXT,
    FRAME_TEXT,
    REFERENCE_TEXT,
    LoadedProgram,
    check_programs,
    count_references,
)
from edge_runtime.inference.prompting import around_image
from edge_runtime.inference.regions import frame_regions

log = logging.getLogger(__name__)
Budgets = Mapping[str, tuple[int, int] | None]  # each program's image token budget (min, max)
Text = Callable[[str | None, tuple[str, ...]], int]  # a question's text tokens (None: the default), its captions


@dataclass(frozen=True)
class Asker:
    """Who asks a program's questions, and the size of the frames it asks about (None: not known)."""

    label: str  # "camera belt", "station line_io.stations.s1", "recipe line_io.stations.s1.recipes.7"
    size: tuple[int, int] | None
    question: str | None = None  # the question it asks (None: the bundle's default)


def _size(cam: CameraConfig) -> tuple[int, int] | None:
    w, h = (cam.roi[2], cam.roi[3]) if cam.roi else (cam.width, cam.height)
    return None if w is None or h is None else (w, h)


def askers(programs: Mapping[str, object], cameras: Sequence[CameraConfig],
           stations: Sequence[StationConfig] = ()) -> dict[str, list[Asker]]:
    """Each program's askers: the cameras naming it, then the stations and recipes (their camera's size)."""
    sizes = {cam.name: _size(cam) for cam in cameras}
    questions = {cam.name: cam.prompt for cam in cameras}
    out: dict[str, list[Asker]] = {name: [] for name in programs}
    for cam in cameras:
        if cam.program in out:
            out[cam.program].append(Asker(f"camera {cam.name}", sizes[cam.name], cam.prompt))
    for st in stations:
        size, question = sizes.get(st.camera), questions.get(st.camera)
        if st.program in out:
            out[st.program].append(Asker(f"station line_io.stations.{st.name}", size, question))
        for rid, recipe in st.recipes.items():
            if recipe.program in out:
                out[recipe.program].append(Asker(f"recipe line_io.stations.{st.name}.recipes.{rid}", size,
                                                 recipe.prompt or question))
    return out


def check_frame_budgets(budgets: Budgets, asked: Mapping[str, list[Asker]], mtmd: MtmdContext | None) -> None:
    """ConfigError when frames of known size cannot be brought under their program's image_tokens.max
    (the projector's own floor is above it): every frame would be refused."""
    if mtmd is None:
        return
    for name, tokens in budgets.items():
        for who in asked.get(name, []):
            if tokens is None or who.size is None:
                continue
            w, h = who.size
            try:
                _taken(w, h, "its frame")
            except TooLarge as exc:
                raise ConfigError(f"programs.{name} ({who.label}): {exc}") from None
            try:
                fit_tokens(mtmd, np.zeros((h, w, 3), np.uint8), *tokens)
            except InputError as exc:
                why = str(exc).removeprefix("image_tokens: ").replace("this image", f"its {w}x{h} frame")
                raise ConfigError(f"programs.{name} ({who.label}): image_tokens.max {tokens[1]} is below what "
                                  f"the camera's frames can have: {why}") from None


def loaded_reference_tokens(programs: Mapping[str, LoadedProgram]) -> dict[str, int]:
    """Each loaded program's references as prompt tokens: each one's image tokens and libmtmd's text tokens
    around and inside it (their captions are the prompt's text)."""
    def held(enc: object) -> int:
        return sum(len(s) for s in getattr(enc, "parts", []) if isinstance(s, list))

    return {name: sum(len(r.encoded.embeds) + held(r.encoded) for r in p.references) for name, p in programs.items()}


class TooLarge(ValueError):
    """An image of known size that libmtmd never takes: every question showing it would be refused."""


def _taken(w: int, h: int, what: str) -> None:
    if w * h > MAX_IMAGE_PIXELS:
        raise TooLarge(f"{what} of {w}x{h} is {w * h} pixels, more than the {MAX_IMAGE_PIXELS} libmtmd takes "
                       "(a smaller box, roi or camera size)")


def _image_tokens(mtmd: MtmdContext, w: int, h: int, tokens: tuple[int, int] | None, what: str = "its frame") -> int:
    """The prompt tokens of one image of w x h under the budget `tokens`: its image tokens and the text
    tokens libmtmd lays around and inside it (the projector's begin and end markers, a slicing model's
    slice and row markers), as the prompt holds them."""
    _taken(w, h, what)
    pixels = np.zeros((h, w, 3), np.uint8)
    try:
        pixels = fit_tokens(mtmd, pixels, *tokens) if tokens else pixels
    except InputError:
        pass  # under a budget it cannot meet: check_frame_budgets says so
    return mtmd.prompt_tokens(pixels)


def question_tokens(template: str, system: str, default: str, tokenize: Callable[[str], list[int]],
                    with_bos: Callable[[list[int]], list[int]]) -> Text:
    """The text tokens of a frame's prompt besides its images: the bundle's template with its system text
    and the question (None: the bundle's default) and, with references, each one's caption and the
    frame's introduction (`Image to inspect:`), cut and tokenized as the program's prefix is
    (programs.LoadedProgram.prefix)."""
    counted: dict[tuple[str | None, tuple[str, ...]], int] = {}

    def count(question: str | None, captions: tuple[str, ...]) -> int:
        if (question, captions) not in counted:
            before, after = around_image(template, system, question or default)
            texts = ([before + REFERENCE_TEXT.format(caption=captions[0])]
                     + [BETWEEN_TEXT + REFERENCE_TEXT.format(caption=c) for c in captions[1:]]
                     + [BETWEEN_TEXT + FRAME_TEXT]) if captions else [before]
            counted[question, captions] = (len(with_bos(tokenize(texts[0]))) + sum(len(tokenize(t)) for t in texts[1:])
                                           + len(tokenize(after)))
        return counted[question, captions]

    return count


def onnx_image_tokens(m: Manifest | MmprojManifest) -> int:
    """The image tokens an ONNX-encoder bundle makes of any image (its fixed count; with a tile layout,
    a lower bound: one tile's); 0 for a GGUF + mmproj bundle, whose images libmtmd counts."""
    return m.vision.image_tokens if isinstance(m, Manifest) else 0


def _asked_image(cfg: ProgramConfig, tokens: tuple[int, int] | None, size: tuple[int, int] | None,
                 mtmd: MtmdContext | None, question: str | None, text: Text, fixed: int = 0
                 ) -> tuple[str, int, int]:
    """What one question of the program shows besides the references, its image tokens and its text's
    tokens: the region whose image and question are the most tokens (named boxes; tiles where the frame's
    size is known), a clip's frames, or the frame. An image of unknown size counts its budget's min: it
    is enlarged to at least that many tokens."""
    captions = tuple(r.caption for r in cfg.references)
    floor = (tokens[0] if tokens is not None else 0) if mtmd is not None else fixed
    if cfg.regions or cfg.tiling is not None:
        specs = frame_regions(cfg, *size) if size else frame_regions(cfg.model_copy(update={"tiling": None}), 0, 0)
        asked = [(_image_tokens(mtmd, s.box[2], s.box[3], tokens, f"region {s.name}") if mtmd is not None else fixed,
                  text(s.prompt or question, captions)) for s in specs]
        if not size and cfg.tiling is not None:  # tiles of a frame of unknown size
            asked.append((floor, text(question, captions)))
        image, words = max(asked, key=sum)
        return "its largest region", image, words
    frame = _image_tokens(mtmd, *size, tokens) if size and mtmd is not None else floor
    if cfg.clip is not None:
        return f"a clip of {cfg.clip.frames} frames", frame * cfg.clip.frames, text(question, captions)
    return "a frame", frame, text(question, captions)  # ONNX: its fixed count is the prompt's check


def check_context(programs: Mapping[str, ProgramConfig], budgets: Budgets, reference_tokens: Mapping[str, int],
                  asked: Mapping[str, list[Asker]], mtmd: MtmdContext | None, max_tokens: int, n_ctx: int,
                  text: Text = lambda question, captions: 0, fixed_image: int = 0) -> None:
    """ConfigError when a program's references, what one of its questions shows (a frame of known size,
    its largest region, a clip), the prompt's text (`text` counts it for a question: the template, the
    system text, the question) and the answer's max_tokens cannot fit the context: every question would
    be refused, as the model refuses a prompt whose tokens and max_tokens are more than the context."""
    for name, cfg in programs.items():
        refs = reference_tokens.get(name, 0)
        tokens = budgets.get(name)
        if not refs and cfg.clip is None and not cfg.regions and cfg.tiling is None and (tokens or (1, 0))[0] <= 1:
            continue
        listed: list[Asker | None] = list(asked.get(name, [])) or [None]
        for who in listed:
            where = f" ({who.label})" if who is not None else ""
            try:
                shown, image, words = _asked_image(cfg, tokens, who.size if who else None, mtmd,
                                                   who.question if who else None, text, fixed_image)
            except TooLarge as exc:
                raise ConfigError(f"programs.{name}{where}: {exc}") from None
            except InputError as exc:  # a question longer than the context can hold, refused before tokenizing
                raise ConfigError(f"programs.{name}{where}: its question cannot be asked "
                                  f"({str(exc).removeprefix('messages: ')})") from None
            need = refs + image + words + max_tokens
            if need > n_ctx:
                raise ConfigError(
                    f"programs.{name}{where}: the references take {refs} tokens, {shown} {image}, the prompt's "
                    f"text {words} and the answer up to {max_tokens}: {need}, more than the context of {n_ctx} "
                    "tokens (model.context_size; or fewer/smaller references, image_tokens.max, a shorter "
                    "question or model.max_tokens)")


def check_programs_offline(bundle: Bundle, config: Config) -> None:
    """`config validate`: what start and reload check of the programs after loading, with libmtmd over
    the language model's vocabulary (no weights, no warm-up) counting the tokens of every frame,
    region and reference from their sizes. Nothing is loaded when no program is used."""
    m = bundle.manifest
    asked = askers(config.programs, config.cameras, config.line_io.stations)
    if not any(asked.values()):
        return
    if isinstance(m, Manifest):  # an ONNX encoder: its fixed image tokens and the prompt's text
        log_to(lambda text: log.debug("llama.cpp: %s", text.decode("utf-8", "replace").rstrip()))
        budgets = check_programs(config.programs, config.cameras, False, bundle.name, 0, m.verdict_schema)
        with Model(str(bundle.language_path), vocab_only=True) as model:
            text = question_tokens(m.prompt.template, m.prompt.system, m.prompt.default,
                                   lambda t: model.vocab.tokenize(t.encode("utf-8"), False, True), list)
            check_context(config.programs, budgets, {}, asked, None, config.model.max_tokens or m.generation.max_tokens,
                          config.model.context_size, text, onnx_image_tokens(m))
        return
    if bundle.mmproj_path is None:
        return
    budgets = check_programs(config.programs, config.cameras, True, bundle.name, m.mtmd.image_max_tokens,
                             m.verdict_schema)
    # validate prints one line: llama.cpp's loader lines and libmtmd's warnings about the projector
    # (start logs those) go to the debug log here
    log_to(lambda text: log.debug("llama.cpp: %s", text.decode("utf-8", "replace").rstrip()))
    mtmd_log = logging.getLogger(mtmd_module.__name__)
    level = mtmd_log.level
    mtmd_log.setLevel(logging.ERROR)
    try:
        _check_offline(bundle, m, config, asked, budgets)
    finally:
        mtmd_log.setLevel(level)


def _check_offline(bundle: Bundle, m: MmprojManifest, config: Config, asked: Mapping[str, list[Asker]],
                   budgets: Budgets) -> None:
    assert bundle.mmproj_path is not None
    with Model(str(bundle.language_path), vocab_only=True) as model, \
            MtmdContext(bundle.mmproj_path, model.ptr, config.model.threads, False, m.mtmd.image_max_tokens,
                        warmup=False) as mtmd:
        check_frame_budgets(budgets, asked, mtmd)

        def tokenize(text: str) -> list[int]:
            return model.vocab.tokenize(text.encode("utf-8"), False, True)

        refs = dict.fromkeys(config.programs, 0)  # each program's references' prompt tokens
        # the vocabulary-only model does not say its embeddings' width: the GGUF's header does
        n_embd = memory_fit.language_shape(read_header(bundle.language_path)).n_embd_inp

        def prompt_tokens(name: str, frame: np.ndarray) -> None:
            h, w = frame.shape[:2]
            refs[name] += _image_tokens(mtmd, w, h, budgets[name])

        counted = count_references(config.programs, config.cameras, config.images, budgets,
                                   lambda frame, tokens: reference_bytes(mtmd, frame, tokens, n_embd), prompt_tokens)
        p, bos = m.prompt, model.vocab.bos()
        text = question_tokens(p.template, p.system, p.default, tokenize,
                               lambda ids: ids if bos < 0 or not model.vocab.add_bos() or ids[:1] == [bos]
                               else [bos, *ids])
        check_context(config.programs, budgets, refs, asked, mtmd,
                      config.model.max_tokens or m.generation.max_tokens, config.model.context_size, text)
        # after the context (the cheaper, more specific refusal): what start counts, against the device's RAM
        if config.model.memory_check and counted.sizes:
            from edge_runtime.inference.llm.runtime import engine_info

            memory_fit.check_references_fit(counted.memory(n_embd), bundle, config,
                                            bool(engine_info()["gpu_offload"]), loaded=False)

