"""Password hashes for line I/O users (OPC UA): scrypt, so the config never holds a plain password.

`python -m edge_runtime.lineio.passwords` reads a password (twice, without echo) and prints the
`password_hash` to put in the config.
"""

from __future__ import annotations

import getpass
import hashlib
import hmac
import os
import sys

N, R, P = 1 << 14, 8, 1  # ~16 MB and ~50 ms on a Jetson core: slow for guessing, fine for a login
MAX_PASSWORD = 256


def hash_password(password: str, n: int = N, r: int = R, p: int = P) -> str:
    salt = os.urandom(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=32)
    return f"scrypt${n}${r}${p}${salt.hex()}${digest.hex()}"


def verify_password(password: str, stored: str) -> bool:
    """Constant-time check; a malformed hash or an absurd cost never matches."""
    try:
        kind, n, r, p, salt, digest = stored.split("$")
        cost = (int(n), int(r), int(p))
    except ValueError:
        return False
    if kind != "scrypt" or len(password) > MAX_PASSWORD or cost[0] > 1 << 20 or cost[1] > 16 or cost[2] > 4:
        return False
    try:
        got = hashlib.scrypt(password.encode(), salt=bytes.fromhex(salt), n=cost[0], r=cost[1], p=cost[2],
                             dklen=32, maxmem=64 * 1024 * 1024)
    except ValueError:
        return False
    return hmac.compare_digest(got.hex(), digest)


def main() -> int:
    first = getpass.getpass("password: ")
    if not first or first != getpass.getpass("again: "):
        print("the passwords were empty or differ", file=sys.stderr)
        return 1
    print(hash_password(first))
    return 0


if __name__ == "__main__":
    sys.exit(main())
