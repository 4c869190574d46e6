"""One HTTP(S) request with ONE overall deadline over every phase: name lookup, connect, TLS handshake,
sending the request, the status line and headers, and the body.

A socket timeout (what urllib, http.client, requests and httpx call a timeout) bounds each recv() on
its own, so a server that sends one header byte a second holds a caller for as long as it likes. Here:

- the name lookup runs on a short-lived daemon thread the caller waits for until the deadline
  (getaddrinfo has no timeout of its own); IP literals need none;
- before each phase and each body read the socket timeout is set to the time left, so no single
  call outlives the deadline;
- a watchdog thread shuts the socket down at the deadline (through a duplicate of its descriptor,
  so it can never touch a descriptor that was closed and reused meanwhile): that ends the phases we
  cannot see into, such as http.client's header parsing, which calls recv() once per few bytes.

Every failure is one `HttpFailure` (an OSError) with `retry` set for what may pass (timeouts,
refused or reset connections, 5xx, 429), so callers need one `except`.
"""

from __future__ import annotations

import heapq
import http.client
import ipaddress
import logging
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

MAX_PENDING_LOOKUPS = 8  # name lookups still running (a hung resolver): beyond this, fail at once
MAX_REDIRECTS = 3


class HttpFailure(OSError):
    """The request failed; `retry`: trying again may help; `status`: the HTTP status, if one came."""

    def __init__(self, message: str, retry: bool, status: int | None = None, timed_out: bool = False) -> None:
        super().__init__(message)
        self.retry = retry
        self.status = status
        self.timed_out = timed_out  # the overall deadline passed (a receiver that is slow or drips)

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class Response:
    status: int
    body: bytes  # at most limit + 1 bytes: the caller sees when the answer was larger than its limit
    content_type: str


def request(method: str, url: str, *, timeout_s: float, limit: int, body: bytes | None = None,
            headers: Mapping[str, str] | None = None, follow_redirects: bool = False,
            error_limit: int = 300, local_ok: bool = True) -> Response:
    """`method url` within `timeout_s` in all (redirects included). A 2xx answer: its body up to
    `limit` + 1 bytes. Anything else raises HttpFailure: for HTTP errors with the first `error_limit`
    bytes of the body in the message. `local_ok=False`: a URL (or a redirect) whose host resolves to an
    address of this machine or its link (loopback, link-local, unspecified, multicast, reserved) is
    refused before connecting, checked on the addresses actually connected to (so a DNS answer that
    changes between two lookups cannot slip through). A redirect to another origin (scheme, host, port)
    goes without the Authorization, Proxy-Authorization and Cookie headers."""
    deadline = time.monotonic() + timeout_s
    for _ in range(MAX_REDIRECTS + 1):
        status, location, response = _once(method, url, body, headers or {}, deadline, timeout_s,
                                           limit, error_limit, local_ok)
        if response is not None:
            return response
        if not follow_redirects or location is None:
            raise HttpFailure(f"HTTP {status}: redirect not followed", retry=False, status=status)
        target = urllib.parse.urljoin(url, location)
        if urllib.parse.urlsplit(target).scheme != "https" and urllib.parse.urlsplit(url).scheme == "https":
            raise HttpFailure(f"HTTP {status}: refused redirect from https to {target[:200]}", retry=False,
                              status=status)
        if _origin(target) != _origin(url):  # credentials are for the host they were meant for (as curl does)
            headers = {k: v for k, v in (headers or {}).items() if k.lower() not in _CREDENTIALS}
        url = target
    raise HttpFailure(f"more than {MAX_REDIRECTS} redirects", retry=False)


_CREDENTIALS = ("authorization", "proxy-authorization", "cookie")


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80)


def _once(method: str, url: str, body: bytes | None, headers: Mapping[str, str], deadline: float,
          timeout_s: float, limit: int, error_limit: int,
          local_ok: bool) -> tuple[int, str | None, Response | None]:
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise HttpFailure(f"bad port in {url[:200]}", retry=False) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HttpFailure(f"not an http(s) URL: {url[:200]}", retry=False)
    host = parts.hostname
    port = port or (443 if parts.scheme == "https" else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    phase = "name lookup"
    sock: socket.socket | None = None
    guard: _Guard | None = None
    resp: http.client.HTTPResponse | None = None
    try:
        addresses = _resolve(host, port, deadline)
        if not local_ok:
            _refuse_local(host, addresses)
        phase = "connect"
        sock, guard = _connect(addresses, deadline)
        if parts.scheme == "https":
            phase = "TLS handshake"
            context = ssl.create_default_context()
            sock = context.wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)
            sock.settimeout(_left(deadline))
            sock.do_handshake()
        conn = http.client.HTTPConnection(host, port)
        conn.sock = sock  # http.client sends on this socket; it never connects on its own
        phase = "sending the request"
        sock.settimeout(_left(deadline))
        conn.request(method, target, body=body, headers=dict(headers))
        phase = "the status line and headers"
        sock.settimeout(_left(deadline))
        resp = conn.getresponse()
        if guard.fired:  # http.client takes the end of data for the end of the headers
            raise TimeoutError("deadline passed")
        phase = "the body"
        ok = 200 <= resp.status < 300
        raw = _read(resp, sock, deadline, limit + 1 if ok else error_limit)
        if guard.fired:  # the watchdog's shutdown reads as an end of data: never take it for one
            raise TimeoutError("deadline passed")
        if ok:
            return resp.status, None, Response(resp.status, raw, resp.getheader("Content-Type", "") or "")
        if 300 <= resp.status < 400:
            return resp.status, resp.getheader("Location"), None
        detail = raw.decode("utf-8", "replace").strip()
        raise HttpFailure(f"HTTP {resp.status}: {detail}", retry=resp.status >= 500 or resp.status == 429,
                          status=resp.status)
    except HttpFailure:
        raise
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if (guard is not None and guard.fired) or time.monotonic() >= deadline or isinstance(exc, TimeoutError):
            raise HttpFailure(f"no complete answer within {timeout_s:g} s (stuck in {phase})", retry=True,
                              timed_out=True) from None
        retry = not isinstance(exc, (ssl.SSLCertVerificationError, ValueError))
        raise HttpFailure(f"{phase}: {type(exc).__name__}: {str(exc)[:200]}", retry=retry) from None
    finally:
        if guard is not None:
            guard.disarm()  # before the close: the watchdog never shuts down a socket that is gone
        if resp is not None:
            # The response's file holds the descriptor open past sock.close(); after a failure the
            # traceback keeps the response alive, and only the garbage collector would close it.
            resp.close()
        if sock is not None:
            sock.close()


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left


