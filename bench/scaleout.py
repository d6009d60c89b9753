"""Benchmark of scale-out: one vs three `lingstream serve` replicas sharing admission through one Redis (< 60 s).

Starts a throwaway `redis-server` (tests/fakes/redis_server.py) and real replicas on loopback (redis backend, fake
idle model workers through the test-only `--worker-factory` hook, 4 workers x 2 sessions each, queue 256), then:

- create_p50_ms_1 / create_p99_ms_1 / errors_5xx_1: `--cycles` create/get/delete cycles at `--concurrency` against
  one replica;
- create_p50_ms_3 / create_p99_ms_3 / errors_5xx_3: the same against three replicas, each cycle spread over them
  (create on one, GET on the next, DELETE on the third, so two of the three calls reach a replica that does not run
  the session);
- fifo_violations: on the three replicas, every slot is filled, `--queued` sessions are created one after another
  round-robin over the replicas, then slots are freed in rounds (DELETE on varying replicas); after each round the
  admitted sessions must be exactly the oldest ones. Counts sessions admitted while an older one still waited;
- slots_leaked: at the end, slots Redis still counts, tickets still live or queued, and each replica's
  `lingstream_admission_slots_retained` plus |`lingstream_admission_slot_mismatch`| (must be 0; `slots_leaked_1`
  is the same after the one-replica phase, before the other two start);
- replica_exit_codes_nonzero: replicas that did not exit 0 on SIGTERM.

`--quick` is a smoke run of a few seconds over the same path (100 cycles at concurrency 10, 6 queued); its figures
are not the ones to compare. The last line printed is one JSON object with every figure.
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
from _common import Server, metric_sum, report
from redis.asyncio import Redis

from pipeline.metrics import percentile
from tests.fakes.redis_server import RedisServer

PREFIX = "lingstream:admission:"
WORKERS, SLOTS = 4, 2


def replica(name: str, redis_url: str, folder: Path) -> Server:
    """One replica: the redis backend, fake idle workers (4 x 2 slots), queue 256, a short liveness TTL."""
    settings = {
        "LINGSTREAM_ADMISSION_BACKEND": "redis",
        "LINGSTREAM_REDIS_URL": redis_url,
        "LINGSTREAM_REPLICA_ID": name,
        "LINGSTREAM_REPLICA_TTL": "3",
        "LINGSTREAM_NUM_WORKERS": str(WORKERS),
        "LINGSTREAM_MAX_SESSIONS_PER_WORKER": str(SLOTS),
        "LINGSTREAM_QUEUE_SIZE": "256",
        "LINGSTREAM_LOG_LEVEL": "WARNING",
        "LINGSTREAM_DRAIN_TIMEOUT": "5",
    }
    return Server(folder / f"{name}.log", settings, worker_factory="tests.fakes.world:idle_fake_workers")


async def run_cycles(urls: list[str], cycles: int, concurrency: int) -> dict[str, float]:
    """`concurrency` workers, each with one keep-alive connection per replica; cycle i creates on replica i, GETs
    on i+1 and DELETEs on i+2 (modulo the replica count)."""
    creates: list[float] = []
    statuses: Counter[int] = Counter()
    errors_5xx = 0
    remaining = iter(range(cycles))

    async def timed(client: httpx.AsyncClient, method: str, path: str, body: object = None) -> httpx.Response:
        nonlocal errors_5xx
        started = time.perf_counter()
        response = await client.request(method, path, json=body)
        if method == "POST":
            creates.append((time.perf_counter() - started) * 1000)
        if response.status_code >= 500:
            errors_5xx += 1
        return response

    async def worker(clients: list[httpx.AsyncClient]) -> None:
        for index in remaining:
            first = clients[index % len(clients)]
            created = await timed(first, "POST", "/v1/sessions", {"config": {"seed": index}})
            statuses[created.status_code] += 1
            if created.status_code not in (201, 202):
                continue
            session = created.json()["id"]
            await timed(clients[(index + 1) % len(clients)], "GET", f"/v1/sessions/{session}")
            await timed(clients[(index + 2) % len(clients)], "DELETE", f"/v1/sessions/{session}?mode=cancel")

    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with contextlib.AsyncExitStack() as stack:
        pools = []
        for _ in range(concurrency):
            clients = [
                await stack.enter_async_context(httpx.AsyncClient(base_url=url, limits=limits, timeout=30.0))
                for url in urls
            ]
            pools.append(clients)
        await asyncio.gather(*(client.get("/healthz") for clients in pools for client in clients))
        started = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for clients in pools:
                group.create_task(worker(clients))
        elapsed = time.perf_counter() - started
    return {
        "create_p50_ms": percentile(creates, 50) or 0.0,
        "create_p99_ms": percentile(creates, 99) or 0.0,
        "errors_5xx": errors_5xx,
        "cycles_per_s": cycles / elapsed,
        "admitted_201": statuses[201],
        "queued_202": statuses[202],
        "rejected_429": statuses[429],
    }


async def fifo_violations(client: httpx.AsyncClient, raw: Redis, urls: list[str], queued_count: int) -> int:
    """Fill every slot, queue `queued_count` sessions in a known order, free the slots in rounds and count the
    sessions admitted while an older one still waited."""
    running = []
    for index in range(len(urls) * WORKERS * SLOTS):
        created = await client.post(f"{urls[index % len(urls)]}/v1/sessions", json={})
        if created.status_code != 201:
            raise RuntimeError(f"filling the slots: {created.status_code} {created.text}")
        running.append(created.json()["id"])
    queued = []
    for index in range(queued_count):
        created = await client.post(f"{urls[index % len(urls)]}/v1/sessions", json={})
        if created.status_code != 202:
            raise RuntimeError(f"queueing: {created.status_code} {created.text}")
        queued.append(created.json()["id"])
    violations = 0
    freed = 0
    rounds = [running[i : i + 5] for i in range(0, len(running), 5)]
    for round_number, batch in enumerate(rounds):
        await asyncio.gather(
            *(
                client.delete(f"{urls[(round_number + offset) % len(urls)]}/v1/sessions/{session}?mode=cancel")
                for offset, session in enumerate(batch)
            )
        )
        freed = min(len(queued), freed + len(batch))
        deadline = time.monotonic() + 10
        while True:
            states = [await raw.hget(f"{PREFIX}t:{session}", "state") for session in queued]
            admitted = {session for session, state in zip(queued, states, strict=True) if state == b"admitted"}
            if len(admitted) >= freed or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)  # polling Redis with a deadline
        violations += len(admitted - set(queued[:freed]))
    await asyncio.gather(
        *(
            client.delete(f"{urls[index % len(urls)]}/v1/sessions/{session}?mode=cancel")
            for index, session in enumerate(queued)
        )
    )
    return violations


async def leaked(client: httpx.AsyncClient, raw: Redis, urls: list[str]) -> float:
    """Slots and tickets still counted anywhere once everything ended (waits up to 10 s for releases in flight)."""
    deadline = time.monotonic() + 10
    while True:
        held = 0
        async for key in raw.scan_iter(match=f"{PREFIX}held:*"):
            held += await raw.hlen(key)
        total = float(held + await raw.zcard(f"{PREFIX}live") + await raw.zcard(f"{PREFIX}queue"))
        for url in urls:
            text = (await client.get(f"{url}/metrics")).text
            total += metric_sum(text, "lingstream_admission_slots_retained")
            total += abs(metric_sum(text, "lingstream_admission_slot_mismatch"))
        if total == 0 or time.monotonic() > deadline:
            return total
        await asyncio.sleep(0.1)  # polling with a deadline


async def main(cycles: int, concurrency: int, queued: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        with RedisServer(folder) as redis_server:
            raw = Redis.from_url(redis_server.url)
            replicas = [replica("r1", redis_server.url, folder)]
            try:
                async with httpx.AsyncClient(timeout=30.0) as client:
                    await replicas[0].wait_ready(client)
                    one = await run_cycles([replicas[0].url], cycles, concurrency)
                    figures.update({f"{key}_1": value for key, value in one.items()})
                    figures["slots_leaked_1"] = await leaked(client, raw, [replicas[0].url])
                    # Only now the other two: registered earlier, they would have taken queued sessions too.
                    replicas += [replica(name, redis_server.url, folder) for name in ("r2", "r3")]
                    await asyncio.gather(*(server.wait_ready(client) for server in replicas[1:]))
                    urls = [server.url for server in replicas]
                    three = await run_cycles(urls, cycles, concurrency)
                    figures.update({f"{key}_3": value for key, value in three.items()})
                    figures["fifo_queued"] = queued
                    figures["fifo_violations"] = await fifo_violations(client, raw, urls, queued)
                    figures["slots_leaked"] = await leaked(client, raw, urls)
            finally:
                codes = await asyncio.gather(*(asyncio.to_thread(server.stop) for server in replicas))
                await raw.aclose()
            figures["replica_exit_codes_nonzero"] = sum(1 for code in codes if code != 0)
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=48)
    parser.add_argument("--queued", type=int, default=30)
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run of a few seconds: 100 cycles at concurrency 10, 6 queued"
    )
    args = parser.parse_args()
    if args.quick:
        args.cycles, args.concurrency, args.queued = 100, 10, 6
    started = time.perf_counter()
    report(asyncio.run(main(args.cycles, args.concurrency, args.queued)), started)
