"""What a test leaves behind (tests/conftest.py): threads still running after its module, and the root
logger as it was before each test.

A thread a module started and did not stop keeps running into the next modules: it logs into their
tests (through a handler on a closed capture stream it prints "--- Logging error ---" into the
suite's output), holds ports and files, and a non-daemon one can keep the interpreter from exiting.
The check runs once per module, after its last teardown (its module-scoped fixtures are gone then),
and waits, only when something is left and at most `GRACE_S`, for threads that are ending anyway.
Threads started while a session- or package-scoped fixture is set up (a shared inspector's pools) live
as long as the session and are not counted, nor are the process-wide ones of `PROCESS_THREADS`. It
lists what it finds at the end of the run; it fails no test (a thread a session-scoped object starts
later, in some module's test, would be listed too).
"""

from __future__ import annotations

import logging
import threading
import time

GRACE_S = 1.0
# One thread for the whole process by design, started by whichever test needs it first: core/http.py's
# deadline watchdog, and tqdm's progress-bar monitor (model conversion and export show progress bars).
PROCESS_THREADS = frozenset({"http-deadline", "tqdm_monitor"})


class ThreadLedger:
    """The threads alive when the current module started, and those owned by the session."""

    def __init__(self) -> None:
        self.module: str | None = None  # the module's node id (its path under the rootdir)
        self.at_module_start: set[threading.Thread] = set()
        self.session_owned: set[threading.Thread] = set()
        self.reported: list[str] = []

    def module_starts(self, module: str) -> None:
        self.module = module
        self.at_module_start = set(threading.enumerate())
        self.session_owned = {t for t in self.session_owned if t.is_alive()}

    def left_running(self, grace_s: float = GRACE_S) -> list[threading.Thread]:
        """Threads started since `module_starts()` and still alive after up to `grace_s` seconds."""
        def left() -> list[threading.Thread]:
            return [t for t in threading.enumerate()
                    if t not in self.at_module_start and t not in self.session_owned and t.is_alive()
                    and t.name not in PROCESS_THREADS]
        deadline = time.monotonic() + grace_s
        while (threads := left()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return threads

    def module_ends(self, grace_s: float = GRACE_S) -> list[threading.Thread]:
        threads = self.left_running(grace_s)
        if threads:
            self.reported.append(f"{self.module}: {describe(threads)}")
        return threads


def describe(threads: list[threading.Thread]) -> str:
    return ", ".join(sorted(f"{t.name} ({'daemon' if t.daemon else 'non-daemon'})" for t in threads))


class RootLogging:
    """The root logger's handlers and level, to put back after a test changed them: the CLI's
    `setup_logging` (`basicConfig(force=True)` on the sys.stderr of the moment, in a test a capture
    stream that pytest closes when the test ends) would otherwise stay on the root logger for the rest
    of the suite, and every later record would print "--- Logging error ---" instead of itself."""

    def __init__(self) -> None:
        root = logging.getLogger()
        self.handlers = list(root.handlers)
        self.level = root.level

    def restore(self) -> None:
        root = logging.getLogger()
        for handler in list(root.handlers):
            if handler not in self.handlers:
                root.removeHandler(handler)
                handler.close()
        for handler in self.handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(self.level)
