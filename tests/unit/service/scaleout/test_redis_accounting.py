"""The Redis admission's answers read back exactly: worker filters, error details, totals and the events a replica
publishes (a real redis-server; written against mutation survivors)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable

import pytest
from redis.asyncio import Redis

from admission import (
    AdmissionClosedError,
    AdmissionConfig,
    AdmissionConfigError,
    IllegalTransitionError,
    TicketExistsError,
    TicketReason,
    TicketState,
    UnknownTicketError,
    UnknownWorkerError,
)
from service.config_records import SharedAdmissionConfig
from service.errors import SessionNotFoundError
from service.runtime.sessions import SessionSnapshot, SessionState
from service.scaleout.admission import (
    CloseRequest,
    NotTicketOwnerError,
    PauseRequest,
    RedisAdmission,
    SharedAdmissionEvent,
    SharedEventKind,
)
from service.scaleout.backend import RedisAdmissionBackend
from tests.support.fakes.redis_server import RedisServer
from tests.support.fakes.transport_timers import FakeTimers
from tests.support.service_harness import running_service
from tests.support.waits import until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def replica(redis_server: RedisServer) -> AsyncIterator[RedisAdmission]:
    config = AdmissionConfig(num_workers=2, max_sessions_per_worker=1, queue_size=1, queue_heartbeat_timeout=None)
    admission = RedisAdmission(redis_server.url, "a", config, prefix="acct:", replica_ttl_s=5.0)
    await admission.start()
    try:
        yield admission
    finally:
        await admission.aclose()


async def test_listing_by_worker_returns_only_that_workers_sessions(replica: RedisAdmission) -> None:
    first = await replica.create("k", ticket_id="one")
    second = await replica.create("k", ticket_id="two")
    assert {first.worker, second.worker} == {0, 1}
    for view in (first, second):
        assert view.worker is not None
        listed = await replica.list_tickets(worker=view.worker)
        assert [v.ticket_id for v in listed] == [view.ticket_id]


async def test_errors_carry_their_details(replica: RedisAdmission) -> None:
    with pytest.raises(UnknownWorkerError, match=r"worker index 5 is out of range: this instance has workers 0\.\.1"):
        replica.set_worker_healthy(5, False)
    await replica.create("k", ticket_id="run")
    with pytest.raises(IllegalTransitionError) as illegal:
        await replica.cancel("run")
    assert (illegal.value.ticket_id, illegal.value.old, illegal.value.new) == ("run", "admitted", "cancelled")
    assert "request_close()" in str(illegal.value)


async def test_totals_and_events_of_rejections_and_cancellations(replica: RedisAdmission) -> None:
    events: list[SharedAdmissionEvent] = []
    replica.subscribe(events.append)
    await replica.create("k", ticket_id="run-0")
    await replica.create("k", ticket_id="run-1")
    await replica.create("k", ticket_id="wait")
    rejected = await replica.create("k", ticket_id="late")
    assert (rejected.state, rejected.reason) == (TicketState.REJECTED, TicketReason.QUEUE_FULL)
    cancelled = await replica.cancel("wait")
    assert cancelled.state is TicketState.CANCELLED
    (rejection,) = [e for e in events if e.kind is SharedEventKind.REJECTED]
    assert (rejection.ticket.ticket_id, rejection.by) == ("late", "a")
    stats = replica.statistics()
    assert (stats.rejected_total, stats.cancelled_total, stats.queued_total) == (1, 1, 1)


async def test_the_registry_body_given_at_create_is_what_get_reads(replica: RedisAdmission) -> None:
    await replica.create("k", ticket_id="with-body", body='{"state": "queued"}')
    assert (await replica.get("with-body")).body == '{"state": "queued"}'


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"replica_id": "two words"}, "replica_id must be a non-empty word"),
        ({"replica_ttl_s": 3.0, "heartbeat_interval_s": 3.0}, r"need 0 < heartbeat_interval_s \(3.0\) < replica_ttl_s"),
        ({"finished_ttl_s": 0.5, "payload_ttl_s": 0.0}, "a TTL, call_timeout_s"),
        ({"events_maxlen": 99}, "a TTL, call_timeout_s, events_maxlen"),
        ({"connect_timeout_s": 0.0}, "backoff_s or connect_timeout_s is invalid"),
    ],
)
def test_settings_out_of_range_are_refused(options: dict[str, object], message: str) -> None:
    settings: dict[str, object] = {"replica_id": "a", **options}
    replica_id = str(settings.pop("replica_id"))
    with pytest.raises(AdmissionConfigError, match=message):
        RedisAdmission("redis://127.0.0.1:1/0", replica_id, AdmissionConfig(), **settings)  # type: ignore[arg-type]


def test_boundary_settings_are_accepted() -> None:
    RedisAdmission("redis://127.0.0.1:1/0", "a", AdmissionConfig(), finished_ttl_s=0.5, events_maxlen=100)


async def test_the_client_made_from_a_url_opens_connections_within_the_connect_timeout() -> None:
    default = RedisAdmission("redis://127.0.0.1:1/0", "a", AdmissionConfig())
    patient = RedisAdmission("redis://127.0.0.1:1/0", "b", AdmissionConfig(), connect_timeout_s=15.0)
    try:
        timeouts = [r.redis.connection_pool.connection_kwargs["socket_connect_timeout"] for r in (default, patient)]
        assert timeouts == [2.0, 15.0]
        assert [r.redis.connection_pool.connection_kwargs["socket_timeout"] for r in (default, patient)] == [None, None]
    finally:
        await default.aclose()
        await patient.aclose()


async def test_a_closed_backend_cannot_start_again(redis_server: RedisServer) -> None:
    admission = RedisAdmission(redis_server.url, "b", AdmissionConfig(), prefix="closed:")
    await admission.start()
    await admission.aclose()
    with pytest.raises(AdmissionClosedError, match=r"^the redis admission backend is closed$"):
        await admission.start()


async def test_views_and_the_overview_carry_every_field(replica: RedisAdmission) -> None:
    admitted = await replica.create("k", ticket_id="run")
    read = await replica.get("run")
    assert read.admitted_at is not None
    assert read.admitted_at == admitted.admitted_at
    assert read.as_ticket_view() == admitted.as_ticket_view()
    assert read.body is None  # no body was given: an empty field reads as None
    await replica.drain()
    overview = await replica.shared_statistics()
    (me,) = overview.replicas
    assert (me.replica_id, me.draining) == ("a", True)


async def _second(redis_server: RedisServer, name: str = "b") -> RedisAdmission:
    config = AdmissionConfig(num_workers=2, max_sessions_per_worker=1, queue_size=1, queue_heartbeat_timeout=None)
    other = RedisAdmission(redis_server.url, name, config, prefix="acct:", replica_ttl_s=5.0)
    await other.start()
    return other


async def test_payloads_statuses_and_close_requests_between_replicas(
    replica: RedisAdmission, redis_server: RedisServer
) -> None:
    other = await _second(redis_server)
    try:
        requests: list[CloseRequest] = []
        replica.on_close_requested(requests.append)
        await replica.create("k", ticket_id="run")
        await replica.create("k", ticket_id="run-2")
        await replica.create("k", ticket_id="wait", payload=b"queued request")
        assert await other.take_payload("wait") == b"queued request"  # a waiting ticket's payload is in Redis
        assert await other.take_payload("nothing") is None
        with pytest.raises(NotTicketOwnerError, match=r"admission ticket 'run' is held by replica 'a'"):
            await other.publish_status("run", "running")
        published = await replica.publish_status("run", "running", reason="started")
        assert (published.status, published.status_reason, published.body) == ("running", "started", None)
        await other.request_close("run", "cancel")
        await until(lambda: bool(requests), "a close request")
        assert requests == [CloseRequest("run", "cancel", "b")]
        released = await replica.release("run")
        assert (released.state, released.reason) == (TicketState.RELEASED, TicketReason.SESSION_ENDED)
    finally:
        await other.aclose()


async def test_queued_views_and_refusals_carry_their_fields(replica: RedisAdmission) -> None:
    before = time.time()
    await replica.create("k", ticket_id="run-0")
    await replica.create("k", ticket_id="run-1")
    queued = await replica.create("k", ticket_id="wait")
    assert (queued.state, queued.worker, queued.position) == (TicketState.QUEUED, None, 1)
    assert before - 1 <= queued.created_at <= time.time() + 1  # seconds, not milliseconds
    assert queued.as_ticket_view().queue_deadline == queued.queue_deadline is not None
    assert replica.statistics().max_sessions_per_worker == 1
    with pytest.raises(TicketExistsError, match="run-0"):
        await replica.create("k", ticket_id="run-0")
    with pytest.raises(UnknownTicketError, match="ghost"):
        await replica.get("ghost")
    await replica.drain()
    refused = await replica.create("owner-x", ticket_id="late")
    assert (refused.state, refused.reason, refused.owner) == (TicketState.REJECTED, TicketReason.DRAINING, "owner-x")


async def test_a_queued_payload_goes_to_the_replica_that_admits_it(replica: RedisAdmission) -> None:
    await replica.create("k", ticket_id="run-0")
    await replica.create("k", ticket_id="run-1")
    await replica.create("k", ticket_id="wait", payload=b"queued request")
    await replica.release("run-0")
    admitted = await asyncio.wait_for(replica.wait_until_admitted("wait"), timeout=5)
    assert (admitted.state, admitted.replica) == (TicketState.ADMITTED, "a")
    assert await replica.take_payload("wait") == b"queued request"


async def test_a_backend_drained_before_it_starts_only_remembers_it(redis_server: RedisServer) -> None:
    admission = RedisAdmission(redis_server.url, "c", AdmissionConfig(), prefix="early:")
    assert await admission.drain() == ()
    assert admission.draining


async def test_a_client_that_decodes_responses_is_refused(redis_server: RedisServer) -> None:
    client = Redis.from_url(redis_server.url, decode_responses=True)
    try:
        with pytest.raises(AdmissionConfigError, match="must not decode responses"):
            RedisAdmission(client, "d", AdmissionConfig())
    finally:
        await client.aclose()


async def test_refusals_and_session_lengths_are_accounted_for(replica: RedisAdmission) -> None:
    await replica.create("k", ticket_id="run-0")
    await replica.create("k", ticket_id="run-1")
    queued = await replica.create("k", ticket_id="wait")
    assert queued.as_ticket_view().position == queued.position == 1
    full = await replica.create("someone", ticket_id="late")
    assert (full.reason, full.owner) == (TicketReason.QUEUE_FULL, "someone")
    released = await replica.release("run-0")
    assert released.ended_at is not None
    assert released.admitted_at is not None
    stats = replica.statistics()
    assert stats.session_length.total_count == 1
    assert stats.session_length.max == pytest.approx(released.ended_at - released.admitted_at, abs=0.01)
    await replica.drain()
    for ticket_id in ("d1", "d2"):
        assert (await replica.create("k", ticket_id=ticket_id)).reason is TicketReason.DRAINING
    assert replica.statistics().rejected_draining_total == 2


async def test_a_refusal_for_a_full_queue_carries_the_redis_time_in_seconds(replica: RedisAdmission) -> None:
    await replica.create("k", ticket_id="run-0")
    await replica.create("k", ticket_id="run-1")
    await replica.create("k", ticket_id="wait")
    before = time.time()
    full = await replica.create("k", ticket_id="late")
    assert full.reason is TicketReason.QUEUE_FULL
    assert before - 1 <= full.created_at <= time.time() + 1
    assert full.ended_at == full.created_at


async def test_a_queued_tickets_deadlines_are_its_creation_plus_the_configured_timeouts(
    redis_server: RedisServer,
) -> None:
    config = AdmissionConfig(num_workers=1, queue_timeout=900.0, queue_heartbeat_timeout=300.0)
    admission = RedisAdmission(redis_server.url, "a", config, prefix="deadlines:", replica_ttl_s=5.0)
    await admission.start()
    try:
        await admission.create("k", ticket_id="run")
        queued = await admission.create("k", ticket_id="wait")
        assert queued.queue_deadline is not None
        assert queued.heartbeat_deadline is not None
        assert queued.queue_deadline - queued.created_at == pytest.approx(900.0, abs=1e-6)  # Redis keeps ms
        assert queued.heartbeat_deadline - queued.created_at == pytest.approx(300.0, abs=1e-6)
        beat = await admission.heartbeat("wait")
        assert beat.heartbeat_deadline is not None
        assert beat.heartbeat_deadline - queued.heartbeat_deadline < 5.0
    finally:
        await admission.aclose()


async def test_a_close_hook_unsubscribed_hears_no_more_requests(
    replica: RedisAdmission, redis_server: RedisServer
) -> None:
    other = await _second(redis_server)
    try:
        gone: list[CloseRequest] = []
        kept: list[CloseRequest] = []
        unsubscribe = replica.on_close_requested(gone.append)
        replica.on_close_requested(kept.append)
        unsubscribe()
        unsubscribe()  # idempotent
        await replica.create("k", ticket_id="run")
        await other.request_close("run", "drain")
        await until(lambda: bool(kept), "the kept hook to be called")  # the hooks are called in one pass
        assert (kept, gone) == ([CloseRequest("run", "drain", "b")], [])
    finally:
        await other.aclose()


async def test_a_create_nobody_overtook_costs_one_script_call(redis_server: RedisServer) -> None:
    """A queued create's position comes back with it; it is read again only if a departure was heard while the
    create was in flight (issue #17: script calls per create)."""
    config = AdmissionConfig(num_workers=1, queue_size=8, queue_heartbeat_timeout=None)
    # A long TTL: no maintenance pass (a script call) within the test.
    mine, theirs = (
        RedisAdmission(redis_server.url, name, config, prefix="calls:", replica_ttl_s=60.0) for name in ("a", "b")
    )
    raw = Redis.from_url(redis_server.url)
    events: list[SharedAdmissionEvent] = []
    mine.subscribe(events.append)

    def moved(ticket_id: str) -> bool:
        return any(e.kind is SharedEventKind.POSITION_CHANGED and e.ticket.ticket_id == ticket_id for e in events)

    async def script_calls() -> int:
        stats: dict[str, dict[str, int]] = await raw.info("commandstats")
        return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))

    try:
        await mine.start()
        await theirs.start()
        await mine.create("k", ticket_id="run-a")
        await theirs.create("k", ticket_id="run-b")
        await theirs.create("k", ticket_id="theirs-0")
        await theirs.create("k", ticket_id="theirs-1")
        mine.watch("theirs-0")  # the positions script is loaded and the follower idle
        await until(lambda: moved("theirs-0"), "theirs-0 to move")

        before = await script_calls()
        view = await mine.create("k", ticket_id="mine")
        assert (view.state, view.position) == (TicketState.QUEUED, 3)
        for _ in range(3):
            await asyncio.sleep(0)  # the position follower takes what the create left to read, if anything
        mine.watch("theirs-1")  # the follower's next read, which this test waits for
        await until(lambda: moved("theirs-1"), "theirs-1 to move")
        assert await script_calls() - before == 2  # the create, and the read of theirs-1's position
    finally:
        await mine.aclose()
        await theirs.aclose()
        await raw.aclose()


