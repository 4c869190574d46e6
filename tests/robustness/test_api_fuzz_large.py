"""The large schemathesis run (`make test-robustness`): thousands of requests, none answered >= 500."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the shared test helpers

from tests.support.fuzzing import fuzz_live_daemon

pytestmark = pytest.mark.robustness


def test_fuzzing_thousands_of_requests_gets_no_server_error(tmp_path: Path) -> None:
    requests_made, statuses, log = fuzz_live_daemon(tmp_path, examples=150)
    server_errors = sum(n for status, n in statuses.items() if status >= 500)
    print(f"\nschemathesis: {requests_made} requests, {server_errors} responses >= 500, {dict(statuses)}")
    assert requests_made >= 2000 and server_errors == 0, (tmp_path / "schemathesis.out").read_text()[-3000:]
    assert "Traceback" not in log
