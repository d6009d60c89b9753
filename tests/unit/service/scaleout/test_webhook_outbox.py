"""The webhook outbox in a real redis-server, shared by two replicas: a delivery left pending by a replica that
vanished (claimed and never settled, or never claimed) is delivered by the other one, with the same event id and a
signature the client's helper verifies; while its holder lives, nobody else takes it; a stale holder's `done`
changes nothing once another replica claimed it."""

from __future__ import annotations

import asyncio
import time

from service.scaleout.webhook_outbox import RedisOutbox
from service.webhooks import Delivery, RetryPolicy, WebhookDispatcher, WebhookEvent
from tests.support.fakes.redis_server import RedisServer
from tests.support.webhook_receiver import webhook_receiver
from transport.client import SIGNATURE_HEADER, verify_webhook

SECRET = "whsec-test-0123456789"


def _delivery(url: str, name: str) -> Delivery:
    event = WebhookEvent(f"evt_{name}", "session.ended", time.time(), {"session_id": name})
    return Delivery(f"evt_{name}.0", event.id, url, event.body(), event.created_at)


def _outbox(server: RedisServer, replica: str) -> RedisOutbox:
    return RedisOutbox(server.url, replica, capacity=100, lease_s=0.4, handover_s=0.3, prefix="test:webhooks:")


async def test_what_a_lost_replica_left_pending_is_delivered_by_another(redis_server: RedisServer) -> None:
    lost = _outbox(redis_server, "replica-a")
    survivor = _outbox(redis_server, "replica-b")
    async with webhook_receiver() as receiver:
        claimed = _delivery(receiver.url, "claimed")
        queued = _delivery(receiver.url, "queued")
        assert await lost.put([claimed, queued]) == 0
        assert [d.id for d in await lost.claim(1)] == [claimed.id]  # it was sending this one when it vanished
        assert await survivor.claim(10) == []  # its holder may still be alive: not yet
        dispatcher = WebhookDispatcher(
            survivor, secret=SECRET.encode(), policy=RetryPolicy(max_attempts=2, first_delay_s=0.05), poll_s=0.05
        )
        await dispatcher.start()
        try:
            await receiver.wait_for(lambda: len(receiver.received) == 2, "both deliveries, by the survivor")
        finally:
            await dispatcher.aclose(grace_s=1.0)
        assert sorted(r.event["id"] for r in receiver.received) == ["evt_claimed", "evt_queued"]
        for request in receiver.received:
            verify_webhook(SECRET, request.body, request.headers[SIGNATURE_HEADER])
        await lost.done(claimed)  # the lost replica's late word changes nothing (and the survivor's stands)
        assert await lost.claim(10) == []  # (the survivor's outbox closed with its dispatcher)
        assert lost.statistics().pending == 0  # both delivered: nothing left in Redis
    await lost.aclose()


async def test_the_holder_settles_its_own_and_a_retry_comes_due_later(redis_server: RedisServer) -> None:
    outbox = _outbox(redis_server, "replica-a")
    other = _outbox(redis_server, "replica-b")
    delivery = _delivery("http://127.0.0.1:1/", "retried")
    await outbox.put([delivery])
    taken = await outbox.claim(10)
    assert [d.id for d in taken] == [delivery.id]
    await outbox.retry(taken[0].tried(), time.time() + 0.2)
    assert await outbox.claim(10) == []  # not due yet
    await asyncio.sleep(0.25)
    again = await outbox.claim(10)
    assert [d.attempts for d in again] == [1]
    await outbox.done(again[0])
    assert await outbox.claim(10) == []
    assert await other.claim(10) == []
    await outbox.aclose()
    await other.aclose()


async def test_a_full_outbox_refuses_the_newest(redis_server: RedisServer) -> None:
    outbox = RedisOutbox(redis_server.url, "replica-a", capacity=2, lease_s=1, handover_s=1, prefix="test:full:")
    dropped = await outbox.put([_delivery("http://127.0.0.1:1/", str(n)) for n in range(3)])
    assert (dropped, outbox.statistics().dropped) == (1, 1)
    assert sorted(d.event_id for d in await outbox.claim(10)) == ["evt_0", "evt_1"]
    await outbox.aclose()


async def test_a_stale_holders_word_changes_nothing_once_another_replica_claimed(redis_server: RedisServer) -> None:
    def outbox(replica: str) -> RedisOutbox:
        return RedisOutbox(redis_server.url, replica, capacity=10, lease_s=0.1, handover_s=0.1, prefix="test:stale:")

    stale, taker = outbox("replica-a"), outbox("replica-b")
    delivery = _delivery("http://127.0.0.1:1/", "stale")
    await stale.put([delivery])
    assert len(await stale.claim(10)) == 1
    await asyncio.sleep(0.25)  # its lease (0.1 s) and the hand-over (0.1 s) ran out
    assert len(await taker.claim(10)) == 1
    await stale.done(delivery)  # too late: the taker holds it now
    await stale.retry(delivery.tried(), time.time())
    assert await taker.claim(10) == []  # still leased to the taker, not re-queued by the stale word
    assert taker.statistics().pending == 1
    await taker.done(delivery)
    assert await taker.claim(10) == []
    assert taker.statistics().pending == 0
    await stale.aclose()
    await taker.aclose()
