"""A daemon started in this process from a config file the test wrote, as `run` starts one from its file:
tests that reload it edit that file and call `reload()`."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import Config, load_config

log = logging.getLogger(__name__)


@dataclass
class FileDaemon:
    """A started daemon and the file it reloads from."""

    daemon: Daemon
    path: Path

    @property
    def url(self) -> str:
        """The base URL of its HTTP API (the config's api.port 0 picks a free port)."""
        assert self.daemon.api is not None, "the config disables the API"
        return f"http://127.0.0.1:{self.daemon.api.port}"

    def reasons(self, camera: str) -> list[str]:
        """Its health reasons that name `camera`."""
        return [r for r in self.daemon.health()["reasons"] if r.startswith(f"camera {camera}: ")]


@contextmanager
def daemon_from_file(path: Path, config: Config | str | None = None, *,
                     running: Config | None = None) -> Iterator[FileDaemon]:
    """Write `config` to `path` (a Config as its JSON dump, text as it is; None: the test wrote the file),
    start a Daemon with `config_path=path`, and stop it however the block ends (on a failure, its health
    goes to the log that pytest shows with the daemon's own lines).

    The daemon runs a deep copy of a Config (a test that edits its own for the next reload does not edit
    the running one), else what `load_config(path)` reads; `running` overrides either (a daemon started
    with cameras beyond its file, as `run --demo` does). `start()` returns once the model is loaded and
    the cameras started: the daemon is ready then, with nothing to poll."""
    if isinstance(config, Config):
        path.write_text(config.model_dump_json())
    elif config is not None:
        path.write_text(config)
    if running is None:
        running = config.model_copy(deep=True) if isinstance(config, Config) else load_config(path)
    daemon = Daemon(running, config_path=path)
    try:
        daemon.start()
        yield FileDaemon(daemon, path)
    except Exception:
        # Beside the daemon's own log lines in the failed test's captured log.
        log.error("the daemon's health when the test failed: %s", _health(daemon))
        raise
    finally:
        daemon.stop()


def _health(daemon: Daemon) -> object:
    try:
        return daemon.health()
    except Exception as exc:  # noqa: BLE001 - a report on a failure must not raise one of its own
        return f"unreadable ({exc!r})"
