"""`images:` and `inspection:`: limits on input images and the one shared inspection queue."""

from __future__ import annotations

from pydantic import Field

from edge_runtime.config.base import Section


class ImageLimits(Section):
    max_pixels: int = Field(50_000_000, ge=1, description="Refuse images declaring more pixels.")
    min_side: int = Field(16, ge=1, description="Refuse images with a side shorter than this.")
    max_file_mb: float = Field(64, gt=0, le=4096, description="Refuse image files larger than this "
                               "(camera folders, the CLI) before reading them.")


class InspectionConfig(Section):
    queue_size: int = Field(4, ge=1, le=256, description="Inspections waiting for the model; beyond this "
                            "cameras skip frames and the API answers 429.")
    jpeg_quality: int = Field(80, ge=10, le=100, description="Quality of the latest-frame JPEG per camera.")
    overlap_stages: bool = Field(True, description="Encode the next frame while the language model generates "
                                 "the current verdict (two pipeline stages).")
    max_batch: int = Field(4, ge=1, le=32, description="Frames that are ready together (of several cameras, "
                           "or a continuous camera's frames encoded while the model was busy) are generated "
                           "as parallel sequences of one llama.cpp batch, up to this many.")
