"""core/http.py's request against a raw server on loopback: a failed request leaves no descriptor of its
connection open. Before: after a failure once the response had begun (an HTTP error, a deadline in the
body) the response's file kept the socket's descriptor open past `sock.close()`, held by the
exception's traceback until the garbage collector ran; a collection in a later test raised its
ResourceWarning there (tests/ota's first runner test errored at setup, two runs side by side)."""

from __future__ import annotations

import gc
import os
import socket
import threading
from collections.abc import Iterator

import pytest

from edge_runtime.core import http
from edge_runtime.core.http import HttpFailure, request


class OneAnswer:
    """Accepts one connection, reads the request head, sends `answer`, then holds the connection open
    until the client closes it (or 5 s pass)."""

    def __init__(self, answer: bytes) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.answer = answer
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.settimeout(5)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            conn.sendall(self.answer)
            try:
                while conn.recv(4096):
                    pass
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()
        self.thread.join(10)


def our_sockets_to(port: int) -> list[str]:
    """This process's descriptors whose TCP connection goes to 127.0.0.1:`port` (from /proc)."""
    ours: dict[str, str] = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            ours[os.readlink(f"/proc/self/fd/{fd}")] = fd
        except OSError:
            continue  # the listing's own descriptor, gone already
    found = []
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if int(fields[2].split(":")[1], 16) == port and f"socket:[{fields[9]}]" in ours:
                found.append(ours[f"socket:[{fields[9]}]"])
    return found


@pytest.fixture
def no_collector() -> Iterator[None]:
    """The garbage collector off: what the code leaves open stays open where the test can see it."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_request_refused_with_an_http_error_leaves_no_descriptor_of_its_connection_open(no_collector: None) -> None:
    server = OneAnswer(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy")
    try:
        with pytest.raises(HttpFailure, match="HTTP 503: busy") as failure:
            request("GET", f"http://127.0.0.1:{server.port}/x", timeout_s=5, limit=1000)
        assert our_sockets_to(server.port) == [], "the connection's descriptor is still open"
        assert failure.value.retry and failure.value.status == 503
    finally:
        server.close()


def test_a_request_whose_body_times_out_leaves_no_descriptor_of_its_connection_open(
        no_collector: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The body stops coming: the read's socket timeout ends it. (At the deadline the watchdog's shutdown
    usually ends it first, which http.client takes for the end of the body and closes; which of the two
    comes first is a race, so the watchdog is held back here to make the timeout's path the one taken.)"""
    arm = http._WATCHDOG.arm
    monkeypatch.setattr(http._WATCHDOG, "arm", lambda sock, deadline: arm(sock, deadline + 30))
    server = OneAnswer(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nx")
    try:
        with pytest.raises(HttpFailure, match=r"no complete answer within 0\.5 s") as failure:
            request("GET", f"http://127.0.0.1:{server.port}/x", timeout_s=0.5, limit=1000)
        assert our_sockets_to(server.port) == [], "the connection's descriptor is still open"
        assert failure.value.timed_out
    finally:
        server.close()


@pytest.mark.parametrize("address, local", [
    ("127.0.0.1", True), ("127.200.0.9", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("169.254.169.254", True), ("fe80::1%eth0", True), ("0.0.0.0", True), ("::", True), ("224.0.0.1", True),
    ("240.0.0.1", True), ("10.1.2.3", False), ("192.168.0.20", False), ("93.184.215.14", False),
    ("2001:db8::5", False), ("::ffff:10.0.0.7", False),
])
def test_local_addresses_are_those_of_the_device_and_its_link(address: str, local: bool) -> None:
    assert http.is_local_address(address) is local


def test_a_redirect_to_a_local_address_is_refused_before_connecting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check runs on every hop's resolved addresses: the first hop (allowed here by treating only
    127.0.0.2 as local) redirects to 127.0.0.2, which is never connected to."""
    target = socket.create_server(("127.0.0.2", 0))
    target.settimeout(0.5)
    port = target.getsockname()[1]
    first = OneAnswer(f"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.2:{port}/x\r\nContent-Length: 0\r\n\r\n"
                      .encode())
    monkeypatch.setattr(http, "is_local_address", lambda text: text == "127.0.0.2")
    try:
        with pytest.raises(HttpFailure, match="destination not allowed"):
            request("GET", f"http://127.0.0.1:{first.port}/", timeout_s=5, limit=100, follow_redirects=True,
                    local_ok=False)
        with pytest.raises(TimeoutError):
            target.accept()  # nothing connected
    finally:
        first.close()
        target.close()
