"""Whether the loaded inspection programs fit this model, checked at start and reload (ConfigError,
one line naming the program and the camera): a program whose every frame would be refused never runs.

libmtmd counts a frame's image tokens from its size, so a camera of known size (width/height or roi)
is checked without a frame and nothing is encoded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from edge_runtime.config import CameraConfig
from edge_runtime.core.errors import ConfigError, InputError
from edge_runtime.inference.encoding import FrameEncoder
from edge_runtime.inference.programs import REFERENCE_TEXT, LoadedProgram


def _size(cam: CameraConfig) -> tuple[int | None, int | None]:
    return (cam.roi[2], cam.roi[3]) if cam.roi else (cam.width, cam.height)


def check_frame_budgets(programs: Mapping[str, LoadedProgram], cameras: Sequence[CameraConfig],
                        encoder: FrameEncoder) -> None:
    """ConfigError when a camera of known size gets frames the projector cannot bring under its
    program's image_tokens.max: every frame would be refused."""
    if encoder.mtmd is None:
        return
    for cam in cameras:
        program = programs.get(cam.program) if cam.program is not None else None
        size = _size(cam)
        if program is None or program.tokens is None or size[0] is None or size[1] is None:
            continue
        try:
            encoder.fit_tokens(np.zeros((size[1], size[0], 3), np.uint8), *program.tokens)
        except InputError as exc:
            why = str(exc).removeprefix("image_tokens: ").replace("this image", f"its {size[0]}x{size[1]} frame")
            raise ConfigError(f"programs.{program.name} (camera {cam.name}): image_tokens.max "
                              f"{program.tokens[1]} is below what the camera's frames can have: {why}") from None


def check_references_fit(programs: Mapping[str, LoadedProgram], cameras: Sequence[CameraConfig],
                         encoder: FrameEncoder, tokenize: Callable[[str], list[int]], max_tokens: int,
                         n_ctx: int) -> None:
    """ConfigError when a program's references (their image tokens and captions), a frame of each
    camera of known size and the answer's max_tokens cannot fit the context: every frame would be
    refused. The references are encoded already; the frame is counted from its size."""
    users = {name: [c for c in cameras if c.program == name] for name in programs}
    for name, program in programs.items():
        clip = program.config.clip if program.config is not None else None
        if not program.references and clip is None:
            continue
        shown = "a frame" if clip is None else f"a clip of {clip.frames} frames"
        refs = sum(len(r.encoded.embeds) + len(tokenize(REFERENCE_TEXT.format(caption=r.caption)))
                   for r in program.references)
        listed: list[CameraConfig | None] = list(users[name]) or [None]
        for cam in listed:
            size = None if cam is None else _size(cam)
            frame = 0
            if encoder.mtmd is not None and size is not None and size[0] is not None and size[1] is not None:
                pixels = np.zeros((size[1], size[0], 3), np.uint8)
                frame = encoder.mtmd.image_tokens(
                    encoder.fit_tokens(pixels, *program.tokens) if program.tokens else pixels)
                frame *= clip.frames if clip is not None else 1
            need = refs + frame + max_tokens
            if need >= n_ctx:
                where = f" (camera {cam.name})" if cam is not None else ""
                raise ConfigError(
                    f"programs.{name}{where}: the references take {refs} tokens, {shown} {frame} and the answer "
                    f"up to {max_tokens}: {need}, more than the context of {n_ctx} tokens "
                    "(model.context_size; or fewer/smaller references, image_tokens.max)")
