"""`api.token` must be a token an HTTP client can send and the server can match. Refused: a character
outside latin-1 (waitress decodes header values as latin-1, so curl's UTF-8 `Bearer 短` reads as
mojibake and Python's http.client cannot send it at all), a control character (\r, \n, \t, NUL, DEL:
no header can carry it), leading or trailing whitespace (the HTTP layers strip it, so it never
matches), and more than 4096 characters. Inner spaces and latin-1 letters are sendable and match
(`check_access` and the rails' `bearer()` keep them): "correct horse battery staple" and "sékrit"
worked before 0811b6c refused them, so a device with one no longer started after an upgrade. `''`
stays what an unset `${VAR:-}` gives: no token.

A rails `access.token` is compared with the same header, so the same rule holds there; an empty one
is refused (it would match no request: the rail would silently restrict nobody)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from edge_runtime.api import ApiServer
from edge_runtime.config import Config, parse_config
from edge_runtime.core.errors import ConfigError
from tests.api.test_api_device import MODEL, FakeDevice, _as_device

UNSENDABLE = ["短", "a\nb", " x", "x ", " ", "cr\rhere", "tab\there", "nul\x00", "del\x7f", "c1\x85",
              "nbsp\xa0", "x" * 4097]
SENDABLE = ["sekrit", "correct horse battery staple", "sékrit", "Ünïcødé ñ ß ÿ", "inner\xa0nbsp",
            "A-z0.9_~+/=", "x" * 4096, "!$%&'()*,;:<>?@[]^`{|}"]


def _not_echoed(bad: str, message: str) -> bool:
    secret = bad.strip()
    return "\n" not in message and (len(secret) < 4 or secret not in message)


@pytest.mark.parametrize("bad", UNSENDABLE)
def test_a_token_no_client_can_send_or_match_is_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"<config>:3: api\.token: .*latin-1") as err:
        parse_config(f"device_id: d\napi:\n  token: {json.dumps(bad)}\n")
    assert _not_echoed(bad, str(err.value).replace("api.token", ""))


@pytest.mark.parametrize("good", SENDABLE)
def test_tokens_clients_can_send_pass(good: str) -> None:
    cfg = parse_config(f"device_id: d\napi:\n  token: {json.dumps(good)}\n")
    assert cfg.api.token is not None and cfg.api.token.get_secret_value() == good


def test_an_empty_token_is_still_no_token() -> None:
    assert parse_config("device_id: d\napi:\n  token: ''\n").api.token is not None  # the reload guard's "unset"


def _access(token: str) -> str:
    rail = f"{{name: a, access: {{token: {json.dumps(token)}, schemas: [text]}}}}"
    return f"device_id: d\nrails:\n  input:\n    - {rail}\n"


@pytest.mark.parametrize("bad", UNSENDABLE)
def test_a_rails_access_token_no_client_can_send_or_match_is_refused_naming_the_field(bad: str) -> None:
    # The rail would apply to no request: the caller it was written for would go unrestricted.
    with pytest.raises(ConfigError, match=r"<config>:4: rails\.input\.0\.access\.token: .*latin-1") as err:
        parse_config(_access(bad))
    assert _not_echoed(bad, str(err.value).replace("access.token", ""))


def test_an_empty_rails_access_token_is_refused() -> None:
    # '' (an unset ${VAR:-}) would match no request, unlike a rail without token, which applies to all.
    with pytest.raises(ConfigError, match=r"rails\.input\.0\.access\.token: .*empty"):
        parse_config(_access(""))


@pytest.mark.parametrize("good", SENDABLE)
def test_rails_access_tokens_clients_can_send_pass(good: str) -> None:
    access = parse_config(_access(good)).rails.input[0].access
    assert access is not None and access.token is not None and access.token.get_secret_value() == good


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[FakeDevice, ApiServer]]:
    fake = FakeDevice(tmp_path, MODEL)
    fake.config.api.port, fake.config.api.host = 0, "127.0.0.1"
    server = ApiServer(_as_device(fake), fake.config.api)
    server.start()
    yield fake, server
    server.stop()


@pytest.mark.parametrize("token", ["correct horse battery staple", "sékrit"])
def test_a_token_with_inner_spaces_or_a_latin1_letter_authenticates_through_the_real_server(
        served: tuple[FakeDevice, ApiServer], token: str) -> None:
    # Validated as a config file is (not assigned past the validator), then applied as a reload applies it.
    _, server = served
    cfg = Config.model_validate({"device_id": "fake", "api": {"token": token, "auth": "all"}})
    server.apply(cfg.api)
    url = f"http://127.0.0.1:{server.port}/api/v1/status"
    # requests (http.client) sends a str header value as latin-1; waitress decodes it as latin-1.
    assert requests.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=10).status_code == 200
    assert requests.get(url, headers={"Authorization": f"Bearer {token}x"}, timeout=10).status_code == 401
    assert requests.get(url, headers={"Authorization": f"Bearer {token[:-1]}"}, timeout=10).status_code == 401
    assert requests.get(url, timeout=10).status_code == 401
