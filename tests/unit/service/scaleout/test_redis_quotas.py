"""Per-key quotas with the shared admission: three replicas against one real redis-server race creates from one
key, and the quota (checked inside the create script, with the admission decision) is never exceeded, while
another key's creates are never refused for it. After every round the accounting is read from Redis directly."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator

import pytest

from admission import AdmissionConfig, IllegalTransitionError, KeyQuota, TicketReason, TicketState
from service.scaleout.admission import SharedTicketView
from tests.support.fakes.redis_server import RedisServer
from tests.support.redis_cluster import Cluster, open_cluster

pytestmark = pytest.mark.timeout(60)

GREEDY = KeyQuota(max_running=3, max_queued=1)


@pytest.fixture
async def quota_cluster(redis_server: RedisServer) -> AsyncIterator[Cluster]:
    config = AdmissionConfig(
        num_workers=1,
        max_sessions_per_worker=2,
        queue_size=8,
        queue_timeout=30.0,
        queue_heartbeat_timeout=None,
        key_quotas=(("greedy", GREEDY),),
    )
    async with open_cluster(redis_server, config) as cluster:
        yield cluster


def _quota_refusal(view: SharedTicketView) -> bool:
    return view.reason in (TicketReason.RUNNING_QUOTA, TicketReason.QUEUED_QUOTA)


async def test_racing_creates_of_one_key_on_three_replicas_never_exceed_its_quota(quota_cluster: Cluster) -> None:
    cluster = quota_cluster
    # A long liveness TTL: on a loaded machine a replica's heartbeat may come late, and this test is about quotas.
    replicas = [await cluster.add(name, replica_ttl_s=10.0, heartbeat_interval_s=0.5) for name in ("a", "b", "c")]
    rng = random.Random(20)
    created = 0
    for round_ in range(6):
        calls = []
        for _ in range(12):
            owner = "greedy" if rng.random() < 0.75 else f"other-{round_}"
            calls.append((owner, rng.choice(replicas).create(owner, ticket_id=f"t{created}")))
            created += 1
        views = await asyncio.gather(*(call for _, call in calls))
        snapshot = await cluster.check()  # includes: the owner sets equal the owner's live tickets
        greedy = [
            t for t in snapshot.tickets.values() if t["owner"] == "greedy" and t["state"] in ("queued", "admitted")
        ]
        assert len(greedy) <= 3
        assert sum(1 for t in greedy if t["state"] == "queued") <= 1
        for (owner, _), view in zip(calls, views, strict=True):
            if _quota_refusal(view):
                assert owner == "greedy", f"{owner} was refused for another key's quota"
                assert view.state is TicketState.REJECTED
                assert view.ticket_id not in snapshot.tickets  # a refusal leaves nothing in Redis
        # End some sessions (on the replica that holds them) so the next round races again.
        # Cancels first: a release admits the queue head, and only the holder may release an admitted ticket.
        for tid in snapshot.ids("queued"):
            if rng.random() < 0.3:
                with contextlib.suppress(IllegalTransitionError):  # a replica's maintenance admitted it meanwhile
                    await replicas[0].cancel(tid)
        for tid in snapshot.ids("admitted"):
            if rng.random() < 0.6:
                await cluster.replicas[snapshot.tickets[tid]["replica"]].release(tid)
        await cluster.check()
    statistics = [replica.statistics() for replica in replicas]
    assert sum(s.quota_rejected_total for s in statistics) > 0, "the race never reached the quota"


async def test_a_quota_refusal_takes_no_place_in_the_global_queue(quota_cluster: Cluster) -> None:
    cluster = quota_cluster
    a, b = await cluster.add("a"), await cluster.add("b")
    for tid in ("g1", "g2"):
        assert (await a.create("greedy", ticket_id=tid)).state is TicketState.ADMITTED
    for tid in ("x1", "x2"):
        assert (await b.create("x", ticket_id=tid)).state is TicketState.ADMITTED
    queued = await a.create("greedy", ticket_id="g3")
    assert (queued.state, queued.position) == (TicketState.QUEUED, 1)
    refused = await b.create("greedy", ticket_id="g4")
    assert (refused.state, refused.reason) == (TicketState.REJECTED, TicketReason.RUNNING_QUOTA)
    behind = await b.create("x", ticket_id="x3")
    assert (behind.state, behind.position) == (TicketState.QUEUED, 2)
    await a.release("g1")  # greedy's own ticket is next: it gets the slot
    assert (await b.get("g3")).state is TicketState.ADMITTED
    again = await b.create("greedy", ticket_id="g5")  # two running now: one may wait again, behind x3
    assert (again.state, again.position) == (TicketState.QUEUED, 2)
    assert (await a.create("greedy", ticket_id="g6")).reason is TicketReason.RUNNING_QUOTA
    await cluster.check()
