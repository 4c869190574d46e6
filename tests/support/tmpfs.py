"""A real small file system for full-disk tests: tmpfs mounted as root, unmounted afterwards."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(path: Path, size: str = "8m") -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill_disk(disk: Path) -> Path:
    """Write zeros into `disk`/filler until the file system refuses (ENOSPC): another program filling the disk.
    Unbuffered, so the file's size is what reached the disk."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    return filler