def _read(resp: http.client.HTTPResponse, sock: socket.socket, deadline: float, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit and not resp.isclosed():  # closed: the whole body came (and the socket is gone)
        sock.settimeout(_left(deadline))
        chunk = resp.read1(min(65536, limit - size))
        if not chunk:
            if resp.length:  # read1 reports an early end of a Content-Length body as a plain end
                raise http.client.IncompleteRead(b"".join(chunks), resp.length)
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def is_local_address(text: str) -> bool:
    """An address that reaches this machine or its own link rather than a server elsewhere (an IPv6
    form of an IPv4 address is judged as that IPv4 address)."""
    ip = ipaddress.ip_address(text.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast or ip.is_reserved


def _refuse_local(host: str, addresses: list[Address]) -> None:
    for *_, address in addresses:
        if is_local_address(address[0]):
            raise HttpFailure(f"destination not allowed: {host[:100]} is an address of this device or its link",
                              retry=False)


# ---- name lookup ------------------------------------------------------------------------------------

_lookups_lock = threading.Lock()
_lookups_pending = 0

Address = tuple[int, int, int, tuple[str, int] | tuple[str, int, int, int]]


def _resolve(host: str, port: int, deadline: float) -> list[Address]:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 0, (host, port) if ip.version == 4 else (host, port, 0, 0))]
    global _lookups_pending
    with _lookups_lock:
        if _lookups_pending >= MAX_PENDING_LOOKUPS:
            raise HttpFailure(f"name lookup: {_lookups_pending} lookups still pending (the resolver hangs)",
                              retry=True)
        _lookups_pending += 1
    done = threading.Event()
    box: dict[str, object] = {}

    def lookup() -> None:
        global _lookups_pending
        try:
            box["result"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc
        finally:
            with _lookups_lock:
                _lookups_pending -= 1
            done.set()

    threading.Thread(target=lookup, name="http-lookup", daemon=True).start()
    if not done.wait(max(0.0, deadline - time.monotonic())):
        raise TimeoutError("name lookup")
    error = box.get("error")
    if isinstance(error, BaseException):
        raise error if isinstance(error, OSError) else OSError(str(error))
    infos = box["result"]
    assert isinstance(infos, list)
    return [(fam, typ, proto, addr) for fam, typ, proto, _name, addr in infos]


def _connect(addresses: list[Address], deadline: float) -> tuple[socket.socket, _Guard]:
    error: OSError | None = None
    for family, type_, proto, address in addresses:
        sock = socket.socket(family, type_, proto)
        guard = _WATCHDOG.arm(sock, deadline)
        try:
            sock.settimeout(_left(deadline))
            sock.connect(address)
            return sock, guard
        except OSError as exc:
            guard.disarm()
            sock.close()
            error = exc
            if isinstance(exc, TimeoutError):
                break
    raise error or OSError("no address to connect to")


# ---- the watchdog -----------------------------------------------------------------------------------


class _Guard:
    """One armed request: a duplicate of its socket's descriptor, shut down at the deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.deadline = deadline
        self._dup: socket.socket | None = sock.dup()
        self._lock = threading.Lock()
        self.fired = False

    def fire(self) -> None:
        with self._lock:
            if self._dup is None:
                return
            self.fired = True
            try:
                self._dup.shutdown(socket.SHUT_RDWR)  # wakes the recv()/send() blocked on the original
            except OSError:
                pass  # not connected yet, or already reset: the socket timeout ends that phase

    def disarm(self) -> None:
        with self._lock:
            if self._dup is not None:
                self._dup.close()
                self._dup = None


class _Watchdog:
    """One daemon thread for every request in the process; restarted if it ever died."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Guard]] = []
        self._seq = 0
        self._thread: threading.Thread | None = None

    def arm(self, sock: socket.socket, deadline: float) -> _Guard:
        guard = _Guard(sock, deadline)
        with self._cond:
            self._seq += 1
            heapq.heappush(self._heap, (deadline, self._seq, guard))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="http-deadline", daemon=True)
                self._thread.start()
            self._cond.notify()
        return guard

    def _run(self) -> None:
        while True:
            try:
                self._step()
            except Exception:  # pragma: no cover - the loop must outlive any one guard
                log.exception("http deadline watchdog: error")
                time.sleep(0.1)

    def _step(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                # Guards disarmed long before their deadline stay in the heap until then; that is
                # bounded by the request rate times timeout_s, and each holds no descriptor.
                if self._heap and self._heap[0][0] <= now:
                    _, _, guard = heapq.heappop(self._heap)
                    break
                self._cond.wait(min(self._heap[0][0] - now, 60.0) if self._heap else 60.0)
        guard.fire()


_WATCHDOG = _Watchdog()
