"""A real HTTP MJPEG camera (multipart/x-mixed-replace) on loopback that tests can stop and restart."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import cv2
import numpy as np


class MjpegCamera:
    def __init__(self, fps: float = 20, port: int = 0) -> None:
        self.fps = fps
        self.port = port or free_port()
        self.frames_sent = 0
        self._server: ThreadingHTTPServer | None = None
        self._stop = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/stream.mjpg"

    def start(self) -> MjpegCamera:
        camera = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
                self.end_headers()
                i = 0
                try:
                    while not camera._stop.is_set():
                        img = np.full((120, 160, 3), (i * 7) % 255, np.uint8)
                        cv2.circle(img, (20 + (i * 5) % 120, 60), 15, (255, 255, 255), -1)
                        jpg = cv2.imencode(".jpg", img)[1].tobytes()
                        self.wfile.write(b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: "
                                         + str(len(jpg)).encode() + b"\r\n\r\n" + jpg + b"\r\n")
                        camera.frames_sent += 1
                        i += 1
                        time.sleep(1 / camera.fps)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self._stop.clear()
        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
