"""The JSON body of a Flask test-client response, for tests that index into it."""

from __future__ import annotations

from typing import Any

from werkzeug.test import TestResponse


def json_of(response: TestResponse) -> Any:
    """`response.json`, asserted present: Werkzeug types it optional (None when the body is not JSON)."""
    body = response.json
    assert body is not None, f"not a JSON response: {response.status} {response.get_data(as_text=True)[:200]}"
    return body
