"""The LiveKit end-to-end stack, shared by the LiveKit tests and the transport bench: a private network namespace
(`tests.support.netns.PrivateNetwork`), the LiveKit-signalling stand-in (`tests.support.livekit_server`) on its veth
address,
and a real `lingstream serve` whose `LIVEKIT_URL` points at the stand-in and whose webhooks the stand-in sends.

Everything is started from the calling thread, inside the namespace; so are the clients the caller makes there
(`client()`, Playwright's Chromium). `LiveKitStack.skip_reason()` says why the stack cannot run here (no root, no
namespaces) for a skip.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.livekit_server.process import API_KEY, API_SECRET, StandInProcess
from tests.support.netns import HOST_A, PrivateNetwork, private_network_support
from tests.support.serving import ROOT, free_port, lingstream

__all__ = ["LiveKitStack", "another_replica", "livekit_stack", "metric"]

_READY_S = 90.0


@dataclass
class LiveKitStack:
    standin: StandInProcess
    url: str  # the service, http://HOST_A:port
    process: subprocess.Popen[bytes]
    log: Path

    @staticmethod
    def skip_reason() -> str | None:
        return private_network_support()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def client(self) -> httpx.Client:
        """An HTTP client of the service (make it, and use it, on the thread inside the namespace)."""
        return httpx.Client(base_url=self.url, timeout=10.0)

    def metrics(self) -> str:
        with self.client() as client:
            return client.get("/metrics").text


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` in a Prometheus exposition whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if match is None:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(found.get(key) == value for key, value in labels.items()):
            total += float(match.group(2))
    return total


def _wait_ready(stack: LiveKitStack) -> None:
    deadline = time.monotonic() + _READY_S
    with stack.client() as client:
        while time.monotonic() < deadline:
            if stack.process.poll() is not None:
                raise RuntimeError(f"lingstream serve exited with {stack.process.returncode}:\n{stack.output()}")
            with contextlib.suppress(httpx.TransportError):
                if client.get("/readyz").status_code == 200:
                    return
            time.sleep(0.05)  # polling another process against a deadline
    raise RuntimeError(f"lingstream serve was not ready in {_READY_S} s:\n{stack.output()[-4000:]}")


@contextlib.contextmanager
def livekit_stack(workdir: Path, **settings: str) -> Iterator[LiveKitStack]:
    """The network, the stand-in and `lingstream serve` (the reference model; `settings` are `LINGSTREAM_*`
    variables on top of one model worker, one torch thread and a 5 s drain). Torn down in reverse order: the
    service drains (SIGTERM), the stand-in closes its rooms, the thread leaves the namespace."""
    with PrivateNetwork():
        service_port, standin_port = free_port(), free_port()
        url = f"http://{HOST_A}:{service_port}"
        standin = StandInProcess(HOST_A, standin_port, workdir / "standin.log", webhook_url=f"{url}/v1/livekit/webhook")
        with standin, _serve(standin, service_port, workdir / "serve.log", settings) as stack:
            yield stack


@contextlib.contextmanager
def another_replica(stack: LiveKitStack, workdir: Path, **settings: str) -> Iterator[LiveKitStack]:
    """A second `lingstream serve` on the same stand-in, inside the same namespace (call it from the thread that
    entered `livekit_stack`): another replica, or another deployment, sharing the LiveKit server; it gets no
    webhooks (the stand-in sends them to the first). Drained and stopped on exit."""
    with _serve(stack.standin, free_port(), workdir / "serve-2.log", settings) as replica:
        yield replica


@contextlib.contextmanager
def _serve(standin: StandInProcess, port: int, log: Path, settings: dict[str, str]) -> Iterator[LiveKitStack]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("LINGSTREAM_", "LIVEKIT_", "OTEL_"))}
    env.update(
        PYTHONPATH=str(ROOT),
        LINGSTREAM_HOST=HOST_A,
        LINGSTREAM_TORCH_THREADS="1",
        LINGSTREAM_NUM_WORKERS="1",
        LINGSTREAM_DRAIN_TIMEOUT="5",
        LIVEKIT_URL=standin.url,
        LIVEKIT_API_KEY=API_KEY,
        LIVEKIT_API_SECRET=API_SECRET,
    )
    env.update(settings)
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [*lingstream(), "serve", "--port", str(port)], cwd=ROOT, env=env, stdout=sink, stderr=sink
        )
    stack = LiveKitStack(standin, f"http://{HOST_A}:{port}", process, log)
    try:
        _wait_ready(stack)
        yield stack
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
