"""`api.token` must be a token an HTTP client can send: printable ASCII without spaces. A token with a
space, a control character or a non-ASCII letter was taken (at start and by a reload) and then matched
no request: header values are latin-1 and trimmed, so curl's UTF-8 `Bearer 短` read as mojibake and
Python's http.client could not send it at all; every write (with `auth: all`, every read) was locked
out until the file was fixed. `''` stays what an unset `${VAR:-}` gives: no token."""

from __future__ import annotations

import json

import pytest

from edge_runtime.config import parse_config
from edge_runtime.core.errors import ConfigError


@pytest.mark.parametrize("bad", [" ", "two words", "sekrit ", "tab\there", "new\nline", "sékrit", "短", "nul\x00"])
def test_a_token_no_client_can_send_is_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"<config>:3: api\.token: .*printable ASCII") as err:
        parse_config(f"device_id: d\napi:\n  token: {json.dumps(bad)}\n")
    secret = bad.strip()
    assert "\n" not in str(err.value) and (not secret or secret not in str(err.value).replace("api.token", ""))


@pytest.mark.parametrize("good", ["sekrit", "A-z0.9_~+/=", "x" * 4096, "!$%&'()*,;:<>?@[]^`{|}"])
def test_tokens_clients_can_send_pass(good: str) -> None:
    cfg = parse_config(f"device_id: d\napi:\n  token: {json.dumps(good)}\n")
    assert cfg.api.token is not None and cfg.api.token.get_secret_value() == good


def test_an_empty_token_is_still_no_token() -> None:
    assert parse_config("device_id: d\napi:\n  token: ''\n").api.token is not None  # the reload guard's "unset"
