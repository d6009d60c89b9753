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

`--quick` is a smoke run of a few seconds over the same path (200 cycles at concurrency 20, 0.5 s of lease
contention); its figures are not the ones to compare. The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from admission import ExecutionLease
from bench._common import Server, jain, metric_sum, report
from pipeline.metrics import percentile

SETTINGS = {
    "LINGSTREAM_NUM_WORKERS": "4",
    "LINGSTREAM_MAX_SESSIONS_PER_WORKER": "2",
    "LINGSTREAM_QUEUE_SIZE": "256",
    "LINGSTREAM_LOG_LEVEL": "WARNING",
    "LINGSTREAM_DRAIN_TIMEOUT": "5",
}


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
        "create_p50_ms": percentile(creates, 50) or 0.0,
        "create_p99_ms": percentile(creates, 99) or 0.0,
        "get_p50_ms": percentile(gets, 50) or 0.0,
        "delete_p50_ms": percentile(deletes, 50) or 0.0,
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
    return {
        "lease_sessions": sessions,
        "lease_grants_total": sum(grants),
        "lease_grants_min": min(grants),
        "lease_grants_max": max(grants),
        "lease_jain_fairness": jain(grants),
        "lease_wait_p95_ms": lease.statistics().wait_time.p95 * 1000,
    }


async def main(cycles: int, concurrency: int, lease_seconds: float) -> dict[str, float]:
    with (
        tempfile.TemporaryDirectory() as folder,
        Server(
            Path(folder) / "serve.log", SETTINGS, worker_factory="tests.support.fakes.world:idle_fake_workers"
        ) as server,
    ):
        async with httpx.AsyncClient(timeout=5.0) as client:
            await server.wait_ready(client)
        figures = await run_cycles(server.url, cycles, concurrency)
        figures["serve_exit_code"] = await asyncio.to_thread(server.stop, 30.0)
    figures.update(await lease_fairness(4, lease_seconds))
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--lease-seconds", type=float, default=2.0)
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run of a few seconds: 200 cycles at concurrency 20, 0.5 s lease"
    )
    args = parser.parse_args()
    if args.quick:
        args.cycles, args.concurrency, args.lease_seconds = 200, 20, 0.5
    started = time.perf_counter()
    report(asyncio.run(main(args.cycles, args.concurrency, args.lease_seconds)), started)
