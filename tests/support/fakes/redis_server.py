"""A real `redis-server` for tests: a throwaway instance on a free loopback port, in a temporary directory.

Not a fake: the admission backend must be tested against Redis's own Lua engine, streams and key expiry. The server
runs without persistence (`--save "" --appendonly no`), so `restart()` starts an empty one on the same port, which
is exactly what a Redis restart without persistence looks like to clients. `stop()` in the middle of a test is an
outage; `restart()` ends it.

Use it through a fixture::

    @pytest.fixture
    def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
        with RedisServer(tmp_path) as server:
            yield server
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import pytest

__all__ = ["REDIS_SERVER", "RedisServer"]

REDIS_SERVER = shutil.which("redis-server")
# The mark of a test module or test that starts a redis-server.
NEEDS_REDIS_SERVER = pytest.mark.skipif(
    REDIS_SERVER is None, reason="redis-server is not on PATH (scripts/setup.sh installs it)"
)
"""The `redis-server` binary on PATH, or None (tests that need it skip with that reason)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One `redis-server` process; `start()`, `stop()` and `restart()` keep the same port. Stops on exit."""

    def __init__(self, directory: Path, *, port: int | None = None) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError("redis-server is not on PATH")
        self.directory = directory
        self.port = port if port is not None else _free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, *, timeout: float = 10.0) -> None:
        """Start the server and wait until it answers PING."""
        if self.running:
            return
        assert REDIS_SERVER is not None
        command = [
            REDIS_SERVER,
            *("--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory)),
            *("--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"),
            *("--logfile", str(self.directory / "redis.log")),
        ]
        self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not _answers_ping(self.port):
            if self._process.poll() is not None:
                log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited with {self._process.returncode}: {log}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout} s")
            time.sleep(0.01)

    def stop(self) -> None:
        """Kill the server (an outage: clients see connection errors) and wait for the process to end."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)

    def restart(self) -> None:
        """Stop it if it runs, then start an empty one on the same port."""
        self.stop()
        self.start()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
