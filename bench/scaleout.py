"""Benchmark of scale-out: one vs three `lingstream serve` replicas sharing admission through one Redis (~90 s).

Starts a throwaway `redis-server` (tests/support/fakes/redis_server.py) and real replicas on loopback (redis backend,
fake
idle model workers through the test-only `--worker-factory` hook, 4 workers x 2 sessions each, queue 2 048), then:

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
- cycles_per_s_3_over_1: cycles/s with three replicas ÷ with one, with cpu_cores_busy_1 / cpu_cores_busy_3 beside
  it: CPU seconds of every process of the run (replicas, Redis, this client) per wall second. On a 2-core machine
  the load, the replicas and Redis share, a figure near 2 means the machine, not the design, set the pace: three
  replicas then cannot do more than one, and more of them only add their own overhead (load_average_1m, read after
  the three-replica phase, counts every process of the machine, other users' too);
- create_cpu_ms_by_queue: with every slot of the three replicas taken and 10, then 1 000 sessions queued (spread
  over the replicas, so each follows a third of them), the CPU (replicas + Redis, from /proc) per cycle of a
  create that queues at the tail and its DELETE on another replica, `--cost-cycles` cycles one after another;
  create_cpu_growth is the largest queue's figure ÷ the smallest's (a design that reads the queue per create
  grows with it); redis_ops_per_create the commands Redis processed per cycle (every replica's calls and the
  commands their scripts ran: create, cancel, stream reads, position reads), redis_scripts_per_create the script
  calls among them; redis_round_trips_per_get_queued, at each queue length, the commands a replica sends Redis
  per GET of a queued session that another replica created (`--cost-cycles` GETs of the tail's session, counted
  with MONITOR, less what the replicas send by themselves over as long a time without GETs; one is the design);
- replica_exit_codes_nonzero: replicas that did not exit 0 on SIGTERM.

`--quick` is a smoke run of a few seconds over the same path (100 cycles at concurrency 10, 6 queued, queues of 10
and 100 with 30 cost cycles); its figures are not the ones to compare. The last line printed is one JSON object with
every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable
from pathlib import Path

import httpx
from redis.asyncio import Redis

from bench._common import Server, metric_sum, report
from pipeline.metrics import percentile
from tests.support.fakes.redis_server import RedisServer

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
        "LINGSTREAM_QUEUE_SIZE": "2048",
        "LINGSTREAM_QUEUE_HEARTBEAT_TIMEOUT": "600",  # sessions queued by the cost phase have no client polling
        "LINGSTREAM_LOG_LEVEL": "WARNING",
        "LINGSTREAM_DRAIN_TIMEOUT": "5",
    }
    return Server(folder / f"{name}.log", settings, worker_factory="tests.support.fakes.world:idle_fake_workers")


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


class BusyMeter:
    """CPU seconds of `pids` and of this process per wall second since construction: how many of the machine's
    cores the run kept busy."""

    def __init__(self, pids: list[int]) -> None:
        self._pids = pids
        self._start = (time.perf_counter(), cpu_seconds(pids), time.process_time())

    def cores(self) -> float:
        wall, others, mine = self._start
        used = cpu_seconds(self._pids) - others + time.process_time() - mine
        return used / (time.perf_counter() - wall)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of the processes (all their threads) so far, from /proc (clock-tick resolution)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)
    return total / ticks


async def create_cost(
    client: httpx.AsyncClient, raw: Redis, urls: list[str], pids: list[int], queues: tuple[int, ...], cycles: int
) -> tuple[dict[str, float], dict[str, float], dict[str, float], dict[str, float]]:
    """Per create-at-the-tail + DELETE cycle, at each queue length: CPU (replicas + Redis), Redis commands (those
    the scripts run included) and script calls; every slot is taken first, so every create queues. Then Redis round
    trips per GET of the tail's queued session on a replica that did not create it."""

    async def create(url: str, status: int) -> str:
        created = await client.post(f"{url}/v1/sessions", json={})
        if created.status_code != status:
            raise RuntimeError(f"create: {created.status_code} {created.text}")
        session: str = created.json()["id"]
        return session

    async def commands() -> int:
        stats = await raw.info("stats")
        return int(stats["total_commands_processed"])

    async def scripts() -> int:
        stats = await raw.info("commandstats")
        return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval"))

    async def sent_during(action: Awaitable[None]) -> int:
        """Commands clients sent to Redis while `action` ran (MONITOR; not those the scripts ran, nor the marks)."""
        async with raw.monitor() as monitor:
            await raw.echo("bench:start")
            while "bench:start" not in (await monitor.next_command())["command"]:
                pass
            await action
            await raw.echo("bench:end")
            sent = 0
            while "bench:end" not in (line := await monitor.next_command())["command"]:
                sent += line["client_type"] != "lua"
        return sent

    async def get_round_trips(session: str, url: str) -> float:
        """Per GET of a session queued by another replica (so `url` answers from the registry), less what the
        replicas send by themselves (heartbeats, stream reads, refreshes) over as long a time without GETs."""

        async def gets() -> None:
            for _ in range(cycles):
                got = await client.get(f"{url}/v1/sessions/{session}")
                if got.status_code != 200 or got.json()["status"] != "queued":
                    raise RuntimeError(f"get: {got.status_code} {got.text}")

        started = time.perf_counter()
        busy = await sent_during(gets())
        idle = await sent_during(asyncio.sleep(time.perf_counter() - started))
        return (busy - idle) / cycles

    async def settle() -> None:
        """Until Redis sees no command for a while beyond the replicas' heartbeats: their follow-up work is done."""
        before = await commands()
        while True:
            await asyncio.sleep(0.3)  # polling Redis's counter
            now = await commands()
            if now - before <= 3 * len(urls) + 2:
                return
            before = now

    running = [await create(urls[i % len(urls)], 201) for i in range(len(urls) * WORKERS * SLOTS)]
    queued: list[str] = []
    cpu_ms: dict[str, float] = {}
    ops: dict[str, float] = {}
    calls: dict[str, float] = {}
    get_trips: dict[str, float] = {}
    limit = asyncio.Semaphore(8)

    async def queue_one(index: int) -> str:
        async with limit:
            return await create(urls[index % len(urls)], 202)

    for target in queues:
        queued += await asyncio.gather(*(queue_one(i) for i in range(len(queued), target)))
        await settle()
        cpu_before, ops_before, calls_before = cpu_seconds(pids), await commands(), await scripts()
        for index in range(cycles):
            session = await create(urls[index % len(urls)], 202)
            deleted = await client.delete(f"{urls[(index + 1) % len(urls)]}/v1/sessions/{session}?mode=cancel")
            if deleted.status_code >= 300:
                raise RuntimeError(f"delete: {deleted.status_code} {deleted.text}")
        await settle()
        cpu_ms[str(target)] = (cpu_seconds(pids) - cpu_before) * 1000 / cycles
        ops[str(target)] = (await commands() - ops_before - 3) / cycles  # less this function's own INFOs
        calls[str(target)] = (await scripts() - calls_before) / cycles
        # The tail's session, created on the replica queued[-1] went to; GET on the next one.
        get_trips[str(target)] = await get_round_trips(queued[-1], urls[len(queued) % len(urls)])
    for index, session in enumerate([*queued, *running]):
        await client.delete(f"{urls[index % len(urls)]}/v1/sessions/{session}?mode=cancel")
    return cpu_ms, ops, calls, get_trips


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


