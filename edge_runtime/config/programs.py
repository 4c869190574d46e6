"""`programs:`: inspection programs, what one question is made of besides the frame (docs/inspection.md).

Today a program holds reference images with a caption each, placed before the frame in the prompt;
a camera names its program (`cameras[].program`). Every reference file is read and decoded when the
config is validated (`config validate`, start, reload), so a missing, corrupt or oversized one
refuses the whole file in one line naming the program, the cameras that use it and the file.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, model_validator

from edge_runtime.config.base import NAME, ConfigPath, Section
from edge_runtime.config.cameras import check_box
from edge_runtime.config.inspection import ImageLimits

MAX_REFERENCES = 8  # each reference is a whole image's tokens in every prompt of the program
MAX_REGIONS = 32  # regions (named and tiles) of one frame: each is a sequence of the frame's batch
MAX_TILES_PER_SIDE = 8
MAX_CLIP_FRAMES = 16  # each frame of a clip is a whole image's tokens in the prompt
CLIP_RING_BYTES = 256 * 2**20  # what one camera's clip ring may hold (frames x width x height x 3)
# A clip camera's frames, at its fps, must come within its max_gap_s with this much of a frame interval
# to spare (check_clip_pace): a frame read a little late must not start the clip again.
CLIP_PACE_MARGIN = 0.05


class ReferenceConfig(Section):
    image: ConfigPath = Field(description="The reference image file (JPEG, PNG, ...), bounded by images: like any "
                              "input.")
    caption: str = Field(min_length=1, max_length=200, pattern=r"^[^\r\n]*$",
                         description="What the reference shows, e.g. 'golden OK sample' or "
                         "'known NOK: missing screw'; written before its image in the prompt.")


class RegionConfig(Section):
    name: str = Field(pattern=NAME, description="The region's name in results (letters, digits, _ and -).")
    box: tuple[int, int, int, int] = Field(
        description="[x, y, width, height] in the camera's frame (after its roi), in pixels.")
    prompt: str | None = Field(None, max_length=4000, description="This region's question; empty: the camera's.")
    verdict_schema: dict[str, Any] | None = Field(
        None, description="This region's verdict JSON schema; empty: the bundle's.")

    @model_validator(mode="after")
    def _box_has_pixels(self) -> RegionConfig:
        check_box(self.box, f"region {self.name}: box")
        return self


class TilingConfig(Section):
    rows: int = Field(ge=1, le=MAX_TILES_PER_SIDE, description="Tiles down the frame.")
    cols: int = Field(ge=1, le=MAX_TILES_PER_SIDE, description="Tiles across the frame.")
    overlap: float = Field(0.0, ge=0.0, le=0.5, description="How much neighbouring tiles overlap, as a share "
                           "of a tile's size (0.1: each tile grows by 10% into its neighbours).")


class ImageTokens(Section):
    min: int | None = Field(None, ge=1, le=65536, description="Fewest image tokens a frame is given (it is "
                            "enlarged until libmtmd makes at least this many, within the bundle's ceiling; over "
                            "it is refused).")
    max: int | None = Field(None, ge=1, le=65536, description="Most image tokens a frame is given (it is "
                            "shrunk until libmtmd makes at most this many); at most the bundle's image_max_tokens.")

    @model_validator(mode="after")
    def _ordered(self) -> ImageTokens:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"image_tokens: min {self.min} is more than max {self.max}")
        return self


class ClipConfig(Section):
    frames: int = Field(ge=2, le=MAX_CLIP_FRAMES, description="How many of the camera's last frames one question "
                        "is about, oldest first, in one multi-image prompt.")
    spacing_s: float = Field(ge=0.0, le=3600.0, description="Seconds at least between two frames of the clip "
                             "(0: consecutive captured frames).")
    max_gap_s: float | None = Field(
        None, gt=0.0, le=86400.0, description="Seconds at most between two frames of the clip: a longer gap (the "
        "camera stalled or reconnected) starts the clip again from the frame after it, so no question mixes frames "
        "from before and after a stall. Default: 1.05 x (spacing_s + max(spacing_s, 5 s)), 5.25 s at spacing_s "
        "0: it takes a camera of one frame in 5 s. A slower camera needs it set: its kept frames' spacing plus "
        "5% of a frame interval (a config naming the camera's fps is refused giving the value).")

    @property
    def gap_limit_s(self) -> float:
        """The longest gap between two frames of one clip (max_gap_s, or its default). The default is
        spacing_s + max(spacing_s, 5 s) with CLIP_PACE_MARGIN of it more: any camera whose frame interval is
        within spacing_s + max(spacing_s, 5 s) passes check_clip_pace with it (the kept frames come up to
        spacing_s + an interval apart), so no default refuses a camera the rule before the margin took."""
        if self.max_gap_s is not None:
            return self.max_gap_s
        base = self.spacing_s + max(self.spacing_s, 5.0)
        return base + CLIP_PACE_MARGIN * base  # as check_clip_pace's need: at an interval of `base`, equal to it

    @model_validator(mode="after")
    def _gap_above_spacing(self) -> ClipConfig:
        if self.max_gap_s is not None and self.max_gap_s < self.spacing_s:
            raise ValueError(f"clip: max_gap_s {self.max_gap_s} is less than spacing_s {self.spacing_s}: "
                             "no two frames could be kept")
        return self


class ProgramConfig(Section):
    references: list[ReferenceConfig] = Field(
        default_factory=list, max_length=MAX_REFERENCES,
        description="Reference images with captions, placed in this order before the frame. Their KV "
        "(with the system text) is computed once and shared by every frame and camera of the program. "
        "Needs a GGUF + mmproj bundle (one that takes several images).")
    regions: list[RegionConfig] = Field(
        default_factory=list, max_length=MAX_REGIONS,
        description="Named crops of the frame, each inspected as a sequence of the frame's batch with its own "
        "question and schema; the result holds a verdict per region and the overall one.")
    tiling: TilingConfig | None = Field(
        None, description="The frame cut into rows x cols tiles (named tile_r<row>_c<col>), inspected like regions.")
    image_tokens: ImageTokens | None = Field(
        None, description="This program's image token budget (frames and references) for dynamic-resolution "
        "families (Qwen2.5/3-VL, ...): the image is resized until libmtmd's count is within it. GGUF + mmproj "
        "bundles only; the bundle's image_max_tokens is the ceiling.")
    clip: ClipConfig | None = Field(
        None, description="Ask about the camera's last `frames` frames taken at least `spacing_s` apart as one "
        "multi-image prompt (held in a bounded ring per camera). GGUF + mmproj bundles only; not with regions.")
    overall: Literal["nok_if_any_nok"] = Field(
        "nok_if_any_nok", description="How the regions' verdicts make the frame's: NOK when any region is NOK; "
        "all OK only when every region has a verdict and each is OK.")
    nok_field: str = Field(
        "defect", min_length=1, max_length=64, description="The verdict field whose truth makes a region NOK; a "
        "region whose verdict lacks it, or holds neither true nor false (null), has no verdict (never a default OK).")

    @model_validator(mode="after")
    def _regions_bounded_and_named_once(self) -> ProgramConfig:
        tiles = self.tiling.rows * self.tiling.cols if self.tiling else 0
        if len(self.regions) + tiles > MAX_REGIONS:
            raise ValueError(f"{len(self.regions)} regions and {tiles} tiles are more than {MAX_REGIONS} per frame")
        names = [r.name for r in self.regions]
        dupes = sorted({n for n in names if names.count(n) > 1 or (self.tiling and n.startswith("tile_r"))})
        if dupes:
            raise ValueError(f"region names must be unique (tile_r* are the tiles'); repeated: {', '.join(dupes)}")
        if self.clip is not None and (self.regions or self.tiling):
            raise ValueError("a clip is one question about whole frames: it cannot have regions or tiling")
        return self


# A reference is shrunk to the projector's image budget anyway (Qwen2.5-VL's largest is ~12.8 MP), so one
# beyond this is only decode time and memory at every reload (review D20: 8 x 49 MP took 72 s, +740 MB).
MAX_REFERENCE_PIXELS = 16_000_000


def reference_pixels(limits: ImageLimits) -> int:
    """The pixel bound of a reference image: images.max_pixels, at most MAX_REFERENCE_PIXELS."""
    return min(limits.max_pixels, MAX_REFERENCE_PIXELS)


def check_references(programs: dict[str, ProgramConfig], users: dict[str, list[str]], limits: ImageLimits) -> None:
    """Read and decode every reference within `limits`; ValueError naming the program, its cameras
    (`users`) and the file on the first that fails."""
    from edge_runtime.core.errors import ImageError
    from edge_runtime.core.images import read_image_file

    for name, program in programs.items():
        for i, ref in enumerate(program.references):
            try:
                read_image_file(ref.image, reference_pixels(limits), limits.min_side, int(limits.max_file_mb * 2**20))
            except ImageError as exc:
                cams = users.get(name) or []
                used = f" (cameras: {', '.join(cams)})" if cams else ""
                why = str(exc).removeprefix(f"{ref.image}: ").removeprefix(f"{ref.image} ")
                if "pixels" in why and limits.max_pixels > MAX_REFERENCE_PIXELS:
                    why += " (a reference is shrunk to the model's image budget anyway: downscale the file)"
                raise ValueError(f"programs.{name}{used}: references.{i}.image {ref.image}: {why}") from None


def check_region_schemas(programs: dict[str, ProgramConfig], users: dict[str, list[str]]) -> None:
    """Each region's own verdict schema, checked as a bundle's is (complexity budget, a valid JSON schema,
    an object); then the program's nok_field against it. ValueError in one line naming
    programs.<p>.regions.<name>.verdict_schema (or .nok_field) on the first that fails: an unusable schema
    would otherwise leave every frame of the program without a verdict."""
    for name, program in programs.items():
        for region in program.regions:
            if region.verdict_schema is None:
                continue
            where = f"programs.{name}.regions.{region.name}.verdict_schema{_users(users, name)}"
            why = schema_problem(region.verdict_schema)
            if why is not None:
                raise ValueError(f"{where}: {why}")
            check_nok_field(name, program.nok_field, region.verdict_schema, f"region {region.name}'s", users)


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why `schema` cannot be a verdict schema (None: it can)."""
    from jsonschema import Draft202012Validator, SchemaError

    from edge_runtime.core.errors import InputError
    from edge_runtime.core.schema_budget import check_schema_budget

    try:
        check_schema_budget(schema, "verdict_schema")
        Draft202012Validator.check_schema(schema)
    except InputError as exc:
        return f"not a valid verdict schema ({str(exc).removeprefix('verdict_schema').lstrip(':. ')})"
    except SchemaError as exc:
        return f"not a valid JSON schema ({exc.message[:200]})"
    if schema.get("type") != "object":
        return "not a valid verdict schema (it must describe a JSON object: type: object)"
    return None


