"""`api.token` must be a token an HTTP client can send: printable ASCII without spaces. A token with a
space, a control character or a non-ASCII letter was taken (at start and by a reload) and then matched
no request: header values are latin-1 and trimmed, so curl's UTF-8 `Bearer 短` read as mojibake and
Python's http.client could not send it at all; every write (with `auth: all`, every read) was locked
out until the file was fixed. `''` stays what an unset `${VAR:-}` gives: no token.

A rails `access.token` is compared with the same header, so the same rule holds there; an empty one
is refused (it would match no request: the rail would silently restrict nobody)."""

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


def _access(token: str) -> str:
    rail = f"{{name: a, access: {{token: {json.dumps(token)}, schemas: [text]}}}}"
    return f"device_id: d\nrails:\n  input:\n    - {rail}\n"


@pytest.mark.parametrize("bad", [" ", "two words", "sekrit ", "tab\there", "new\nline", "sékrit", "短", "nul\x00"])
def test_a_rails_access_token_no_client_can_send_is_refused_naming_the_field(bad: str) -> None:
    # The rail would apply to no request: the caller it was written for would go unrestricted.
    with pytest.raises(ConfigError, match=r"<config>:4: rails\.input\.0\.access\.token: .*printable ASCII") as err:
        parse_config(_access(bad))
    secret = bad.strip()
    assert "\n" not in str(err.value) and (not secret or secret not in str(err.value).replace("access.token", ""))


def test_an_empty_rails_access_token_is_refused() -> None:
    # '' (an unset ${VAR:-}) would match no request, unlike a rail without token, which applies to all.
    with pytest.raises(ConfigError, match=r"rails\.input\.0\.access\.token: .*empty"):
        parse_config(_access(""))


@pytest.mark.parametrize("good", ["sekrit", "A-z0.9_~+/=", "x" * 4096, "!$%&'()*,;:<>?@[]^`{|}"])
def test_rails_access_tokens_clients_can_send_pass(good: str) -> None:
    access = parse_config(_access(good)).rails.input[0].access
    assert access is not None and access.token is not None and access.token.get_secret_value() == good
