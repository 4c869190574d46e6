"""tests/support/leftovers.py, as tests/conftest.py uses it: a test's logging setup does not outlive
the test, and a thread a module leaves running is listed."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from edge_runtime.cli.main import main
from tests.support.leftovers import ThreadLedger

ROOT = Path(__file__).resolve().parents[1]


def test_the_cli_sets_up_logging_on_the_stderr_of_the_moment(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """In a test that stream is capsys's, closed when the test ends (the next test sees to that)."""
    assert main(["eval", "/nonexistent/ds", "--data-dir", str(tmp_path)]) == 2
    assert "no such dataset" in capsys.readouterr().err
    streams = [getattr(h, "stream", None) for h in logging.getLogger().handlers]
    assert sys.stderr in streams


def test_no_root_handler_writes_to_a_closed_stream() -> None:
    """Runs after the test above (file order): its handler on capsys's stream is gone with it. Without
    that, every later record from any thread printed "--- Logging error --- ... I/O operation on closed
    file" into the suite's output."""
    closed = [h for h in logging.getLogger().handlers if getattr(getattr(h, "stream", None), "closed", False)]
    assert closed == []


def test_a_thread_left_running_is_listed_and_one_that_ends_within_the_grace_is_not() -> None:
    ledger = ThreadLedger()
    ledger.module_starts("tests/x.py")
    stop, quick = threading.Event(), threading.Event()
    left = threading.Thread(target=stop.wait, name="left-running", daemon=True)
    ending = threading.Thread(target=lambda: quick.wait(5), name="ending")
    left.start()
    ending.start()
    threading.Timer(0.1, quick.set).start()
    try:
        assert ledger.module_ends(grace_s=1.0) == [left]
        assert ledger.reported == ["tests/x.py: left-running (daemon)"]
    finally:
        stop.set()
        quick.set()
        left.join(5)
        ending.join(5)


INNER_PACKAGE = '''
import threading
from concurrent.futures import ThreadPoolExecutor

RELEASE = threading.Event()


def leak_pool(name):
    pool = ThreadPoolExecutor(1, thread_name_prefix=name)  # never shut down: a non-daemon worker
    pool.submit(RELEASE.wait)
    return pool


def leak_daemon():
    threading.Thread(target=RELEASE.wait, name="leaky-daemon", daemon=True).start()


class Part:
    def use(self):
        self.pool = leak_pool("shared-part")  # a pool of an object the session's object holds


class Shared:
    def __init__(self):
        self.part = Part()

    def use(self):
        self.pool = leak_pool("shared-lazy")  # a session object's pool, started by its first user
'''

INNER_CONFTEST = '''
import pytest
import leakypkg
from tests.support.leftovers import LeftoverThreads


def pytest_configure(config):
    config.pluginmanager.register(LeftoverThreads("leakypkg", grace_s=0.2, fail_grace_s=0.5), "leftover-threads")


def pytest_unconfigure(config):
    leakypkg.RELEASE.set()  # the interpreter joins non-daemon pool workers at exit


@pytest.fixture(scope="session")
def shared():
    return leakypkg.Shared()
'''

INNER_TESTS = {
    "test_a_leaks.py": "import leakypkg\n\ndef test_one():\n    leakypkg.leak_pool('leaky-pool')\n\n"
                       "def test_two():\n    pass\n",
    "test_b_clean.py": "def test_clean():\n    pass\n",  # runs while test_a's worker still does
    "test_c_daemon.py": "import leakypkg\n\ndef test_daemon():\n    leakypkg.leak_daemon()\n",
    "test_d_session.py": "def test_lazy(shared):\n    shared.use()\n    shared.part.use()\n",
    "test_e_own.py": "import threading\n\nstop = threading.Event()\n\ndef test_own():\n"
                     "    threading.Thread(target=stop.wait, args=(2,), name='tests-own').start()\n",
    "test_f_module_fixture.py": "import pytest\nimport leakypkg\n\n@pytest.fixture(scope='module')\n"
                                "def service():\n    pool = leakypkg.leak_pool('module-fixture')\n    yield pool\n"
                                "    pool.shutdown(wait=False)\n    leakypkg.RELEASE.set()\n\n"
                                "def test_uses(service):\n    pass\n",
}


def test_a_module_leaving_a_non_daemon_project_thread_errors_at_its_own_teardown(tmp_path: Path) -> None:
    """A real pytest run with the plugin (for a stand-in package): only the module that started the
    project's non-daemon thread errors, at its last test's teardown, naming the thread and where it
    started; the next module (the thread still runs then) passes; a daemon thread, a thread of the tests
    and a lazily started pool of a session fixture's object (or of an object it holds) are not failures;
    a thread stopped by a module fixture's teardown is not one either."""
    (tmp_path / "leakypkg").mkdir()
    (tmp_path / "leakypkg" / "__init__.py").write_text(INNER_PACKAGE)
    (tmp_path / "conftest.py").write_text(INNER_CONFTEST)
    for name, text in INNER_TESTS.items():
        (tmp_path / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "7 passed, 1 error" in out, out
    errors = [line for line in out.splitlines() if line.startswith("ERROR ")]
    assert len(errors) == 1 and errors[0].startswith("ERROR test_a_leaks.py::test_two - "), errors
    assert "LeftoverError: test_a_leaks.py left non-daemon leakypkg thread(s) running after its fixtures were " \
           "torn down" in out, out
    assert "leaky-pool_0, started at leakypkg/__init__.py:10 (leak_pool)" in out, out
    listed = out[out.index("threads left running after their test module"):out.index("short test summary info")]
    assert "test_a_leaks.py: leaky-pool_0 (non-daemon)" in listed
    assert "test_c_daemon.py: leaky-daemon (daemon)" in listed
    assert "test_e_own.py: tests-own (non-daemon)" in listed
    assert "test_d_session.py: shared-part_0 (non-daemon)" in listed  # listed, not failed
    assert "shared-lazy" not in listed and "module-fixture" not in listed and "test_b_clean" not in listed, listed
