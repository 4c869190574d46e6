"""OPC UA logins: wrong passwords are rate-limited per user (scrypt is expensive), and a flood of them
for the PLC's user name never locks the real PLC out: its password, once it logged in, is recognised
without scrypt. Before, one global window of 5 failures a second refused every login, the PLC's
included, for as long as anyone kept guessing."""

from __future__ import annotations

from edge_runtime.config.line_protocols import OpcUaUser
from edge_runtime.lineio.opcua.pki import ConfiguredUsers
from edge_runtime.lineio.passwords import hash_password


def users() -> ConfiguredUsers:
    return ConfiguredUsers([OpcUaUser(name="plc", password_hash=hash_password("line-7-secret")),
                            OpcUaUser(name="qa", password_hash=hash_password("qa-secret"))], anonymous=False)


def test_a_guessing_flood_does_not_lock_out_the_plc_that_already_logged_in() -> None:
    u = users()
    assert u.get_user(None, "plc", "line-7-secret") is not None
    for i in range(50):
        assert u.get_user(None, "plc", f"guess-{i}") is None
    assert u.get_user(None, "plc", "line-7-secret") is not None  # recognised, no scrypt, no limit
    assert u.get_user(None, "qa", "qa-secret") is not None  # another user's window is its own


def test_wrong_passwords_are_limited_per_user_and_never_accepted() -> None:
    u = users()
    for i in range(20):
        assert u.get_user(None, "qa", f"guess-{i}") is None
    assert u.refused == 20
    assert u.get_user(None, "nobody", "x") is None and u.get_user(None, None, None) is None  # no anonymous
    assert u.get_user(None, "plc", "line-7-secret") is not None  # qa's guesses cost plc nothing
