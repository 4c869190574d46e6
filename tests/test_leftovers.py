"""tests/support/leftovers.py, as tests/conftest.py uses it: a test's logging setup does not outlive
the test, and a thread a module leaves running is listed."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

import pytest

from edge_runtime.cli.main import main
from tests.support.leftovers import ThreadLedger


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
