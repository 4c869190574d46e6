"""An HTTP MJPEG camera on loopback that sends a few frames and then goes silent with the connection
open, as a camera whose network or encoder hung: OpenCV's read blocks until FFmpeg's read timeout."""

from __future__ import annotations

import socket
import threading
import time

import cv2
import numpy as np


class StallingMjpeg:
    def __init__(self, frames: int = 5) -> None:
        self.frames = frames
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.lock = threading.Lock()
        self.accepted: list[float] = []  # time.monotonic() of each connection
        self.closed: list[float] = []  # when the client closed it (EOF seen), in the same order
        self.stalled = threading.Event()  # the first connection got its frames and now waits
        self._conns: list[socket.socket] = []
        self._done = threading.Event()
        self._threads = [threading.Thread(target=self._accept, name="stalling-mjpeg", daemon=True)]
        self._threads[0].start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/stream.mjpg"

    def _accept(self) -> None:
        self._listener.settimeout(0.1)
        while not self._done.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self.lock:
                self.accepted.append(time.monotonic())
                self._conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), name="stalling-mjpeg-conn", daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                request += chunk
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: multipart/x-mixed-replace; boundary=frame\r\n\r\n")
            for i in range(self.frames):
                jpg = cv2.imencode(".jpg", np.full((48, 64, 3), 40 * i % 255, np.uint8))[1].tobytes()
                conn.sendall(b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: " + str(len(jpg)).encode()
                             + b"\r\n\r\n" + jpg + b"\r\n")
                time.sleep(0.02)
            self.stalled.set()
            conn.settimeout(0.1)
            while not self._done.is_set():  # silent from here on; watch for the client closing
                try:
                    if not conn.recv(4096):
                        with self.lock:
                            self.closed.append(time.monotonic())
                        return
                except TimeoutError:
                    continue
        except OSError:
            return
        finally:
            conn.close()

    def close(self) -> None:
        self._done.set()
        self._listener.close()
        for t in self._threads:
            t.join(5)
