"""What a test leaves behind (tests/conftest.py): threads still running after its module, and the root
logger as it was before each test.

A thread a module started and did not stop keeps running into the next modules: it logs into their
tests (through a handler on a closed capture stream it prints "--- Logging error ---" into the
suite's output), holds ports and files, and a non-daemon one can keep the interpreter from exiting.
The check runs once per module, after its last teardown (its module-scoped fixtures are gone then),
and waits, only when something is left and at most `GRACE_S`, for threads that are ending anyway.
Threads started while a session- or package-scoped fixture is set up (a shared inspector's pools) live
as long as the session and are not counted, nor are the process-wide ones of `PROCESS_THREADS`, nor
those a session- or package-scoped fixture's object starts later, lazily, in some module's test (the
session inspector's sampler pool, started by the first batch that samples on threads): a thread's start
is recorded with the objects whose methods were on the stack, and one of them a session fixture's value
makes the thread the session's.

What is left is listed at the end of the run. A NON-daemon thread of the project's own (started from
edge_runtime code, or running an edge_runtime function) still alive `FAIL_GRACE_S` after the module's
teardown fails the module: its last test errors at teardown, naming the thread and where it was started.
Such a thread is a leak of the code under test (a pool never shut down, a service never stopped), and it
would hold the interpreter's exit. Before failing, it also counts as the session's when the object that
started it is held by a session fixture's value (up to `SESSION_DEPTH` attributes away). Daemon threads
and threads of the tests or libraries are only listed: many are a server fixture's or a library's and
end on their own. `ALLOWED` names the project's non-daemon threads that may outlive a module, each with
its reason (none need it: a full run on 2026-12-05 left no thread of any kind after any module).
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable, Generator
from types import FrameType
from typing import Any

import pytest

GRACE_S = 1.0
FAIL_GRACE_S = 5.0  # a project's non-daemon thread gets this long to end before it fails the module
# One thread for the whole process by design, started by whichever test needs it first: core/http.py's
# deadline watchdog, and tqdm's progress-bar monitor (model conversion and export show progress bars).
PROCESS_THREADS = frozenset({"http-deadline", "tqdm_monitor"})
# The project's non-daemon threads that may outlive the module that started them (name prefix: why).
ALLOWED: dict[str, str] = {}
PROJECT = "edge_runtime"
SESSION_DEPTH = 3  # attributes followed from a session fixture's value to the object that started a thread


class LeftoverError(AssertionError):
    """A test module left a non-daemon thread of the project's own running."""


# ---- where each thread was started ------------------------------------------------------------

_started_by: dict[threading.Thread, tuple[str | None, frozenset[int]]] = {}  # origin, stack's `self` ids
_real_start = threading.Thread.start
_packages: set[str] = set()


def record_thread_starts(package: str) -> None:
    """From now on remember, for each thread started, the innermost frame of `package` on the stack
    ("path:line (function)", None if none) and the ids of the objects whose methods were on it."""
    _packages.add(package)
    if threading.Thread.start is not _real_start:
        return

    def start(self: threading.Thread) -> None:
        _started_by[self] = _origin(sys._getframe(1))
        _real_start(self)

    threading.Thread.start = start  # type: ignore[method-assign]


def _in_package(filename: str, module: str | None) -> bool:
    return any(module == p or (module or "").startswith(p + ".") or f"/{p}/" in filename for p in _packages)


def _origin(frame: FrameType | None) -> tuple[str | None, frozenset[int]]:
    origin, owners = None, set()
    while frame is not None:
        if origin is None and _in_package(frame.f_code.co_filename, frame.f_globals.get("__name__")):
            path = frame.f_code.co_filename
            path = path[path.rfind(f"/{frame.f_globals['__name__'].split('.')[0]}/") + 1:]
            origin = f"{path}:{frame.f_lineno} ({frame.f_code.co_name})"
        owner = frame.f_locals.get("self")
        if owner is not None:
            owners.add(id(owner))
        frame = frame.f_back
    return origin, frozenset(owners)


def project_origin(thread: threading.Thread) -> str | None:
    """Where the project started `thread` (or the project function it runs); None: not the project's."""
    origin = _started_by.get(thread, (None, frozenset()))[0]
    if origin is not None:
        return origin
    target = getattr(thread, "_target", None)
    run = target if target is not None else type(thread).run
    module = getattr(run, "__module__", None)
    if _in_package(getattr(getattr(run, "__code__", None), "co_filename", ""), module):
        return f"{module}.{getattr(run, '__qualname__', '?')}"
    return None


# ---- the ledger -----------------------------------------------------------------------------