async def test_an_admitted_payload_stays_readable_in_redis_for_payload_ttl(
    redis_server: RedisServer, replica: RedisAdmission
) -> None:
    await replica.create("k", ticket_id="run-0")
    await replica.create("k", ticket_id="run-1")
    await replica.create("k", ticket_id="wait", payload=b"queued request")
    await replica.release("run-0")  # admits "wait" here
    assert (await replica.get("wait")).state is TicketState.ADMITTED
    raw = Redis.from_url(redis_server.url)
    other = await _second(redis_server)  # it never saw the reply that carried the payload
    try:
        assert await other.take_payload("wait") == b"queued request"
        ttl_ms = await raw.pttl("acct:p:wait")
        assert 100_000 < ttl_ms <= 120_000  # payload_ttl_s (120 s) from the admission
    finally:
        await other.aclose()
        await raw.aclose()


async def test_the_overview_counts_every_session_on_a_worker(redis_server: RedisServer) -> None:
    config = AdmissionConfig(num_workers=1, max_sessions_per_worker=2, queue_heartbeat_timeout=None)
    admission = RedisAdmission(redis_server.url, "a", config, prefix="overview:", replica_ttl_s=5.0)
    await admission.start()
    try:
        await admission.create("k", ticket_id="one")
        await admission.create("k", ticket_id="two")
        (me,) = (await admission.shared_statistics()).replicas
        assert me.retained == (2,)
    finally:
        await admission.aclose()


