"""A bounded schemathesis run (a few hundred requests) in `make test`; the large one is in tests/robustness."""

from __future__ import annotations

from pathlib import Path

from tests.support.fuzzing import fuzz_live_daemon


def test_fuzzing_the_openapi_document_gets_no_server_error(tmp_path: Path) -> None:
    requests_made, statuses, log = fuzz_live_daemon(tmp_path, examples=8)
    server_errors = sum(n for status, n in statuses.items() if status >= 500)
    print(f"\nschemathesis: {requests_made} requests, {server_errors} responses >= 500, {dict(statuses)}")
    assert requests_made >= 200 and server_errors == 0, (tmp_path / "schemathesis.out").read_text()[-3000:]
    assert "Traceback" not in log
