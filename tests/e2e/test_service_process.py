"""A real `lingstream serve` process (fake model workers through the test-only hook): SIGTERM drains and exits 0,
and `lingstream drain` (the preStop hook) drives the same drain from outside."""

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
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
STARTUP_DEADLINE_S = 60.0


def _lingstream() -> list[str]:
    script = shutil.which("lingstream", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "service.cli"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("LINGSTREAM_", "LIVEKIT_"))}
    env.update({"LINGSTREAM_TEST_HOOKS": "1", "PYTHONPATH": str(ROOT), "LINGSTREAM_LOG_FORMAT": "json"})
    env.update(extra)
    return env


class Service:
    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process = process
        self.port = port
        self.log = log
        self.url = f"http://127.0.0.1:{port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def _serve(tmp_path: Path, **settings: str) -> Iterator[Service]:
    port = _free_port()
    log = tmp_path / f"serve-{port}.log"
    command = [
        *_lingstream(),
        "serve",
        "--port",
        str(port),
        "--worker-factory",
        "tests.fakes.world:paced_fake_workers",
    ]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd=ROOT, env=_environment(**settings), stdout=sink, stderr=sink)
    service = Service(process, port, log)
    try:
        yield service
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


async def _wait_ready(service: Service, client: httpx.AsyncClient) -> None:
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            pytest.fail(f"lingstream serve exited with {service.process.returncode}:\n{service.output()}")
        with contextlib.suppress(httpx.TransportError):
            if (await client.get(f"{service.url}/readyz")).status_code == 200:
                return
        await asyncio.sleep(0.05)  # polling a subprocess with a deadline
    pytest.fail(f"lingstream serve was not ready in {STARTUP_DEADLINE_S} s:\n{service.output()}")


async def _events(client: httpx.AsyncClient, url: str, sink: list[dict[str, Any]]) -> None:
    async with client.stream("GET", url) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                sink.append(json.loads(line[len("data: ") :]))


async def _poll_until(predicate: Any, what: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.05)  # polling a subprocess with a deadline
    pytest.fail(f"timed out waiting for {what}")


@contextlib.asynccontextmanager
async def _client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10.0) as client:
        yield client


@pytest.mark.slow
async def test_sigterm_drains_running_sessions_and_exits_zero(tmp_path: Path) -> None:
    drain_timeout = 3.0
    with _serve(tmp_path, LINGSTREAM_DRAIN_TIMEOUT=str(drain_timeout)) as service:
        async with _client() as client:
            await _wait_ready(service, client)
            created = await client.post(f"{service.url}/v1/sessions", json={"config": {"fps": 20}})
            assert created.status_code == 201, created.text
            session = created.json()["id"]
            events: list[dict[str, Any]] = []
            reader = asyncio.create_task(_events(client, f"{service.url}/v1/sessions/{session}/events", events))
            await _poll_until(lambda: _true(bool(events)), "the first event")

            signalled = time.monotonic()
            service.process.send_signal(signal.SIGTERM)

            async def not_ready() -> bool:
                response = await client.get(f"{service.url}/readyz")
                return response.status_code == 503 and response.json()["error"]["code"] == "draining"

            await _poll_until(not_ready, "readiness to turn false")
            refused = await client.post(f"{service.url}/v1/sessions", json={})
            assert (refused.status_code, refused.json()["error"]["code"]) == (503, "draining")
            drain = (await client.get(f"{service.url}/metrics")).text
            assert "lingstream_draining 1" in drain

            await asyncio.wait_for(reader, timeout=drain_timeout + 10)
            returncode = await asyncio.to_thread(service.process.wait, drain_timeout + 10)
            elapsed = time.monotonic() - signalled
    assert returncode == 0, service.output()
    assert elapsed < drain_timeout + 5
    assert [event["status"] for event in events] == ["running", "draining", "closed"]
    assert events[-1]["reason"] == "service_drain"
    log = service.output()
    assert "drain complete" in log
    assert "Traceback" not in log


@pytest.mark.slow
async def test_drain_command_waits_for_running_sessions_then_sigterm_exits_at_once(tmp_path: Path) -> None:
    with _serve(tmp_path, LINGSTREAM_DRAIN_TIMEOUT="1.5") as service:
        async with _client() as client:
            await _wait_ready(service, client)
            assert (await client.post(f"{service.url}/v1/sessions", json={})).status_code == 201
            started = time.monotonic()
            drained = await asyncio.to_thread(
                subprocess.run,
                [*_lingstream(), "drain", "--wait", "--timeout", "20", "--port", str(service.port)],
                capture_output=True,
                text=True,
                timeout=30,
                env=_environment(),
                cwd=ROOT,
            )
            waited = time.monotonic() - started
            assert drained.returncode == 0, drained.stderr
            final = json.loads(drained.stdout.strip().splitlines()[-1])
            assert final["running"] == 0
            assert final["draining"] is True
            assert 1.0 < waited < 15
            assert service.process.poll() is None  # a drain alone does not stop the process
            assert (await client.get(f"{service.url}/readyz")).status_code == 503
            signalled = time.monotonic()
            service.process.send_signal(signal.SIGTERM)
            returncode = await asyncio.to_thread(service.process.wait, 15)
            assert returncode == 0, service.output()
            assert time.monotonic() - signalled < 5


def test_drain_command_exits_one_when_the_service_is_unreachable() -> None:
    result = subprocess.run(
        [*_lingstream(), "drain", "--port", str(_free_port())],
        capture_output=True,
        text=True,
        timeout=30,
        env=_environment(),
        cwd=ROOT,
    )
    assert result.returncode == 1
    assert "unreachable" in result.stderr


async def _true(value: bool) -> bool:
    return value
