"""The OPC UA server's security: its own certificate (made on first start with `cryptography`), a
trust list of client certificates, and users checked against scrypt hashes.

asyncua's defaults accept every security policy and every client certificate; this module is what
replaces them (FACTS.md). A client certificate is trusted only when the same certificate (by SHA-256)
lies in `trusted/`; a refused one is copied to `rejected/` so an operator can move it over by hand,
the way OPC UA's own PKI folders work.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import ipaddress
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from asyncua import ua
from asyncua.common.utils import ServiceError
from asyncua.crypto.permission_rules import User, UserRole
from asyncua.server.user_managers import UserManager
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from edge_runtime.config.line_protocols import OpcUaUser
from edge_runtime.lineio.passwords import verify_password

log = logging.getLogger(__name__)
MAX_REJECTED = 128  # refused certificates kept for the operator; more are counted, not written
MAX_TRUSTED_FILES = 1024
FAILED_LOGINS_PER_S = 5  # beyond this, logins are refused without hashing (a spray cannot eat the CPU)


def ensure_server_certificate(pki: Path, application_uri: str, hostname: str | None = None) -> tuple[Path, Path]:
    """own/cert.der and own/key.pem under `pki`, made once (RSA 2048, SHA-256, 5 years)."""
    own = pki / "own"
    cert_path, key_path = own / "cert.der", own / "key.pem"
    for sub in ("own", "trusted", "rejected"):
        (pki / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
    if cert_path.exists() and key_path.exists():
        cert = x509.load_der_x509_certificate(cert_path.read_bytes())
        uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
            .get_values_for_type(x509.UniformResourceIdentifier)
        if application_uri in uris and cert.not_valid_after_utc > dt.datetime.now(dt.timezone.utc):
            return cert_path, key_path
        log.warning("opcua: the server certificate is expired or names another application URI; making a new one")
    host = hostname or socket.gethostname()
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"edge-runtime@{host}"[:64]),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "edge-runtime")])
    now = dt.datetime.now(dt.timezone.utc)
    alt: list[x509.GeneralName] = [x509.UniformResourceIdentifier(application_uri), x509.DNSName(host),
                                   x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=5 * 365))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=True, key_encipherment=True,
                                         data_encipherment=True, key_agreement=False, key_cert_sign=True,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                  serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.DER))
    log.info("opcua: made the server certificate %s (application URI %s)", cert_path, application_uri)
    return cert_path, key_path


def fingerprint(cert: x509.Certificate) -> str:
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


class TrustList:
    """The certificate validator asyncua calls for every secure channel: trusted/ by exact certificate,
    inside its validity, naming the client's application URI."""

    def __init__(self, pki: Path) -> None:
        self.trusted_dir, self.rejected_dir = pki / "trusted", pki / "rejected"
        self._lock = threading.Lock()
        self._cache: tuple[float, set[str]] | None = None
        self.refused = 0

    def trusted(self) -> set[str]:
        """Fingerprints of trusted/ (re-read when the folder changes: no restart to trust a PLC)."""
        with self._lock:
            try:
                mtime = self.trusted_dir.stat().st_mtime
            except OSError:
                return set()
            if self._cache is not None and self._cache[0] == mtime:
                return self._cache[1]
            prints: set[str] = set()
            for path in sorted(self.trusted_dir.iterdir())[:MAX_TRUSTED_FILES]:
                cert = _load(path)
                if cert is not None:
                    prints.add(fingerprint(cert))
            self._cache = (mtime, prints)
            return prints

    def verdict(self, cert: x509.Certificate) -> tuple[int, str] | None:
        """Why `cert` is refused (status code, reason), or None: inside its validity and in trusted/."""
        now = dt.datetime.now(dt.timezone.utc)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            return ua.StatusCodes.BadCertificateTimeInvalid, "outside its validity"
        if fingerprint(cert) not in self.trusted():
            return ua.StatusCodes.BadCertificateUntrusted, "not in the trust list"
        return None

    async def __call__(self, cert: x509.Certificate, app: ua.ApplicationDescription) -> None:
        """asyncua's validator, at CreateSession: the channel's checks again, and the application URI."""
        problem = self.verdict(cert)
        if problem is None:
            try:
                uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
                    .get_values_for_type(x509.UniformResourceIdentifier)
            except x509.ExtensionNotFound:
                uris = []
            if app.ApplicationUri not in uris:
                problem = (ua.StatusCodes.BadCertificateUriInvalid,
                           f"does not name the client's application URI {str(app.ApplicationUri)[:200]!r}")
        if problem is not None:
            raise CertificateRefused(problem[0], self.refuse(cert, problem[1]))

    def refuse(self, cert: x509.Certificate, why: str) -> str:
        """Count a refused certificate, keep a copy in rejected/; returns the line for the log (the caller
        logs it with the peer's address)."""
        self.refused += 1
        print_ = fingerprint(cert)
        try:
            target = self.rejected_dir / f"{print_[:40]}.der"
            if not target.exists() and len(os.listdir(self.rejected_dir)) < MAX_REJECTED:
                target.write_bytes(cert.public_bytes(serialization.Encoding.DER))
        except OSError as exc:
            log.warning("opcua: could not keep the refused certificate: %s", exc)
        return (f"client certificate {print_[:16]} ({_subject(cert)}) {why}; to trust it, move it from "
                f"{self.rejected_dir} to {self.trusted_dir}")