async def test_a_get_of_a_session_queued_elsewhere_is_one_round_trip(redis_server: RedisServer) -> None:
    """GET of a session in the shared queue on a replica with no record of it: the record, its live position and
    its heartbeat come back in one script call, the only command the replica sends (issue #17). Another key's GET
    is a 404 that leaves the heartbeat deadline where it was."""
    config = AdmissionConfig(num_workers=1, queue_size=8, queue_heartbeat_timeout=30.0)
    # A long TTL: no maintenance pass within the test.
    creator = RedisAdmission(redis_server.url, "a", config, prefix="get:", replica_ttl_s=60.0)
    backend = RedisAdmissionBackend(redis_server.url, SharedAdmissionConfig("b", 60.0), config, prefix="get:")
    raw = Redis.from_url(redis_server.url)
    watcher = Redis.from_url(redis_server.url)

    async def server_ms() -> int:
        seconds, micros = await raw.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def deadline() -> int:
        return int(await raw.hget("get:t:wait", "hbdl") or 0)

    async def commands_sent(call: Awaitable[object]) -> tuple[object, list[str]]:
        """`call`'s outcome and the commands clients other than Lua sent while it ran (MONITOR, up to a marker)."""
        async with watcher.monitor() as monitor:
            await raw.echo("start")
            while "start" not in (await monitor.next_command())["command"]:
                pass
            try:
                outcome: object = await call
            except SessionNotFoundError as exc:
                outcome = exc
            await raw.echo("end")
            sent: list[str] = []
            while "end" not in (line := await monitor.next_command())["command"]:
                if line["client_type"] != "lua":
                    sent.append(str(line["command"]).split(" ", 1)[0].upper())
        return outcome, sent

    try:
        await creator.start()
        await backend.admission.start()
        await backend.admission.create("k", ticket_id="run-b")  # b's slot, so nothing queued goes to b
        await creator.create("k", ticket_id="run")
        await creator.create("k", ticket_id="ahead")
        created = await creator.create("k", ticket_id="wait")
        assert created.heartbeat_deadline is not None
        # Until Redis's clock is past the create, so that a heartbeat now would move the deadline.
        while await server_ms() <= round(created.heartbeat_deadline * 1000) - 30_000:  # noqa: ASYNC110 - a clock
            await asyncio.sleep(0.001)
        before = await deadline()

        foreign, sent = await commands_sent(backend.lookup("other-key", "wait"))
        assert isinstance(foreign, SessionNotFoundError)
        assert sent == ["EVALSHA"]
        assert await deadline() == before  # another key's GET is no heartbeat

        unknown, sent = await commands_sent(backend.lookup("k", "nobody"))
        assert isinstance(unknown, SessionNotFoundError)
        assert sent == ["EVALSHA"]

        pushed_from = await server_ms()
        answer, sent = await commands_sent(backend.lookup("k", "wait"))
        assert sent == ["EVALSHA"]  # one round trip: record, position (ZRANK) and heartbeat in one script
        assert isinstance(answer, SessionSnapshot)
        assert (answer.id, answer.state, answer.queue_position) == ("wait", SessionState.QUEUED, 2)
        assert await deadline() >= pushed_from + 30_000 > before  # the GET was the session's heartbeat

        await creator.cancel("ahead")
        answer, sent = await commands_sent(backend.lookup("k", "wait"))
        assert sent == ["EVALSHA"]
        assert isinstance(answer, SessionSnapshot)
        assert answer.queue_position == 1  # live: the departure ahead of it is already counted
        await creator.release("run")  # admits "wait" onto a's freed slot
        answer, sent = await commands_sent(backend.lookup("k", "wait"))
        assert sent == ["EVALSHA"]
        assert isinstance(answer, SessionSnapshot)
        assert (answer.state, answer.queue_position) == (SessionState.ADMITTED, None)
    finally:
        await backend.admission.aclose()
        await creator.aclose()
        await raw.aclose()
        await watcher.aclose()


