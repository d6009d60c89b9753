"""What the bench scripts share: a `lingstream serve` process on loopback, sums read from /metrics, Jain's fairness
index, and the report every script ends with (a table, then one JSON object as the last line).

Percentiles come from `pipeline.metrics.percentile` (0..100, linear interpolation), the one the service reports
with, so a bench figure and the service's own p95 mean the same thing.

bench/ is a package run from the repository root as `python -m bench.<script>`: `-m` puts the working directory
first on sys.path, which is how a script finds this module and `tests.support` (fake workers, a throwaway
redis-server, an aiortc peer, the browser's flags), which the editable install does not provide. No bench module
edits sys.path (`tests/bench` checks).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

# Debian's Chromium and the flags the browser benches launch it with (Playwright drives it by executable_path): the
# browser tests' own, so that a bench and a test see the page through the same browser.
from tests.support.browser.chromium import CHROMIUM, CHROMIUM_ARGS

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["CHROMIUM", "CHROMIUM_ARGS", "ROOT", "Server", "free_port", "jain", "metric_sum", "report"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Server:
    """A `lingstream serve` subprocess on a free 127.0.0.1 port, started on construction, its output in `log`.

    `settings` are `LINGSTREAM_*` variables; the caller's own `LINGSTREAM_*`, `LIVEKIT_*` and `OTEL_*` variables are
    dropped so that a bench measures what it states, not the shell it runs in. `worker_factory` (a
    `module:function` in `tests.support.fakes.world`) replaces the model workers through the test-only hook. `stop()`
    asks
    for a drain (SIGTERM) and kills the process if it has not exited after `timeout`; leaving the `with` block
    stops it the same way."""

    def __init__(self, log: Path, settings: Mapping[str, str], *, worker_factory: str | None = None) -> None:
        script = shutil.which("lingstream", path=str(Path(sys.executable).parent))
        command = [script] if script else [sys.executable, "-m", "service.cli"]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        command += ["serve", "--host", "127.0.0.1", "--port", str(self.port)]
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("LINGSTREAM_", "LIVEKIT_", "OTEL_"))}
        env.update(PYTHONPATH=str(ROOT), **settings)
        if worker_factory is not None:
            env["LINGSTREAM_TEST_HOOKS"] = "1"
            command += ["--worker-factory", worker_factory]
        with log.open("wb") as sink:
            self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=sink)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]

    async def wait_ready(self, client: httpx.AsyncClient, within: float = 60.0) -> None:
        """Polls /readyz until 200; raises RuntimeError with the end of the log if the process exits or `within`
        seconds pass."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"lingstream serve exited with {self.process.returncode}:\n{self._tail()}")
            with contextlib.suppress(httpx.TransportError):
                if (await client.get(f"{self.url}/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.05)  # polling another process, with a deadline
        raise RuntimeError(f"lingstream serve was not ready in {within:g} s:\n{self._tail()}")

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM (a drain), then the exit code; killed after `timeout` seconds (the code is then -9)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return -9


def metric_sum(text: str, name: str) -> float:
    """The sum of every sample of metric `name` (all label sets) in a Prometheus text exposition; 0 if absent."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and len(line) > len(name) and line[len(name)] in " {":
            total += float(line.rsplit(" ", 1)[1])
    return total


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1.0 when every value is equal, 1/n when one takes everything (1.0 for all zeros)."""
    squares = sum(v * v for v in values)
    return 1.0 if squares == 0 else sum(values) ** 2 / (len(values) * squares)


def report(figures: Mapping[str, object], started: float) -> None:
    """Prints `figures` as a table, then as one JSON object on the last line, both with `bench_seconds` (since
    `started`, a `time.perf_counter()` reading) added; floats are rounded to 4 decimals."""
    rows = {**figures, "bench_seconds": time.perf_counter() - started}
    width = max(len(key) for key in rows)
    for key, value in rows.items():
        print(f"{key:<{width}}  {value:12.4f}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    print(json.dumps({key: round(value, 4) if isinstance(value, float) else value for key, value in rows.items()}))
