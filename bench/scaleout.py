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
from pathlib import Path

import httpx
from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fakes.redis_server import RedisServer  # noqa: E402 - the repository root is on sys.path first

PREFIX = "lingstream:admission:"
WORKERS, SLOTS = 4, 2


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Replica:
    def __init__(self, name: str, redis_url: str, folder: Path) -> None:
        script = shutil.which("lingstream", path=str(Path(sys.executable).parent))
        command = [script] if script else [sys.executable, "-m", "service.cli"]
        self.name = name
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command += ["serve", "--port", str(self.port), "--worker-factory", "tests.fakes.world:idle_fake_workers"]
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("LINGSTREAM_", "LIVEKIT_"))}
        env.update(
            LINGSTREAM_TEST_HOOKS="1",
            PYTHONPATH=str(ROOT),
            LINGSTREAM_HOST="127.0.0.1",
            LINGSTREAM_ADMISSION_BACKEND="redis",
            LINGSTREAM_REDIS_URL=redis_url,
            LINGSTREAM_REPLICA_ID=name,
            LINGSTREAM_REPLICA_TTL="3",
            LINGSTREAM_NUM_WORKERS=str(WORKERS),
            LINGSTREAM_MAX_SESSIONS_PER_WORKER=str(SLOTS),
            LINGSTREAM_QUEUE_SIZE="256",
            LINGSTREAM_LOG_LEVEL="WARNING",
            LINGSTREAM_DRAIN_TIMEOUT="5",
        )
        self.log = folder / f"{name}.log"
        with self.log.open("wb") as sink:
            self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=sink)

    async def wait_ready(self, client: httpx.AsyncClient) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"replica {self.name} exited with {self.process.returncode}: {self.log.read_text()}")
            with contextlib.suppress(httpx.TransportError):
                if (await client.get(f"{self.url}/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.05)  # polling a subprocess with a deadline
        raise RuntimeError(f"replica {self.name} did not become ready in 60 s")

    def stop(self) -> int:
        """SIGTERM (a drain), then the exit code; killed after 20 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return -9


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))] if ordered else 0.0


def metric_sum(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#") and line[len(name)] in " {":
            total += float(line.rsplit(" ", 1)[1])
    return total


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
        "create_p50_ms": percentile(creates, 0.50),
        "create_p99_ms": percentile(creates, 0.99),
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
        with RedisServer(folder) as server:
            raw = Redis.from_url(server.url)
            replicas = [Replica("r1", server.url, folder)]
            try:
                async with httpx.AsyncClient(timeout=30.0) as client:
                    await replicas[0].wait_ready(client)
                    one = await run_cycles([replicas[0].url], cycles, concurrency)
                    figures.update({f"{key}_1": value for key, value in one.items()})
                    figures["slots_leaked_1"] = await leaked(client, raw, [replicas[0].url])
                    # Only now the other two: registered earlier, they would have taken queued sessions too.
                    replicas += [Replica(name, server.url, folder) for name in ("r2", "r3")]
                    await asyncio.gather(*(replica.wait_ready(client) for replica in replicas[1:]))
                    urls = [replica.url for replica in replicas]
                    three = await run_cycles(urls, cycles, concurrency)
                    figures.update({f"{key}_3": value for key, value in three.items()})
                    figures["fifo_queued"] = queued
                    figures["fifo_violations"] = await fifo_violations(client, raw, urls, queued)
                    figures["slots_leaked"] = await leaked(client, raw, urls)
            finally:
                codes = [replica.stop() for replica in replicas]
                await raw.aclose()
            figures["replica_exit_codes_nonzero"] = sum(1 for code in codes if code != 0)
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=48)
    parser.add_argument("--queued", type=int, default=30)
    args = parser.parse_args()
    started = time.monotonic()
    results = asyncio.run(main(args.cycles, args.concurrency, args.queued))
    results["elapsed_s"] = time.monotonic() - started
    width = max(len(key) for key in results)
    for key, value in results.items():
        print(f"{key:<{width}}  {value:12.3f}")
    print(json.dumps({key: round(value, 4) for key, value in results.items()}))