def check_nok_field(program: str, field: str, schema: dict[str, Any], whose: str,
                    users: dict[str, list[str]]) -> None:
    """ValueError naming programs.<p>.nok_field unless `field` is a boolean property of `schema` (the
    regions' rule reads its truth; any other field would leave every region without a verdict)."""
    prop = (schema.get("properties") or {}).get(field)
    kind = prop.get("type") if isinstance(prop, dict) else None
    if kind != "boolean" and not (isinstance(kind, list) and "boolean" in kind):
        raise ValueError(f"programs.{program}.nok_field{_users(users, program)}: {field!r} is not a boolean "
                         f"property of {whose} verdict schema")


def _users(users: dict[str, list[str]], program: str) -> str:
    cams = users.get(program) or []
    return f" (cameras: {', '.join(cams)})" if cams else ""


def check_clip_ring(cfg: ProgramConfig, width: int, height: int, program: str, camera: str) -> None:
    """ValueError naming the program and the camera when its clip's frames at width x height would hold
    more than CLIP_RING_BYTES (cameras of unknown size: the ring refuses each frame over its share)."""
    if cfg.clip is None:
        return
    need = cfg.clip.frames * width * height * 3
    if need > CLIP_RING_BYTES:
        raise ValueError(f"programs.{program} (camera {camera}): clip of {cfg.clip.frames} frames of "
                         f"{width}x{height} needs {need // 2**20} MiB, more than the {CLIP_RING_BYTES // 2**20} MiB "
                         "a camera's clip ring may hold (fewer frames, or a smaller roi)")


