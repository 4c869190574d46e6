"""`programs:`: inspection programs, what one question is made of besides the frame (docs/inspection.md).

Today a program holds reference images with a caption each, placed before the frame in the prompt;
a camera names its program (`cameras[].program`). Every reference file is read and decoded when the
config is validated (`config validate`, start, reload), so a missing, corrupt or oversized one
refuses the whole file in one line naming the program, the cameras that use it and the file.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from edge_runtime.config.base import Section
from edge_runtime.config.inspection import ImageLimits

MAX_REFERENCES = 8  # each reference is a whole image's tokens in every prompt of the program


class ReferenceConfig(Section):
    image: Path = Field(description="The reference image file (JPEG, PNG, ...), bounded by images: like any input.")
    caption: str = Field(min_length=1, max_length=200, pattern=r"^[^\r\n]*$",
                         description="What the reference shows, e.g. 'golden OK sample' or "
                         "'known NOK: missing screw'; written before its image in the prompt.")


class ProgramConfig(Section):
    references: list[ReferenceConfig] = Field(
        default_factory=list, max_length=MAX_REFERENCES,
        description="Reference images with captions, placed in this order before the frame. Their KV "
        "(with the system text) is computed once and shared by every frame and camera of the program. "
        "Needs a GGUF + mmproj bundle (one that takes several images).")


def check_references(programs: dict[str, ProgramConfig], users: dict[str, list[str]], limits: ImageLimits) -> None:
    """Read and decode every reference within `limits`; ValueError naming the program, its cameras
    (`users`) and the file on the first that fails."""
    from edge_runtime.core.errors import ImageError
    from edge_runtime.core.images import read_image_file

    for name, program in programs.items():
        for i, ref in enumerate(program.references):
            try:
                read_image_file(ref.image, limits.max_pixels, limits.min_side, int(limits.max_file_mb * 2**20))
            except ImageError as exc:
                cams = users.get(name) or []
                used = f" (cameras: {', '.join(cams)})" if cams else ""
                why = str(exc).removeprefix(f"{ref.image}: ").removeprefix(f"{ref.image} ")
                raise ValueError(f"programs.{name}{used}: references.{i}.image {ref.image}: {why}") from None
