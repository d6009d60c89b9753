"""The LiveKit end-to-end stack, shared by the LiveKit tests and the benches: a private network namespace
(`tests.support.netns.PrivateNetwork`), a LiveKit server on its veth address — the real `livekit-server`
(`tests.support.livekit_server_real`, the release scripts/setup.sh --dev installs) by default, or the
LiveKit-signalling stand-in (`tests.support.livekit_server`) for the tests that need a fault only it can inject —
and a real `lingstream serve` whose `LIVEKIT_URL` points at that server and whose webhooks that server sends.

Everything is started from the calling thread, inside the namespace; so are the clients the caller makes there
(`client()`, Playwright's Chromium). `LiveKitStack.skip_reason()` says why the stack cannot run here (no root, no
namespaces, no livekit-server) for a skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.livekit_server.process import StandInProcess
from tests.support.livekit_server_real import LiveKitServerProcess, livekit_server_support
from tests.support.netns import HOST_A, PrivateNetwork, private_network_support
from tests.support.serving import ROOT, free_port, lingstream

__all__ = ["LiveKitStack", "another_replica", "livekit_stack", "metric", "run_client", "serve_replica", "standin_stack"]

_READY_S = 90.0


@dataclass
class LiveKitStack:
    server: LiveKitServerProcess | StandInProcess
    url: str  # the service, http://HOST_A:port
    process: subprocess.Popen[bytes]
    log: Path

    @staticmethod
    def skip_reason(*, standin: bool = False) -> str | None:
        """Why the stack cannot run here (the real server's stack; `standin`: the stand-in's), or None."""
        return private_network_support() or (None if standin else livekit_server_support())

    @property
    def real(self) -> LiveKitServerProcess:
        """The real `livekit-server` (`livekit_stack`)."""
        assert isinstance(self.server, LiveKitServerProcess), "this stack runs the stand-in"
        return self.server

    @property
    def standin(self) -> StandInProcess:
        """The stand-in, with its test controls (`standin_stack`)."""
        assert isinstance(self.server, StandInProcess), "this stack runs the real livekit-server"
        return self.server

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


def run_client(scenario: str, url: str, token: str, *options: str, within_s: float = 60.0) -> dict[str, Any]:
    """Run one scenario of `tests/support/livekit_client.py` (a LiveKit participant in a process of its own, so this
    process never loads `livekit.rtc`) and return its JSON report. Call it from the thread inside the stack's
    namespace: the child is born there."""
    run = subprocess.run(
        [sys.executable, "-m", "tests.support.livekit_client", scenario, url, token, *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=within_s,
        check=False,
    )
    assert run.returncode == 0, f"the {scenario} client exited {run.returncode}:\n{run.stderr[-4000:]}"
    report: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return report


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
def livekit_stack(workdir: Path, *, factory: str | None = None, **settings: str) -> Iterator[LiveKitStack]:
    """The network, the real `livekit-server` and `lingstream serve` (the reference model, or the test-only worker
    `factory`, e.g. "tests.support.fakes.world:framed_fake_workers"; `settings` are `LINGSTREAM_*` variables on top
    of one model worker, one torch thread and a 5 s drain). Torn down in reverse order: the service drains
    (SIGTERM), the server closes its rooms, the thread leaves the namespace."""
    with _stack(workdir, settings, standin=False, factory=factory) as stack:
        yield stack


@contextlib.contextmanager
def standin_stack(workdir: Path, **settings: str) -> Iterator[LiveKitStack]:
    """`livekit_stack` on the LiveKit-signalling stand-in, for a test that needs a fault only the stand-in can
    inject (its test controls: `stack.standin`); the test says which fault and why."""
    with _stack(workdir, settings, standin=True) as stack:
        yield stack


@contextlib.contextmanager
def _stack(
    workdir: Path, settings: dict[str, str], *, standin: bool, factory: str | None = None
) -> Iterator[LiveKitStack]:
    with PrivateNetwork():
        service_port, server_port = free_port(), free_port()
        webhook_url = f"http://{HOST_A}:{service_port}/v1/livekit/webhook"
        server: LiveKitServerProcess | StandInProcess
        if standin:
            server = StandInProcess(HOST_A, server_port, workdir / "standin.log", webhook_url=webhook_url)
        else:
            server = LiveKitServerProcess(
                HOST_A, server_port, free_port(), workdir / "livekit-server.log", webhook_url=webhook_url
            )
        with server, _serve(server, service_port, workdir / "serve.log", settings, factory) as stack:
            yield stack


@contextlib.contextmanager
def another_replica(stack: LiveKitStack, workdir: Path, **settings: str) -> Iterator[LiveKitStack]:
    """A second `lingstream serve` on the same LiveKit server, inside the same namespace (call it from the thread
    that entered `livekit_stack`): another replica, or another deployment, sharing the server; it gets no webhooks
    (the server sends them to the first). Drained and stopped on exit."""
    with _serve(stack.server, free_port(), workdir / "serve-2.log", settings) as replica:
        yield replica


@contextlib.contextmanager
def serve_replica(server: LiveKitServerProcess, log: Path, **settings: str) -> Iterator[LiveKitStack]:
    """One more `lingstream serve` on `server`, inside the calling thread's namespace (entered by the caller, with
    `PrivateNetwork`, as a test that composes its own stack does: replicas on Redis started in the namespace).
    Webhooks go to none of them. Drained and stopped on exit unless the test killed it."""
    with _serve(server, free_port(), log, settings) as replica:
        yield replica


@contextlib.contextmanager
def _serve(
    server: LiveKitServerProcess | StandInProcess,
    port: int,
    log: Path,
    settings: dict[str, str],
    factory: str | None = None,
) -> Iterator[LiveKitStack]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("LINGSTREAM_", "LIVEKIT_", "OTEL_"))}
    env.update(
        PYTHONPATH=str(ROOT),
        LINGSTREAM_HOST=HOST_A,
        LINGSTREAM_TORCH_THREADS="1",
        LINGSTREAM_NUM_WORKERS="1",
        LINGSTREAM_DRAIN_TIMEOUT="5",
        LIVEKIT_URL=server.url,
        LIVEKIT_API_KEY=server.api_key,
        LIVEKIT_API_SECRET=server.api_secret,
    )
    env.update(settings)
    if factory:
        env["LINGSTREAM_TEST_HOOKS"] = "1"  # `--worker-factory` is a test hook the CLI refuses without it
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [*lingstream(), "serve", "--port", str(port), *(["--worker-factory", factory] if factory else [])],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=sink,
        )
    stack = LiveKitStack(server, f"http://{HOST_A}:{port}", process, log)
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