async def main(
    cycles: int, concurrency: int, queued: int, cost_queues: tuple[int, ...], cost_cycles: int
) -> dict[str, object]:
    figures: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        with RedisServer(folder) as redis_server:
            raw = Redis.from_url(redis_server.url)
            redis_pid = int((await raw.info("server"))["process_id"])
            replicas = [replica("r1", redis_server.url, folder)]
            try:
                async with httpx.AsyncClient(timeout=30.0) as client:
                    await replicas[0].wait_ready(client)
                    busy = BusyMeter([redis_pid, replicas[0].process.pid])
                    one = await run_cycles([replicas[0].url], cycles, concurrency)
                    figures["cpu_cores_busy_1"] = busy.cores()
                    figures.update({f"{key}_1": value for key, value in one.items()})
                    figures["slots_leaked_1"] = await leaked(client, raw, [replicas[0].url])
                    # Only now the other two: registered earlier, they would have taken queued sessions too.
                    replicas += [replica(name, redis_server.url, folder) for name in ("r2", "r3")]
                    await asyncio.gather(*(server.wait_ready(client) for server in replicas[1:]))
                    urls = [server.url for server in replicas]
                    pids = [redis_pid, *(server.process.pid for server in replicas)]
                    busy = BusyMeter(pids)
                    three = await run_cycles(urls, cycles, concurrency)
                    figures["cpu_cores_busy_3"] = busy.cores()
                    figures["load_average_1m"] = os.getloadavg()[0]  # every process of the machine, others' too
                    figures.update({f"{key}_3": value for key, value in three.items()})
                    figures["cycles_per_s_3_over_1"] = three["cycles_per_s"] / one["cycles_per_s"]
                    figures["fifo_queued"] = queued
                    figures["fifo_violations"] = await fifo_violations(client, raw, urls, queued)
                    await leaked(client, raw, urls)  # waits until the sessions above are gone: every slot is free
                    cpu_ms, ops, calls, get_trips = await create_cost(client, raw, urls, pids, cost_queues, cost_cycles)
                    figures["create_cpu_ms_by_queue"] = {key: round(value, 3) for key, value in cpu_ms.items()}
                    figures["create_cpu_growth"] = cpu_ms[str(cost_queues[-1])] / cpu_ms[str(cost_queues[0])]
                    figures["redis_ops_per_create"] = {key: round(value, 2) for key, value in ops.items()}
                    figures["redis_scripts_per_create"] = {key: round(value, 2) for key, value in calls.items()}
                    figures["redis_round_trips_per_get_queued"] = {
                        key: round(value, 2) for key, value in get_trips.items()
                    }
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
    parser.add_argument("--cost-cycles", type=int, default=300, help="create + DELETE cycles per queue length")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run of a few seconds: 100 cycles at concurrency 10, 6 queued, cost at 10 and 100 queued",
    )
    args = parser.parse_args()
    cost_queues = (10, 1000)
    if args.quick:
        args.cycles, args.concurrency, args.queued, args.cost_cycles = 100, 10, 6, 30
        cost_queues = (10, 100)
    started = time.perf_counter()
    report(asyncio.run(main(args.cycles, args.concurrency, args.queued, cost_queues, args.cost_cycles)), started)
