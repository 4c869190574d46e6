"""Talking to a daemon process over its real HTTP port, from tests that start and kill it."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def trigger(port: int, camera: str = "cam") -> Any:
    """Trigger one inspection and return its result, or None while the daemon is not answering (not up
    yet, or killed while it answered: what these tests do to it)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/cameras/{camera}/trigger", data=b"{}",
                                 method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())
    except OSError:  # URLError and ConnectionError are OSErrors
        return None
