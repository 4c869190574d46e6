"""A TCP forwarder on loopback whose connections a test can cut (a pulled cable between PLC and device)."""

from __future__ import annotations

import socket
import threading


class CutProxy:
    """Forwards 127.0.0.1:<port> to a target; `cut()` drops every connection and refuses new ones
    until `restore()`."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._stop = False
        self._acceptor = threading.Thread(target=self._accept, name="cut-proxy-accept", daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._open.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        self._open.clear()
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def restore(self) -> None:
        self._open.set()

    def close(self) -> None:
        """Drop every connection and end the accepting thread (closing the listener alone leaves a
        thread blocked in accept() on Linux; shutting it down wakes that accept())."""
        self._stop = True
        self.cut()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self._acceptor.join(5)
