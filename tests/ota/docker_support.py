"""The Docker engine and the local registry the Docker suites share (`make test-ota`): started here
when none runs, as on a fresh machine, and stopped again."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def docker_socket() -> Path:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return Path(host.removeprefix("unix://"))


def engine_answers(sock: Path) -> bool:
    """GET /_ping over the engine's unix socket, without a docker client.

    A docker client made while no engine answers raises from its constructor and leaves its HTTP
    session for the garbage collector: a ResourceWarning, an error under `filterwarnings = error`.
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(str(sock))
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            status_line = s.recv(64).split(b"\r\n", 1)[0]
            return status_line.startswith(b"HTTP/1.") and b" 200" in status_line
    except OSError:
        return False


@pytest.fixture(scope="session")
def engine() -> Iterator[Any]:
    """The local Docker engine; started (and stopped again) here when none runs, as on a fresh machine."""
    sock, dockerd = docker_socket(), None
    if not engine_answers(sock):
        if os.geteuid() != 0 or not shutil.which("dockerd"):
            pytest.skip("needs root and dockerd")
        # Kept referenced and stopped at the end: an abandoned Popen is a ResourceWarning too.
        dockerd = subprocess.Popen(["dockerd", "--iptables=false", "--bridge=none"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while not engine_answers(sock):
            if dockerd.poll() is not None or time.monotonic() > deadline:
                dockerd.kill()
                dockerd.wait(10)
                pytest.fail(f"dockerd did not start (exit status {dockerd.returncode})")
            time.sleep(0.5)
    import docker

    client = docker.from_env()
    try:
        yield client
    finally:
        client.close()
        if dockerd is not None:
            dockerd.terminate()
            try:
                dockerd.wait(60)
            except subprocess.TimeoutExpired:
                dockerd.kill()
                dockerd.wait(10)


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("registry")
    port = free_port()
    (root / "config.yml").write_text(
        "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: " + str(root / "data") +
        f"\nhttp:\n  addr: 127.0.0.1:{port}\n")
    proc = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(50):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)