async def test_pause_and_resume_requests_reach_the_owner_from_another_replica(
    replica: RedisAdmission, redis_server: RedisServer
) -> None:
    other = await _second(redis_server)
    try:
        requests: list[PauseRequest] = []
        replica.on_pause_requested(requests.append)
        await replica.create("k", ticket_id="run-0")
        await replica.create("k", ticket_id="run-1")
        await other.create("k", ticket_id="run-2")
        await other.create("k", ticket_id="run-3")
        await replica.create("k", ticket_id="wait")  # every slot is taken: it waits
        code, view = await other.request_pause("run-0", True)
        assert (code, view.ticket_id, view.state) == ("requested", "run-0", TicketState.ADMITTED)
        await other.request_pause("run-0", False)
        await until(lambda: len(requests) == 2, "two close requests")
        assert requests == [PauseRequest("run-0", True, "b"), PauseRequest("run-0", False, "b")]
        assert (await other.request_pause("wait", True))[0] == "queued"  # nothing to pause yet
        await replica.release("run-1")
        assert (await other.request_pause("run-1", True))[0] == "ok"  # finished: a no-op
    finally:
        await other.aclose()


async def test_the_owner_keeps_a_sessions_pause_in_its_ticket_from_pause_to_resume(redis_server: RedisServer) -> None:
    """A service on the redis backend (the owner): its status write of a pause keeps when the pause began in the
    session's ticket (the Redis clock, `paused`: what the reaper orphans it with if this replica is lost, issue #33),
    the same instant in every later write while paused; the resume's write deletes it; none is left at the end."""
    raw = Redis.from_url(redis_server.url)
    try:
        async with running_service(admission_backend="redis", redis_url=redis_server.url, timers=FakeTimers()) as svc:
            sid = (await svc.create()).json()["id"]
            (key,) = await raw.keys(f"*t:{sid}")

            async def paused() -> int | None:
                value = await raw.hget(key, "paused")
                return None if value is None else int(value)

            assert await paused() is None
            seconds, micros = await raw.time()
            assert (await svc.client.post(f"/v1/sessions/{sid}/pause")).json()["status"] == "paused"
            await until(lambda: _status_is(raw, key, b"paused"), "the pause written")
            began = await paused()
            assert began is not None
            assert abs(began - (seconds * 1000 + micros // 1000)) < 2000  # the pause's start, on the Redis clock
            assert (await svc.client.post(f"/v1/sessions/{sid}/resume")).json()["status"] == "running"
            await until(lambda: _status_is(raw, key, b"running"), "the resume written")
            assert await paused() is None
            assert (await svc.client.post(f"/v1/sessions/{sid}/pause")).status_code == 200
            await until(lambda: _status_is(raw, key, b"paused"), "the second pause written")
            assert (await paused() or 0) >= began  # a new pause, counted from itself
            await svc.client.delete(f"/v1/sessions/{sid}")
            await until(lambda: _status_is(raw, key, b"closed"), "the end written")
            assert await paused() is None
    finally:
        await raw.aclose()


async def _status_is(raw: Redis, key: bytes | str, status: bytes) -> bool:
    return bool(await raw.hget(key, "status") == status)


async def test_the_overview_carries_each_workers_health(replica: RedisAdmission) -> None:
    replica.set_worker_healthy(1, False)
    await replica.tick()  # the maintenance pass tells Redis
    (me,) = (await replica.shared_statistics()).replicas
    assert me.healthy == (True, False)
