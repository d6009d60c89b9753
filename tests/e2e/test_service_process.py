"""A real `lingstream serve` process (fake model workers through the test-only hook): SIGTERM drains and exits 0,
and `lingstream drain` (the preStop hook) drives the same drain from outside."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.serving import ROOT, environment, free_port, lingstream, serve
from tests.support.waits import until


async def _events(client: httpx.AsyncClient, url: str, sink: list[dict[str, Any]]) -> None:
    async with client.stream("GET", url) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                sink.append(json.loads(line[len("data: ") :]))


_poll_until = functools.partial(until, within=10.0, every=0.05)  # polling a subprocess


@contextlib.asynccontextmanager
async def _client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10.0) as client:
        yield client


@pytest.mark.slow
async def test_sigterm_drains_running_sessions_and_exits_zero(tmp_path: Path) -> None:
    drain_timeout = 3.0
    with serve(tmp_path, LINGSTREAM_DRAIN_TIMEOUT=str(drain_timeout)) as service:
        async with _client() as client:
            await service.wait_ready(client)
            created = await client.post(f"{service.url}/v1/sessions", json={"config": {"fps": 20}})
            assert created.status_code == 201, created.text
            session = created.json()["id"]
            events: list[dict[str, Any]] = []
            reader = asyncio.create_task(_events(client, f"{service.url}/v1/sessions/{session}/events", events))
            await _poll_until(lambda: bool(events), "the first event")

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
    with serve(tmp_path, LINGSTREAM_DRAIN_TIMEOUT="1.5") as service:
        async with _client() as client:
            await service.wait_ready(client)
            assert (await client.post(f"{service.url}/v1/sessions", json={})).status_code == 201
            started = time.monotonic()
            drained = await asyncio.to_thread(
                subprocess.run,
                [*lingstream(), "drain", "--wait", "--timeout", "20", "--port", str(service.port)],
                capture_output=True,
                text=True,
                timeout=30,
                env=environment(),
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
            # At once: not after the drain timeout's full wait again (the process's own exit took 6.6 s at load 10).
            assert time.monotonic() - signalled < 10


def test_drain_command_exits_one_when_the_service_is_unreachable() -> None:
    result = subprocess.run(
        [*lingstream(), "drain", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=30,
        env=environment(),
        cwd=ROOT,
    )
    assert result.returncode == 1
    assert "unreachable" in result.stderr
