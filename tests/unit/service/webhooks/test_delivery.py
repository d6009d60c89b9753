"""Webhook delivery through the real service (fake workers) to a real HTTP receiver on loopback: retried until it
answers 2xx with the same event id, each attempt signed so that the client's helper verifies it; a receiver that
never answers holds up no session; the deployment's and a create's own endpoints; the delivery metrics; the ended
event of a session lost with another replica."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import MappingProxyType

from service.api_keys import key_id
from service.runtime.records import LostSession
from service.runtime.sessions import SessionSnapshot, SessionState
from service.webhooks import Delivery, MemoryOutbox, RetryPolicy, WebhookDispatcher, WebhookEmitter, WebhookTargets
from tests.support.service_harness import RecordingTransport, metric, running_service
from tests.support.webhook_receiver import webhook_receiver
from transport.client import SIGNATURE_HEADER, verify_webhook

SECRET = "whsec-test-0123456789"


@asynccontextmanager
async def fast_webhooks(url: str, *, timeout_s: float = 5.0) -> AsyncIterator[WebhookEmitter]:
    """An emitter to `url` whose retries come after 50, 100, 200 ms (the settings' schedule starts at 1 s)."""
    dispatcher = WebhookDispatcher(
        MemoryOutbox(100, time.time),
        secret=SECRET.encode(),
        policy=RetryPolicy(max_attempts=4, first_delay_s=0.05, jitter=0.0),
        timeout_s=timeout_s,
        poll_s=0.05,
    )
    await dispatcher.start()
    try:
        yield WebhookEmitter(WebhookTargets(deployment=(url,)), dispatcher)
    finally:
        await dispatcher.aclose(grace_s=0.5)


async def test_a_receiver_that_fails_twice_gets_the_event_three_times_with_one_id_each_signed() -> None:
    async with (
        webhook_receiver(statuses=[500, 503]) as receiver,
        fast_webhooks(receiver.url) as emitter,
        running_service(transport=RecordingTransport(), events=emitter) as svc,
    ):
        sid = (await svc.create()).json()["id"]
        await receiver.wait_for(lambda: len(receiver.events("session.running")) == 3, "three tries of running")
        svc.world.emit(sid, 2)
        await svc.client.delete(f"/v1/sessions/{sid}", params={"mode": "cancel"})
        await receiver.wait_for(lambda: receiver.events("session.ended"), "the ended event")
        running = receiver.events("session.running")
        assert len({event["id"] for event in running}) == 1  # the same event, retried
        for request in receiver.received:
            event = verify_webhook(SECRET, request.body, request.headers[SIGNATURE_HEADER])
            assert event["data"]["session_id"] == sid  # type: ignore[index]
        ended = receiver.events("session.ended")[0]
        assert ended["data"]["status"] == "closed"
        assert ended["data"]["frames"] == 2
        assert ended["data"]["running_seconds"] >= 0
        assert ended["data"]["queued_seconds"] >= 0
        assert ended["created_at"] >= running[0]["created_at"]
        async with asyncio.timeout(5):
            await emitter.dispatcher.wait_idle()  # the last answer counted
        results = emitter.dispatcher.statistics().results
        assert (results["retried"], results["delivered"]) == (2, 2)


async def test_a_receiver_that_never_answers_holds_up_no_session() -> None:
    async with (
        webhook_receiver(hang=True) as receiver,
        fast_webhooks(receiver.url, timeout_s=0.3) as emitter,
        running_service(transport=RecordingTransport(), events=emitter) as svc,
    ):
        started = time.monotonic()
        sid = (await svc.create()).json()["id"]
        deleted = await svc.client.delete(f"/v1/sessions/{sid}", params={"mode": "cancel"})
        assert deleted.json()["status"] == "closed"
        assert time.monotonic() - started < 2.0  # the 0.3 s attempts run beside the session, never in its way
        await receiver.wait_for(lambda: len(receiver.received) >= 3, "the attempts to go on")
        assert emitter.dispatcher.statistics().results.get("retried", 0) >= 1


async def test_deployment_endpoints_through_the_settings_and_the_delivery_metrics() -> None:
    async with (
        webhook_receiver() as receiver,
        running_service(transport=RecordingTransport(), webhook_urls=receiver.url, webhook_secret=SECRET) as svc,
    ):
        first = (await svc.create()).json()["id"]
        queued = (await svc.create()).json()["id"]  # one slot: it waits
        await svc.client.delete(f"/v1/sessions/{queued}")
        await svc.client.delete(f"/v1/sessions/{first}", params={"mode": "cancel"})
        await receiver.wait_for(lambda: len(receiver.events("session.ended")) == 2, "two ended events")
        kinds = [(event["data"]["session_id"], event["type"]) for event in receiver.events()]
        assert (queued, "session.queued") in kinds
        assert (first, "session.running") in kinds
        ended = {event["data"]["session_id"]: event["data"] for event in receiver.events("session.ended")}
        assert (ended[queued]["status"], ended[queued]["running_seconds"]) == ("cancelled", 0.0)
        async with asyncio.timeout(5):
            await svc.app.state.webhooks.dispatcher.wait_idle()  # the last answers counted
        text = (await svc.client.get("/metrics")).text
        assert metric(text, 'lingstream_webhook_deliveries_total{result="delivered"}') >= 4
        assert metric(text, "lingstream_webhook_delivery_duration_seconds_count") >= 4
        assert receiver.url not in text
        assert SECRET not in text


async def test_a_creates_own_webhook_url_is_checked_against_the_allow_list() -> None:
    async with webhook_receiver() as receiver:
        prefix = receiver.url.rsplit("/", 1)[0] + "/"
        async with running_service(
            transport=RecordingTransport(),
            webhook_allowed_prefixes=prefix,
            webhook_allow_private=True,
            webhook_secret=SECRET,
        ) as svc:
            outside = await svc.create({"webhook_url": "http://127.0.0.1:1/elsewhere"})
            assert (outside.status_code, outside.json()["error"]["code"]) == (422, "webhook_url_not_allowed")
            created = await svc.create({"webhook_url": receiver.url})
            assert created.status_code == 201
            await receiver.wait_for(lambda: receiver.events("session.running"), "the running event")
        async with running_service(webhook_allowed_prefixes=prefix, webhook_secret=SECRET) as svc:
            loopback = await svc.create({"webhook_url": receiver.url})  # internal addresses not allowed
            assert loopback.status_code == 422
            assert "internal address" in loopback.json()["error"]["message"]


async def test_a_creates_url_that_resolves_internally_at_delivery_time_is_given_up_uncalled() -> None:
    async with webhook_receiver() as receiver:
        dispatcher = WebhookDispatcher(MemoryOutbox(10, time.time), secret=SECRET.encode(), poll_s=0.05)
        await dispatcher.start()
        try:
            # A create's URL checked public at the create, now resolving to loopback (DNS re-pointed).
            dispatcher.offer([Delivery("evt_x.0", "evt_x", receiver.url, b"{}", time.time(), guarded=True)])
            async with asyncio.timeout(5):
                await dispatcher.wait_idle()
        finally:
            await dispatcher.aclose(grace_s=0.1)
        assert receiver.received == []
        assert dispatcher.statistics().results == {"failed": 1}


async def test_a_failed_sessions_ended_event_carries_its_error_code() -> None:
    async with (
        webhook_receiver() as receiver,
        fast_webhooks(receiver.url) as emitter,
        running_service(transport=RecordingTransport(), events=emitter) as svc,
    ):
        sid = (await svc.create()).json()["id"]
        svc.world.fail(sid, "the fake model broke")
        await receiver.wait_for(lambda: receiver.events("session.ended"), "the ended event")
        data = receiver.events("session.ended")[0]["data"]
        assert data["status"] == "failed"
        assert data["error"]["code"] == (await svc.client.get(f"/v1/sessions/{sid}")).json()["error"]["code"]
        assert "the fake model broke" in data["error"]["message"]


async def test_a_session_lost_with_its_replica_ends_failed_with_its_times_and_unknown_frames() -> None:
    snapshot = SessionSnapshot(
        id="lost-1",
        state=SessionState.FAILED,
        reason="replica_lost: r1",
        queue_position=None,
        created_at=1000.0,
        updated_at=1030.0,
        transport=None,
        config=MappingProxyType({}),
        width=0,
        height=0,
        fps=0.0,
        error=("replica_lost", "the replica that ran the session (r1) stopped responding; the session was lost"),
        sequence=3,
    )
    async with webhook_receiver() as receiver, fast_webhooks(receiver.url) as emitter:
        lost = LostSession(snapshot, "key-a", None, running_from=1002.5, lost_at=1020.0)
        emitter.session_lost(lost)
        await receiver.wait_for(lambda: receiver.events("session.ended"), "the ended event")
        (delivered,) = receiver.answered_2xx
        event = verify_webhook(SECRET, delivered.body, delivered.headers[SIGNATURE_HEADER])
        assert event["type"] == "session.ended"
        assert event["data"] == {
            "session_id": "lost-1",
            "key_id": key_id("key-a"),
            "status": "failed",
            "reason": "replica_lost",
            "error": {"code": "replica_lost", "message": snapshot.error[1]},  # type: ignore[index]
            "queued_seconds": 2.5,
            "running_seconds": 17.5,  # to the lost replica's last heartbeat
            "frames": None,  # counted on the lost replica
        }
