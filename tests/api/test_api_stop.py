"""ApiServer.stop() ends the server's threads even when waitress's wake-up pipe is already gone.

Seen in a run of tests/api: a daemon's stop logged "stopping ApiServer failed ... pull_trigger ...
OSError: [Errno 9] Bad file descriptor" and the server's eight waitress worker threads ran on for the
rest of the suite (the trigger's descriptor had been closed under the running server)."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import requests

from edge_runtime.api import ApiServer
from tests.api.test_api_device import MODEL, FakeDevice, _as_device


def _server_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t not in before and t.is_alive()]


def _ended_within(before: set[threading.Thread], bound_s: float) -> list[threading.Thread]:
    deadline = time.monotonic() + bound_s
    while (left := _server_threads(before)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_stop_ends_the_loop_and_the_workers(tmp_path: Path) -> None:
    fake = FakeDevice(tmp_path, MODEL)
    fake.config.api.port, fake.config.api.host = 0, "127.0.0.1"
    before = set(threading.enumerate())
    server = ApiServer(_as_device(fake), fake.config.api)
    server.start()
    assert requests.get(f"http://127.0.0.1:{server.port}/", timeout=10).status_code == 200
    assert _server_threads(before)
    server.stop()
    assert _ended_within(before, 10) == []


def test_stop_ends_the_loop_and_the_workers_when_the_wakeup_pipe_is_gone(tmp_path: Path) -> None:
    fake = FakeDevice(tmp_path, MODEL)
    fake.config.api.port, fake.config.api.host = 0, "127.0.0.1"
    before = set(threading.enumerate())
    server = ApiServer(_as_device(fake), fake.config.api)
    server.start()
    waitress = server._server
    assert waitress is not None

    def gone() -> None:  # as os.write() on the closed descriptor answered (not closed here: that number
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))  # may be reused by the time stop() runs)
    waitress.trigger._physical_pull = gone
    try:
        server.stop()
        assert _ended_within(before, 10) == [], "the server's threads ran on after stop()"
    finally:  # without the fix: end them here, or they run on into the next tests
        waitress.task_dispatcher.shutdown(cancel_pending=True, timeout=5)
        for dispatcher in list(waitress._map.values()):
            dispatcher.close()


def test_stop_never_writes_to_a_wakeup_pipe_already_closed(tmp_path: Path) -> None:
    """A loop that is awake already (a worker has just pulled the trigger) runs stop()'s thunk before
    pull_trigger's own write. The thunk used to close the pipe with every other socket, so that write
    found it closed: the EBADF out of stop() in a run of tests/api (test_regions_everywhere.py's daemon),
    and on a descriptor number reused meanwhile, a byte written into some other file."""
    fake = FakeDevice(tmp_path, MODEL)
    fake.config.api.port, fake.config.api.host = 0, "127.0.0.1"
    before = set(threading.enumerate())
    server = ApiServer(_as_device(fake), fake.config.api)
    server.start()
    waitress = server._server
    assert waitress is not None
    trigger, real = waitress.trigger, waitress.trigger._physical_pull
    closed_at_write: list[bool] = []

    def loop_first() -> None:
        if trigger.thunks:  # stop()'s pull: the loop wakes and runs the thunk before this write
            real()
            deadline = time.monotonic() + 5
            while trigger.thunks and time.monotonic() < deadline:
                time.sleep(0.01)
        closed_at_write.append(trigger._closed)
        if trigger._closed:  # what os.write() on the closed descriptor answers (not written: it may be reused)
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        real()
    trigger._physical_pull = loop_first
    try:
        server.stop()
        assert closed_at_write == [False], "stop() wrote to the wake-up pipe after closing it"
        assert _ended_within(before, 10) == []
    finally:
        waitress.task_dispatcher.shutdown(cancel_pending=True, timeout=5)
        for dispatcher in list(waitress._map.values()):
            dispatcher.close()
        trigger.close()
