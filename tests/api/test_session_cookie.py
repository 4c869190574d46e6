"""The status page's session cookie (api/auth.py): parsed strictly, bound to the device and to a key
generation that a token rotation ends for good; wrong tokens are rate limited per client address.
Real daemons, real HTTP on 127.0.0.1 (and the Flask app with a remote address for the limiter)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import requests

from edge_runtime.api.auth import FAILURES_BURST, SESSION_COOKIE, FailureLimiter, client_key
from edge_runtime.app.daemon import Daemon
from tests.api.test_http_read_auth import TOKEN, write_config
from tests.support.file_daemon import FileDaemon, daemon_from_file


def start(tmp: Path, demo_dir: Path, device: str) -> AbstractContextManager[FileDaemon]:
    path = tmp / f"{device}.yaml"
    write_config(path, tmp, demo_dir, "all")
    return daemon_from_file(path, path.read_text().split("cameras:")[0]
                            .replace("device_id: locked", f"device_id: {device}")
                            .replace(f"data_dir: {tmp / 'data'}", f"data_dir: {tmp / device}"))


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[tuple[Daemon, Daemon]]:
    tmp = tmp_path_factory.mktemp("sessions")
    with start(tmp, demo_dir, "dev-a") as a, start(tmp, demo_dir, "dev-b") as b:
        yield a.daemon, b.daemon


def base(d: Daemon) -> str:
    assert d.api is not None
    return f"http://127.0.0.1:{d.api.port}"


def sign_in(d: Daemon, token: str = TOKEN) -> str:
    r = requests.post(f"{base(d)}/api/v1/session", headers={"Authorization": f"Bearer {token}"}, timeout=5)
    assert r.status_code == 204, r.text
    return str(r.cookies[SESSION_COOKIE])


def reads(d: Daemon, cookie: str) -> int:
    # The raw header, another cookie after it: no client library re-quotes or strips the value.
    return requests.get(f"{base(d)}/api/v1/status", headers={"Cookie": f"{SESSION_COOKIE}={cookie}; theme=dark"},
                        timeout=5).status_code


def test_only_the_canonical_cookie_form_is_accepted(pair: tuple[Daemon, Daemon]) -> None:
    a, _ = pair
    cookie = sign_in(a)
    assert reads(a, cookie) == 200
    expires, sig = cookie.split(".")
    for bad in (f"0{cookie}", f"00{cookie}", f"+{cookie}", f" {cookie}", f"{cookie} ", f"{cookie}\t", f'"{cookie}"',
                f"{expires}.{sig.upper()}", f"{expires}.{sig}0", f"{expires}..{sig}",
                f"{expires}.{sig[:-1]}\u00b2"):
        assert reads(a, bad) == 401, repr(bad)
    full_width = "".join(chr(0xFF10 + int(c)) for c in expires) + f".{sig}"  # not sendable in a header
    with a.api.app.test_request_context(headers={"Cookie": f"{SESSION_COOKIE}={full_width}"}):  # type: ignore[union-attr]
        from edge_runtime.api.auth import _session_valid
        assert not _session_valid(TOKEN, full_width)


def test_a_cookie_of_one_device_does_not_read_another_with_the_same_token(pair: tuple[Daemon, Daemon]) -> None:
    a, b = pair
    assert reads(a, sign_in(a)) == 200
    assert reads(b, sign_in(a)) == 401
    assert reads(b, sign_in(b)) == 200


def test_rotating_the_token_away_and_back_ends_old_sessions_for_good(pair: tuple[Daemon, Daemon]) -> None:
    a, _ = pair
    assert a.config_path is not None
    path = a.config_path
    original = path.read_text()
    cookie = sign_in(a)
    try:
        path.write_text(original.replace(TOKEN, "rotated-token"))
        a.reload()
        assert requests.get(f"{base(a)}/healthz", timeout=5).status_code == 200  # any request notices it
        assert reads(a, cookie) == 401
    finally:
        path.write_text(original)
        a.reload()
    assert reads(a, cookie) == 401  # the token is back; the session it signed is not
    assert reads(a, sign_in(a)) == 200


def test_wrong_tokens_are_rate_limited_per_client_address(pair: tuple[Daemon, Daemon]) -> None:
    a, _ = pair
    assert a.api is not None
    client = a.api.app.test_client()
    remote = {"REMOTE_ADDR": "192.0.2.77"}
    wrong = {"Authorization": "Bearer wrong"}
    t0 = time.monotonic()
    codes = [client.post("/api/v1/session", headers=wrong, environ_base=remote).status_code for _ in range(60)]
    elapsed = time.monotonic() - t0
    assert codes.count(401) <= FAILURES_BURST + 5 * elapsed + 1, (codes, elapsed)
    limited = client.post("/api/v1/session", headers={"Authorization": f"Bearer {TOKEN}"}, environ_base=remote)
    assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1
    assert limited.json is not None and limited.json["error"]["field"] == "Authorization"
    # The same guess on any other endpoint is limited too; another address and loopback are not.
    assert client.get("/api/v1/status", headers=wrong, environ_base=remote).status_code == 429
    assert client.get("/api/v1/status", headers=wrong, environ_base={"REMOTE_ADDR": "192.0.2.78"}).status_code == 401
    for _ in range(30):
        assert client.get("/api/v1/status", headers=wrong).status_code == 401  # 127.0.0.1
    time.sleep(0.5)  # 5 a second refill: one more attempt is allowed after a short wait
    assert client.post("/api/v1/session", headers={"Authorization": f"Bearer {TOKEN}"},
                       environ_base=remote).status_code == 204


def test_the_failed_attempt_table_is_bounded_and_ipv6_counts_by_64() -> None:
    limiter = FailureLimiter(max_clients=100)
    for i in range(1000):
        limiter.failed(f"10.0.{i // 256}.{i % 256}", now=0.0)
    assert len(limiter) == 100
    assert client_key("2001:db8::1") == client_key("2001:db8::ffff") == "2001:db8::/64"
    assert client_key("::ffff:192.0.2.1") == "192.0.2.1"
    assert client_key("::1") is None and client_key("127.0.0.2") is None