def clip_gap_need(clip: ClipConfig, interval: float) -> tuple[int, float]:
    """(kept_every, need) for a camera whose frames come `interval` s apart: the ring keeps a frame
    `spacing_s` after the newest it holds, so the kept frames are up to kept_every = (spacing_s / interval,
    rounded down, + 1) intervals apart (one more where a frame due at spacing_s comes a little early); the
    clip's gap limit must be at least that and CLIP_PACE_MARGIN of an interval more (a frame's room to come
    late), or each frame may start the clip again. Used by check_clip_pace and ClipRing.stuck's advice."""
    kept_every = math.floor(clip.spacing_s / interval + 1e-9) + 1  # 0.3 s at fps 10: one in 4, not 3.0000001
    return kept_every, kept_every * interval + CLIP_PACE_MARGIN * interval


def clip_gap_advice(need: float) -> float:
    """`need` rounded up to 0.1 s: the max_gap_s to advise, so writing it is accepted."""
    advice = math.ceil(need * 10) / 10
    if advice < need:  # need * 10 rounded down to a whole number
        advice = round(advice + 0.1, 1)
    return advice


def check_clip_pace(cfg: ProgramConfig, fps: float, program: str, camera: str) -> None:
    """ValueError naming the program and the camera when its frames, at `fps`, would come to the clip's ring
    further apart than its gap limit allows with room for a late frame (clip_gap_need): each such frame
    empties the ring as a stall does, so no clip fills and the camera is never asked while it streams.
    The advice is rounded up to 0.1 s, so writing it is accepted."""
    if cfg.clip is None:
        return
    interval = 1.0 / fps
    kept_every, need = clip_gap_need(cfg.clip, interval)
    if cfg.clip.gap_limit_s >= need:
        return
    apart = kept_every * interval
    kept = f", one in {kept_every} kept for spacing_s {cfg.clip.spacing_s:g}" if kept_every > 1 else ""
    # The advice first: a config error's message is cut at 300 characters (config/schema.py).
    raise ValueError(f"programs.{program} (camera {camera}): a frame every {interval:.1f} s (fps {fps:g}) needs "
                     f"the clip's max_gap_s ({cfg.clip.gap_limit_s:g} s) to leave room for a late frame: set "
                     f"clip.max_gap_s to at least {clip_gap_advice(need):.1f} (frames up to {apart:.1f} s "
                     f"apart{kept}; one later than max_gap_s starts the clip again: it may never fill)")


def check_regions_inside(cfg: ProgramConfig, width: int, height: int, program: str, camera: str) -> None:
    """ValueError naming the program, the camera and the first region outside its width x height frame."""
    for r in cfg.regions:
        x, y, w, h = r.box
        if x + w > width or y + h > height:
            raise ValueError(f"programs.{program} (camera {camera}): region {r.name} [{x}, {y}, {w}, {h}] is "
                             f"outside the camera's {width}x{height} frame")