class CertificateRefused(ServiceError):
    """A refused client certificate: the status code for the client and the reason for the log."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(code)
        self.why = why


def _load(path: Path) -> x509.Certificate | None:
    try:
        data = path.read_bytes() if path.is_file() and path.stat().st_size < 64 * 1024 else b""
        if not data:
            return None
        if data.lstrip().startswith(b"-----BEGIN"):
            return x509.load_pem_x509_certificate(data)
        return x509.load_der_x509_certificate(data)
    except (OSError, ValueError):
        log.warning("opcua: %s in the trust list is not a certificate; ignored", path)
        return None


def _subject(cert: x509.Certificate) -> str:
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(cn[0].value)[:64] if cn else "no CN"


class ConfiguredUsers(UserManager):
    """Users from the config (scrypt hashes); anonymous only when configured. Password checks
    (scrypt) are rate-limited per user so guessing costs the daemon little; a password that already
    logged in this process is recognised by a keyed digest without scrypt and without the limit, so a
    flood of wrong passwords for `plc` never locks the real PLC out of its next session."""

    def __init__(self, users: list[OpcUaUser], anonymous: bool) -> None:
        self._users = {u.name: u.password_hash for u in users}
        self._anonymous = anonymous
        self._failures: dict[str, list[float]] = {}  # per configured user: bounded by the config
        self._key = os.urandom(32)  # per process: the digests below are worthless outside it
        self._known: dict[str, bytes] = {}  # user -> keyed digest of the password that last logged in
        self.refused = 0

    def get_user(self, iserver: Any, username: str | None = None, password: str | None = None,
                 certificate: Any = None) -> User | None:
        if username is None and password is None and certificate is None:
            return User(role=UserRole.User, name="anonymous") if self._anonymous else self._no()
        if username is None or password is None or username not in self._users:
            return self._no()
        digest = hmac.new(self._key, password.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()
        if hmac.compare_digest(self._known.get(username, b""), digest):
            return User(role=UserRole.User, name=username)
        now = time.monotonic()
        failures = self._failures[username] = [t for t in self._failures.get(username, []) if now - t < 1.0]
        if len(failures) >= FAILED_LOGINS_PER_S:
            return self._no(hashed=False)
        if not verify_password(password, self._users[username]):
            failures.append(now)
            return self._no()
        self._known[username] = digest
        return User(role=UserRole.User, name=username)

    def _no(self, hashed: bool = True) -> User | None:
        self.refused += 1
        return None
