"""Usage metering with the shared admission: three replicas against one real redis-server. Every count is checked
exactly against the ticket records in Redis (Redis time, ms): sessions at create, waits when they leave the queue,
running time from admission to release, or to a dead replica's last heartbeat when the reaper releases it, never
twice; chunks and frames as the replicas flush them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from admission import TicketState
from service.scaleout.admission import SharedEventKind
from tests.support.redis_cluster import PREFIX, Cluster

pytestmark = pytest.mark.timeout(60)


async def _ms(raw: Redis, ticket_id: str, *names: str) -> list[int]:
    values: list[Any] = await raw.hmget(f"{PREFIX}t:{ticket_id}", list(names))
    return [int(value) for value in values]


async def test_usage_over_three_replicas_is_exact_against_the_ticket_records(cluster: Cluster) -> None:
    # A long liveness TTL: nobody dies here, and a loaded machine may delay a heartbeat.
    a, b, c = [await cluster.add(name, replica_ttl_s=10.0, heartbeat_interval_s=0.5) for name in ("a", "b", "c")]
    await a.create("k", ticket_id="x")
    await b.create("k", ticket_id="y")
    await c.create("other", ticket_id="z")
    queued = await a.create("k", ticket_id="w")  # every slot is taken: it waits
    assert queued.state is TicketState.QUEUED
    await a.flush_usage({"k": (2, 8)})
    await b.flush_usage({"k": (1, 4), "other": (5, 5)})
    await asyncio.sleep(0.05)
    await a.tick()  # a heartbeat counts x's running time so far
    await b.release("y")  # w is admitted onto b's freed slot
    assert (await c.get("w")).replica == "b"
    await a.release("x")
    await b.release("w")
    await b.release("w")  # idempotent: nothing counted twice

    x_admitted, x_ended = await _ms(cluster.raw, "x", "admitted", "ended")
    y_admitted, y_ended = await _ms(cluster.raw, "y", "admitted", "ended")
    w_created, w_admitted, w_ended = await _ms(cluster.raw, "w", "created", "admitted", "ended")
    usage = await c.usage("k", 0.0)  # read on a third replica: the deployment's
    running = (x_ended - x_admitted) + (y_ended - y_admitted) + (w_ended - w_admitted)
    assert usage.totals.running_s == pytest.approx(running / 1000, abs=1e-9)
    assert usage.totals.queued_s == pytest.approx((w_admitted - w_created) / 1000, abs=1e-9)
    assert (usage.totals.sessions, usage.totals.chunks, usage.totals.frames) == (3, 3, 12)
    other = (await a.usage("other", 0.0)).totals
    assert (other.sessions, other.chunks, other.frames) == (1, 5, 5)
    totals = await b.usage_totals()
    assert totals["k"] == usage.totals  # all time == since the start of the retention, here
    assert usage.since == pytest.approx(usage.since // 3600 * 3600)  # a bucket's start
    await cluster.check()


async def test_a_killed_replicas_session_is_counted_up_to_its_last_heartbeat_once(cluster: Cluster) -> None:
    a, b, c = [await cluster.add(name) for name in ("a", "b", "c")]
    await a.create("k", ticket_id="x")
    await a.flush_usage({"k": (4, 16)})  # what a flushed before it died
    await asyncio.sleep(0.05)
    await a.tick()  # a heartbeat some time after the admission
    await a.aclose(deregister=False)  # SIGKILL: the heartbeat stops, nothing is released
    lost = await cluster.logs["b"].wait_for(SharedEventKind.LOST, "x", within=5)
    assert lost.ticket.failure == "replica_lost: a"
    admitted, ended = await _ms(cluster.raw, "x", "admitted", "ended")
    assert await cluster.raw.hget(f"{PREFIX}seen", "a") is None  # the reaper forgot it with the replica
    usage = (await c.usage("k", 0.0)).totals
    assert (usage.sessions, usage.chunks, usage.frames) == (1, 4, 16)
    # Billed up to a's last heartbeat: more than 0, and short of the reap by at least the TTL a stayed silent.
    assert 0 < usage.running_s * 1000 <= ended - admitted - 1000 * 0.9
    await asyncio.sleep(0.3)
    for replica in (b, c):
        await replica.tick()
    assert (await b.usage("k", 0.0)).totals == usage  # later passes count nothing more for it
    del cluster.replicas["a"]
    await cluster.check()


async def test_a_replica_reaped_while_stalled_counts_its_chunks_but_no_running_time_twice(cluster: Cluster) -> None:
    a = await cluster.add("a", replica_ttl_s=60.0, heartbeat_interval_s=30.0)  # a's heartbeat is slow on purpose
    b = await cluster.add("b")
    await a.create("k", ticket_id="x")
    await a.tick()
    await cluster.raw.delete(f"{PREFIX}replica:a")  # as if a had stalled past its TTL
    async with asyncio.timeout(5):
        while not cluster.logs["b"].of(SharedEventKind.LOST):
            await b.tick()
            await asyncio.sleep(0.05)
    after_reap = (await b.usage("k", 0.0)).totals

    await a.tick()  # a is back: it hears x was lost; the session still ran and produced a chunk meanwhile
    await a.flush_usage({"k": (1, 4)})
    await a.release("x")  # the service stopped the lost session: the ticket was released by the reaper already
    later = (await b.usage("k", 0.0)).totals
    assert later.running_s == after_reap.running_s
    assert (later.sessions, later.chunks, later.frames) == (1, 1, 4)
    await cluster.check()
