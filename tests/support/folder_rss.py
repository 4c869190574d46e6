"""Run a folder camera until it delivered a frame and refused a file; print its peak RSS growth in MB.

    python tests/support/folder_rss.py FOLDER      (used by capture/test_capture.py and for docs/reliability.md)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main(folder: str) -> None:
    from edge_runtime.capture.camera import Camera
    from edge_runtime.config import CameraConfig

    camera = Camera(CameraConfig(name="drop", source=folder, fps=50))
    before = peak_rss_mb()  # everything imported, nothing decoded
    t0 = time.monotonic()
    camera.start()
    try:
        # Done when every file was either refused or delivered (getattr: also runs on older code).
        while not (camera.stats.captured >= 2 or (camera.stats.captured and getattr(camera.stats, "refused", 0))):
            if time.monotonic() - t0 > 90:
                raise SystemExit(f"timed out: {camera.status()}")
            time.sleep(0.05)
    finally:
        camera.stop()
    print(f"refused={getattr(camera.stats, 'refused', 'n/a')} captured={camera.stats.captured} "
          f"seconds={time.monotonic() - t0:.1f} peak_rss_growth_mb {peak_rss_mb() - before:.1f}")


if __name__ == "__main__":
    main(sys.argv[1])
