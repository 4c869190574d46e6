"""`journal:` and `evidence:`: what is kept on disk and for how long."""

from __future__ import annotations

from pydantic import Field

from edge_runtime.config.base import ConfigPath, Section


class JournalConfig(Section):
    path: ConfigPath | None = Field(None, description="SQLite file (default: <data_dir>/journal.sqlite3).")
    max_rows: int = Field(100_000, ge=10, description="Keep at most this many delivered results.")
    max_age_days: float = Field(30, gt=0, description="Delete delivered results older than this.")
    min_free_mb: float = Field(64, ge=0, description="Free-space watermark: below it the oldest delivered "
                               "results are deleted early, so the disk does not fill.")


# The evidence store's section (verdicts/evidence.py); here so that reading a config never imports OpenCV.
class EvidenceConfig(Section):
    enabled: bool = Field(True, description="Keep the image each verdict was made from.")
    path: ConfigPath | None = Field(None, description="Folder of the store (default: <data_dir>/evidence).")
    max_mb: float = Field(1024, gt=0, description="Disk budget of the store (images and thumbnails).")
    max_age_days: float = Field(30, gt=0, description="Delete delivered evidence older than this.")
    min_free_mb: float = Field(64, ge=0, description="Leave this much free on the file system "
                               "(the journal shares it): older evidence is deleted first.")
    keep_passes: float = Field(0.1, ge=0, le=1, description="Fraction of passing verdicts whose image "
                               "is kept (defects are always kept); 0 keeps none, 1 keeps all.")
    defect_field: str = Field("defect", pattern=r"^[A-Za-z0-9_]{1,64}$",
                              description="Verdict field that is true for a defect.")
    full_frame: bool = Field(False, description="Keep the whole camera frame instead of the ROI crop "
                             "the model saw.")
    draw_regions: bool = Field(True, description="Draw an inspection program's regions on the kept image, "
                               "each box in its outcome's colour (ok green, nok red, none grey) with its name.")
    jpeg_quality: int = Field(85, ge=10, le=100, description="JPEG quality of kept images.")
    thumbnail_px: int = Field(192, ge=32, le=1024, description="Longest side of thumbnails.")
