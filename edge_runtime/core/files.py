"""Opening a named input file without letting it block: a FIFO, device or socket is refused.

Opening a FIFO for reading waits for a writer, forever; a reference image or gate bank that is one
would hang `config validate`, start and every later reload. The file is opened non-blocking and its
type checked on the open descriptor (no race with a swap between a stat and the open).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO


class NotRegularFile(OSError):
    """The path names a folder, FIFO, device or socket, not a regular file."""


def open_regular(path: Path | str) -> BinaryIO:
    """`open(path, "rb")` of a regular file (symbolic links followed); NotRegularFile for anything else."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                    else "a socket" if stat.S_ISSOCK(mode) else "a device")
            raise NotRegularFile(f"not a regular file ({kind})")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
