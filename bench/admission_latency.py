"""Benchmark of session admission through the real service, and of the execution lease's fairness (< 60 s).

Measures, in one run:
- create_p50_ms / create_p99_ms (and get/delete p50): latency of `POST /v1/sessions`, `GET` and `DELETE` against a
  real `lingstream serve` process on loopback (fake model workers through the test-only `--worker-factory` hook;
  4 workers x 2 sessions, queue 256), 2 000 create/get/delete cycles at concurrency 100 with httpx.
- errors_5xx: answers >= 500 (must be 0); statuses: how many creates were admitted (201), queued (202), rejected.
- slots_leaked: after the run, slots still retained plus any mismatch between retained slots and sessions holding
  one, read from /metrics (must be 0).
- lease_jain_fairness: Jain's index of grants when 4 sessions share one `ExecutionLease`, each re-requesting as
  fast as it can for ~2 s with a tiny simulated chunk (1.0 = perfectly even).

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx

from admission import ExecutionLease

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def serve(port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    script = shutil.which("lingstream", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "service.cli"]
    command += ["serve", "--port", str(port), "--worker-factory", "tests.fakes.world:idle_fake_workers"]
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("LINGSTREAM_", "LIVEKIT_"))}
    env.update(
        LINGSTREAM_TEST_HOOKS="1",
        PYTHONPATH=str(ROOT),
        LINGSTREAM_NUM_WORKERS="4",
        LINGSTREAM_MAX_SESSIONS_PER_WORKER="2",
        LINGSTREAM_QUEUE_SIZE="256",
        LINGSTREAM_LOG_LEVEL="WARNING",
        LINGSTREAM_DRAIN_TIMEOUT="5",
    )
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=sink)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def wait_ready(client: httpx.AsyncClient, url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"lingstream serve exited with {process.returncode}")
        with contextlib.suppress(httpx.TransportError):
            if (await client.get(f"{url}/readyz")).status_code == 200:
                return
        await asyncio.sleep(0.05)
    raise RuntimeError("lingstream serve did not become ready in 60 s")


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


def metric_sum(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#") and line[len(name)] in " {":
            total += float(line.rsplit(" ", 1)[1])
    return total


async def run_cycles(url: str, cycles: int, concurrency: int) -> dict[str, float]:
    """`concurrency` workers, each with its own keep-alive connection (one small httpx pool per worker: a single
    pool shared by 100 connections spends more CPU on pool bookkeeping than the service spends serving). The
    client shares the 2 cores with the server, so latencies include waiting for the client's own CPU."""
    creates: list[float] = []
    gets: list[float] = []
    deletes: list[float] = []
    statuses: Counter[int] = Counter()
    errors_5xx = 0
    remaining = iter(range(cycles))

    async def timed(
        client: httpx.AsyncClient, method: str, path: str, sink: list[float], body: object = None
    ) -> httpx.Response:
        nonlocal errors_5xx
        started = time.perf_counter()
        response = await client.request(method, path, json=body)
        sink.append((time.perf_counter() - started) * 1000)
        if response.status_code >= 500:
            errors_5xx += 1
        return response

    async def worker(client: httpx.AsyncClient) -> None:
        for index in remaining:
            created = await timed(client, "POST", "/v1/sessions", creates, {"config": {"seed": index}})
            statuses[created.status_code] += 1
            if created.status_code not in (201, 202):
                continue
            session = created.json()["id"]
            await timed(client, "GET", f"/v1/sessions/{session}", gets)
            await timed(client, "DELETE", f"/v1/sessions/{session}?mode=cancel", deletes)

    # Clients are built and connected before the clock starts: building one costs the client ~30 ms of CPU.
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(httpx.AsyncClient(base_url=url, limits=limits, timeout=30.0))
            for _ in range(concurrency)
        ]
        await asyncio.gather(*(client.get("/healthz") for client in clients))
        started = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for client in clients:
                group.create_task(worker(client))
        elapsed = time.perf_counter() - started
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
        text = (await client.get("/metrics")).text

    live = metric_sum(text, "lingstream_sessions")
    retained = metric_sum(text, "lingstream_admission_slots_retained")
    mismatch = abs(metric_sum(text, "lingstream_admission_slot_mismatch"))
    return {
        "cycles": cycles,
        "concurrency": concurrency,
        "elapsed_s": elapsed,
        "requests_per_s": (len(creates) + len(gets) + len(deletes)) / elapsed,
        "create_p50_ms": percentile(creates, 0.50),
        "create_p99_ms": percentile(creates, 0.99),
        "get_p50_ms": percentile(gets, 0.50) if gets else 0.0,
        "delete_p50_ms": percentile(deletes, 0.50) if deletes else 0.0,
        "admitted_201": statuses[201],
        "queued_202": statuses[202],
        "rejected_429": statuses[429],
        "errors_5xx": errors_5xx,
        "live_sessions_after": live,
        "slots_leaked": retained + mismatch,
    }


async def lease_fairness(sessions: int, seconds: float) -> dict[str, float]:
    lease = ExecutionLease()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds

    async def busy(session_id: str) -> None:
        while loop.time() < deadline:
            async with lease.grant(session_id):
                await asyncio.sleep(0)  # a tiny simulated chunk: one trip through the event loop

    async with asyncio.TaskGroup() as group:
        for index in range(sessions):
            group.create_task(busy(f"s{index}"))
    grants = [float(count) for count in lease.statistics().grants_per_session.values()]
    jain = sum(grants) ** 2 / (len(grants) * sum(g * g for g in grants))
    return {
        "lease_sessions": sessions,
        "lease_grants_total": sum(grants),
        "lease_grants_min": min(grants),
        "lease_grants_max": max(grants),
        "lease_jain_fairness": jain,
        "lease_wait_p95_ms": lease.statistics().wait_time.p95 * 1000,
    }


async def main(cycles: int, concurrency: int, lease_seconds: float) -> dict[str, float]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "serve.log"
        with serve(port, log) as process:
            async with httpx.AsyncClient(timeout=5.0) as client:
                await wait_ready(client, url, process)
            figures = await run_cycles(url, cycles, concurrency)
            process.send_signal(signal.SIGTERM)
            returncode = await asyncio.to_thread(process.wait, 30)
        figures["serve_exit_code"] = returncode
    figures.update(await lease_fairness(4, lease_seconds))
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--lease-seconds", type=float, default=2.0)
    args = parser.parse_args()
    results = asyncio.run(main(args.cycles, args.concurrency, args.lease_seconds))
    width = max(len(key) for key in results)
    for key, value in results.items():
        print(f"{key:<{width}}  {value:12.3f}")
    print(json.dumps({key: round(value, 4) for key, value in results.items()}))