class ThreadLedger:
    """The threads alive when the current module started, and those owned by the session."""

    def __init__(self) -> None:
        self.module: str | None = None  # the module's node id (its path under the rootdir)
        self.at_module_start: set[threading.Thread] = set()
        self.session_owned: set[threading.Thread] = set()
        self.session_objects: list[Callable[[], object]] = []  # session- and package-scoped fixtures' values
        self.reported: list[str] = []

    def module_starts(self, module: str) -> None:
        self.module = module
        self.at_module_start = set(threading.enumerate())
        self.session_owned = {t for t in self.session_owned if t.is_alive()}

    def add_session_object(self, value: object) -> None:
        """A session fixture's value: held weakly where it can be (it is known by id while it lives)."""
        try:
            ref: Callable[[], object] = weakref.ref(value)
        except TypeError:  # not weakly referable: held here, so its id stays its own
            ref = functools.partial(_same, value)
        self.session_objects.append(ref)

    def session_values(self) -> list[object]:
        return [v for ref in self.session_objects if (v := ref()) is not None]

    def owned_by_session(self, thread: threading.Thread, depth: int = 0) -> bool:
        """Started while a session fixture was set up, or from a method of a session fixture's value or,
        with `depth`, of an object that value holds through up to `depth` attributes (its language model,
        that model's sampler...)."""
        if thread in self.session_owned:
            return True
        owners = _started_by.get(thread, (None, frozenset()))[1]
        if not owners:
            return False
        level, seen = self.session_values(), set[int]()
        for _ in range(depth + 1):
            if any(id(v) in owners for v in level):
                return True
            seen.update(id(v) for v in level)
            level = [a for v in level if isinstance(getattr(v, "__dict__", None), dict) for a in vars(v).values()
                     if id(a) not in seen and isinstance(getattr(a, "__dict__", None), dict)
                     and not isinstance(a, (type, types.ModuleType, types.FunctionType))]
        return False

    def left_running(self, grace_s: float = GRACE_S) -> list[threading.Thread]:
        """Threads started since `module_starts()` and still alive after up to `grace_s` seconds."""
        def left() -> list[threading.Thread]:
            return [t for t in threading.enumerate()
                    if t not in self.at_module_start and t.is_alive() and t.name not in PROCESS_THREADS
                    and not self.owned_by_session(t)]
        deadline = time.monotonic() + grace_s
        while (threads := left()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return threads

    def module_ends(self, grace_s: float = GRACE_S) -> list[threading.Thread]:
        threads = self.left_running(grace_s)
        if threads:
            self.reported.append(f"{self.module}: {describe(threads)}")
        return threads

    def offenders(self, threads: list[threading.Thread], grace_s: float = FAIL_GRACE_S) -> list[threading.Thread]:
        """Of `threads` (left running), the project's non-daemon ones not in `ALLOWED`, still alive after up
        to `grace_s` seconds more (a thread that is ending anyway, slowly, is not a leak)."""
        def bad() -> list[threading.Thread]:
            return [t for t in threads if t.is_alive() and not t.daemon and project_origin(t) is not None
                    and not any(t.name.startswith(prefix) for prefix in ALLOWED)
                    and not self.owned_by_session(t, depth=SESSION_DEPTH)]
        deadline = time.monotonic() + grace_s
        while (found := bad()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return found


def _same(value: object) -> object:
    return value


def describe(threads: list[threading.Thread]) -> str:
    return ", ".join(sorted(f"{t.name} ({'daemon' if t.daemon else 'non-daemon'})" for t in threads))


class LeftoverThreads:
    """The pytest plugin (tests/conftest.py registers it): the ledger around each module, an error at the
    teardown of a module's last test when it leaves a project's non-daemon thread, the list at the end."""

    def __init__(self, package: str = PROJECT, grace_s: float = GRACE_S, fail_grace_s: float = FAIL_GRACE_S) -> None:
        record_thread_starts(package)
        self.ledger = ThreadLedger()
        self.grace_s = grace_s
        self.fail_grace_s = fail_grace_s
        self.last_module: str | None = None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
        """After the module's last teardown (its module-scoped fixtures are gone): what it left running."""
        result = yield
        module = item.nodeid.split("::")[0]
        if nextitem is not None and nextitem.nodeid.split("::")[0] == module:
            return result
        if self.ledger.module != module:  # a module whose setup failed before the first test ran
            return result
        left = self.ledger.module_ends(self.grace_s)
        self.ledger.module = None  # checked once
        if bad := self.ledger.offenders(left, self.fail_grace_s):
            raise LeftoverError(
                f"{module} left non-daemon {PROJECT if _packages == {PROJECT} else '/'.join(sorted(_packages))} "
                f"thread(s) running after its fixtures were torn down (stop or shut down what started them, or "
                f"add them to ALLOWED in tests/support/leftovers.py with the reason): "
                + "; ".join(f"{t.name}, started at {project_origin(t)}" for t in sorted(bad, key=lambda t: t.name)))
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
        module = item.nodeid.split("::")[0]
        if self.ledger.module != module and module != self.last_module:
            self.ledger.module_starts(module)  # before its first setup: its module-scoped fixtures count
        self.last_module = module
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any]) -> Generator[None, Any, Any]:
        """Threads a session- or package-scoped fixture starts live as long as the session: not a module's,
        nor those its value starts later."""
        before = set(threading.enumerate()) if fixturedef.scope in ("session", "package") else None
        value = yield
        if before is not None:
            self.ledger.session_owned.update(t for t in threading.enumerate() if t not in before)
            self.ledger.add_session_object(value)
        return value

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.ledger.reported:
            terminalreporter.section("threads left running after their test module (tests/support/leftovers.py)")
            for line in self.ledger.reported:
                terminalreporter.line(line)


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

