"""`ServerProcess`: a server of the tests' own in a child process (the LiveKit stand-in, a real `livekit-server`).

It is started with its output in a log file, polled until a GET on its ready path answers 200 (failing with the
log's tail if it exits or misses the deadline), and stopped with SIGTERM, then SIGKILL after `timeout`.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

__all__ = ["ServerProcess"]


class ServerProcess:
    """The life of one server process; a subclass builds its command and calls `_launch` from its `__init__`.
    `stop()` (or leaving the `with` block) sends SIGTERM and waits; the exit code is in `returncode`."""

    name: str
    log: Path
    http: str
    process: subprocess.Popen[bytes]
    returncode: int | None
    _client: httpx.Client

    def _launch(
        self,
        name: str,
        command: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        ready_path: str,
        ready_s: float = 30.0,
    ) -> None:
        self.name = name
        with self.log.open("wb") as sink:
            self.process = subprocess.Popen(list(command), cwd=cwd, env=dict(env), stdout=sink, stderr=sink)
        self._client = httpx.Client(base_url=self.http, timeout=10.0)
        self.returncode = None
        self._wait_ready(ready_path, ready_s)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 20.0) -> int:
        self._client.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.returncode = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.returncode = self.process.wait()
        return self.returncode

    def _wait_ready(self, path: str, within: float) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.output()[-3000:]}")
            try:
                if self._client.get(path).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)  # polling another process against a deadline
        self.stop()
        raise RuntimeError(f"{self.name} was not ready in {within} s:\n{self.output()[-3000:]}")
