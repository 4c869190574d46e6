"""A daemon's real inspector with a fixed delay added to every generation, for tests whose premise is a
model slower than its cameras (the demo model alone got faster than 90 fps of input on CI's 2 cores)."""

from __future__ import annotations

import time
from typing import Any, cast

from edge_runtime.app.daemon import Daemon
from edge_runtime.inference.inspector import Inspector


def slow_down(daemon: Daemon, seconds: float) -> None:
    """From now on each inspection, and each batch of them, takes `seconds` more; call before start()."""
    real = daemon._current_inspector

    class Slow:
        """The real inspector, every method of it, with `seconds` more per generation."""

        def __getattr__(self, name: str) -> Any:
            return getattr(real(), name)

        def inspect(self, *args: Any, **kwargs: Any) -> Any:
            time.sleep(seconds)
            return real().inspect(*args, **kwargs)

        def inspect_batch(self, *args: Any, **kwargs: Any) -> Any:
            time.sleep(seconds)
            return real().inspect_batch(*args, **kwargs)

    slow = Slow()  # one object: the worker keeps embeddings only for the model that made them
    daemon.worker.get_inspector = lambda: cast(Inspector, slow)
