"""A real `lingstream serve` subprocess for the tests that need one (fake workers through the test-only hook)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
STARTUP_DEADLINE_S = 60.0


def lingstream() -> list[str]:
    script = shutil.which("lingstream", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "service.cli"]


def run_lingstream(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """`lingstream ARGS...` to completion from the repository root, its output captured as text (not checked)."""
    return subprocess.run(
        [*lingstream(), *args],
        cwd=ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("LINGSTREAM_", "LIVEKIT_", "OTEL_"))}
    env.update({"LINGSTREAM_TEST_HOOKS": "1", "PYTHONPATH": str(ROOT), "LINGSTREAM_LOG_FORMAT": "json"})
    env.update(extra)
    return env


@dataclass
class Replica:
    """A replica `spawn_replica` started, by the name it was given (its `LINGSTREAM_REPLICA_ID`)."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


OWN_URL = "http://127.0.0.1:{port}"
"""`spawn_replica(..., LINGSTREAM_REPLICA_URL=OWN_URL)`: the replica advertises its own loopback address to the
others (they forward its sessions' transport routes to it)."""


def spawn_replica(
    log: Path,
    *,
    redis_url: str,
    replica_id: str,
    worker_factory: str | None = "tests.support.fakes.world:paced_fake_workers",
    **settings: str,
) -> tuple[subprocess.Popen[bytes], int]:
    """A `lingstream serve` replica on the Redis backend with one paced fake-world slot (`worker_factory` None: the
    service's own workers, the reference model by default), its output in `log`, not waited for; `settings` add to
    or override its environment (`LINGSTREAM_REPLICA_TTL=...`; `LINGSTREAM_REPLICA_URL=OWN_URL`, the replica's
    address for the others, its own port filled in). Returns it and its port."""
    port = free_port()
    defaults = {
        "LINGSTREAM_HOST": "127.0.0.1",
        "LINGSTREAM_ADMISSION_BACKEND": "redis",
        "LINGSTREAM_REDIS_URL": redis_url,
        "LINGSTREAM_REPLICA_ID": replica_id,
        "LINGSTREAM_NUM_WORKERS": "1",
        "LINGSTREAM_MAX_SESSIONS_PER_WORKER": "1",
    }
    if "LINGSTREAM_REPLICA_URL" in settings:
        settings["LINGSTREAM_REPLICA_URL"] = settings["LINGSTREAM_REPLICA_URL"].format(port=port)
    env = environment(**(defaults | settings))
    command = [*lingstream(), "serve", "--port", str(port)]
    if worker_factory is not None:
        command += ["--worker-factory", worker_factory]
    with log.open("wb") as sink:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=sink), port


def wait_until_ready(
    url: str, process: subprocess.Popen[bytes], output: Callable[[], str], *, within_s: float = STARTUP_DEADLINE_S
) -> None:
    """Poll `url`/readyz until 200 (blocking); fails the test with the service's output if it exits first or is not
    ready within `within_s`."""
    deadline = time.monotonic() + within_s
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"lingstream serve exited with {process.returncode}:\n{output()[-4000:]}")
            with contextlib.suppress(httpx.TransportError):
                if client.get(f"{url}/readyz").status_code == 200:
                    return
            time.sleep(0.05)  # polling another process against a deadline
    pytest.fail(f"lingstream serve was not ready in {within_s} s:\n{output()[-4000:]}")


class Served:
    """A running `lingstream serve`; `output()` is everything it wrote (logs go to stderr)."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process = process
        self.port = port
        self.log = log
        self.url = f"http://127.0.0.1:{port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_until_ready(self) -> None:
        wait_until_ready(self.url, self.process, self.output)

    async def wait_ready(self, client: httpx.AsyncClient) -> None:
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"lingstream serve exited with {self.process.returncode}:\n{self.output()}")
            with contextlib.suppress(httpx.TransportError):
                if (await client.get(f"{self.url}/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.05)  # polling another process, with a deadline
        pytest.fail(f"lingstream serve was not ready in {STARTUP_DEADLINE_S} s:\n{self.output()}")


@contextlib.contextmanager
def serve(
    tmp_path: Path, *, factory: str | None = "tests.support.fakes.world:paced_fake_workers", **settings: str
) -> Iterator[Served]:
    """`lingstream serve` on a free loopback port; killed at the end if it is still running."""
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    command = [*lingstream(), "serve", "--port", str(port)]
    if factory is not None:
        command += ["--worker-factory", factory]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd=ROOT, env=environment(**settings), stdout=sink, stderr=sink)
    served = Served(process, port, log)
    try:
        yield served
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
