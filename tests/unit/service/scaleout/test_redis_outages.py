"""The Redis admission through network outages in which Redis keeps its data: a proxy (tests/support/fakes/tcp_proxy.py)
between one replica and a real redis-server refuses connections, loses requests or loses replies, in the middle of
a call. What must hold: the maintenance retries with its back-off and recovers; a release or create whose outcome
the replica could not learn is replayed or taken back once Redis answers, without telling listeners of a create
its caller was told failed; the event reader starts where the stream stood when the replica first reached Redis."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any

import pytest
from redis.asyncio import Redis

from admission import AdmissionConfig, TicketState
from service.errors import AdmissionUnavailableError
from service.scaleout.admission import CloseRequest, RedisAdmission, SharedEventKind
from service.scaleout.redis_side import SCRIPTS
from tests.support.fakes.clock import FakeClock
from tests.support.fakes.redis_server import RedisServer
from tests.support.fakes.tcp_proxy import TcpProxy
from tests.support.redis_cluster import PREFIX, CloseLog, EventLog, Snapshot, read_snapshot
from tests.support.waits import until

pytestmark = pytest.mark.timeout(60)

BACKOFF = (0.02, 0.16)
# A long TTL: the maintenance pass runs every 20 s, so within a test it runs only when something wakes it (an
# outage, a cancelled call), which is what these tests are about.
TTL = 60.0


@dataclass
class Setup:
    """Replica "a" reaches Redis through `proxy`; replica "b" directly (a witness that never loses Redis)."""

    server: RedisServer
    proxy: TcpProxy
    raw: Redis
    config: AdmissionConfig
    replicas: dict[str, RedisAdmission] = field(default_factory=dict)
    logs: dict[str, EventLog] = field(default_factory=dict)
    closes: dict[str, CloseLog] = field(default_factory=dict)

    def make(self, name: str, *, via_proxy: bool, **options: Any) -> RedisAdmission:
        settings: dict[str, Any] = {"prefix": PREFIX, "replica_ttl_s": TTL, "backoff_s": BACKOFF}
        settings.update(options)
        url = self.proxy.url if via_proxy else self.server.url
        replica = RedisAdmission(url, name, self.config, **settings)
        self.replicas[name] = replica
        self.logs[name] = EventLog()
        self.closes[name] = CloseLog()
        replica.subscribe(self.logs[name])
        replica.on_close_requested(self.closes[name])
        return replica

    async def start(self, name: str, *, via_proxy: bool, **options: Any) -> RedisAdmission:
        replica = self.make(name, via_proxy=via_proxy, **options)
        await replica.start()
        return replica

    async def snapshot(self) -> Snapshot:
        snapshot = await read_snapshot(self.raw)
        shapes = {name: (self.config.num_workers, self.config.max_sessions_per_worker) for name in self.replicas}
        snapshot.check(shapes, heartbeats=False)
        return snapshot

    def heard(self, name: str, ticket_id: str) -> list[SharedEventKind]:
        return [event.kind for event in self.logs[name].events if event.ticket.ticket_id == ticket_id]


@pytest.fixture
async def setup(redis_server: RedisServer) -> AsyncIterator[Setup]:
    config = AdmissionConfig(
        num_workers=1, max_sessions_per_worker=1, queue_size=8, queue_timeout=60.0, queue_heartbeat_timeout=None
    )
    raw = Redis.from_url(redis_server.url)
    for source in SCRIPTS.values():  # loaded, as on a Redis in use: a first call's NOSCRIPT is not what a test cuts
        await raw.script_load(source)
    async with TcpProxy(redis_server.port) as proxy:
        setup = Setup(redis_server, proxy, raw, config)
        try:
            yield setup
        finally:
            for replica in setup.replicas.values():
                await replica.aclose()
            await raw.aclose()


async def _state(raw: Redis, ticket_id: str) -> str | None:
    state = await raw.hget(f"{PREFIX}t:{ticket_id}", "state")
    return None if state is None else state.decode() if isinstance(state, bytes) else state


# ------------------------------------------------------------------------------------------ contact and back-off


async def test_the_outage_is_measured_from_when_contact_was_first_lost(setup: Setup) -> None:
    clock = FakeClock(100.0)
    a = setup.make("a", via_proxy=True, clock=clock)
    assert a.unavailable_for_s is None  # not started: no outage to report
    assert a.available is False
    setup.proxy.refuse()  # Redis is unreachable when the replica starts
    await a.start()
    assert a.available is False
    clock.advance(5.0)
    assert a.unavailable_for_s == 5.0
    with pytest.raises(AdmissionUnavailableError):
        await a.get("anything")  # another failure during the outage does not restart the count
    assert a.unavailable_for_s == 5.0

    setup.proxy.restore()
    await asyncio.wait_for(a.wait_available(), timeout=5)
    assert (a.available, a.unavailable_for_s, a.reconnections) == (True, None, 0)  # a first registration

    setup.proxy.refuse()
    clock.advance(1.0)
    with pytest.raises(AdmissionUnavailableError):
        await a.get("anything")
    assert a.available is False
    clock.advance(2.0)
    assert a.unavailable_for_s == 2.0  # from the loss, not from start
    setup.proxy.restore()
    await asyncio.wait_for(a.wait_available(), timeout=5)
    assert a.reconnections == 1


async def test_the_maintenance_retries_at_once_then_with_a_doubling_back_off_up_to_its_maximum(setup: Setup) -> None:
    a = await setup.start("a", via_proxy=True)
    assert a.available
    setup.proxy.refuse()  # the event reader's connection is cut: contact is lost, the maintenance retries
    retries = 10
    # Without back-off growth capped at 0.16 s these ten retries take 1.1 s; doubling without the cap, 10 s.
    await until(lambda: len(setup.proxy.attempts) >= retries, f"{retries} connection attempts", within=6.0)
    assert a.available is False
    gaps = [later - earlier for earlier, later in zip(setup.proxy.attempts, setup.proxy.attempts[1:], strict=False)]
    for index, gap in enumerate(gaps[: retries - 1]):
        assert gap >= min(BACKOFF[0] * 2**index, BACKOFF[1]) - 0.001, (index, gaps)
    setup.proxy.restore()
    await asyncio.wait_for(a.wait_available(), timeout=5)
    assert a.reconnections == 1


async def test_contact_lost_by_a_call_wakes_the_maintenance_at_once(setup: Setup) -> None:
    a = await setup.start("a", via_proxy=True, call_timeout_s=0.5)
    await a.create("k", ticket_id="x")
    setup.proxy.lose_requests()  # the event reader's connection stays open: only a call notices the outage
    with pytest.raises(AdmissionUnavailableError):
        async with asyncio.timeout(5):  # a regression that drops the call's own bound fails here, not at 60 s
            await a.get("x")  # times out after call_timeout_s
    assert a.available is False
    setup.proxy.restore()
    # The next pass is 20 s away: the call's own loss woke the maintenance, which retries until Redis answers.
    await asyncio.wait_for(a.wait_available(), timeout=5)
    assert (await a.get("x")).state is TicketState.ADMITTED


# ------------------------------------------------------------------------------ calls whose outcome was not heard


async def test_a_release_during_an_outage_is_replayed_once_redis_answers(setup: Setup) -> None:
    a = await setup.start("a", via_proxy=True)
    b = await setup.start("b", via_proxy=False)
    await b.create("k", ticket_id="y")
    await a.create("k", ticket_id="x")
    await a.create("k", ticket_id="q")
    setup.proxy.refuse()
    released = await a.release("x")  # the session ended: the release waits for Redis
    assert (released.ticket_id, released.state) == ("x", TicketState.RELEASED)
    assert a.available is False
    assert a.held() == {}
    assert await _state(setup.raw, "x") == "admitted"  # Redis never heard of it

    setup.proxy.restore()
    await asyncio.wait_for(a.wait_available(), timeout=5)
    snapshot = await setup.snapshot()
    assert snapshot.state("x") == "released"
    assert snapshot.held["a"] == {"q": 0}  # the replayed release gave x's slot to the head, as a release does
    assert a.held() == {"q": 0}
    await b.request_close("q", "drain")
    assert await setup.closes["a"].next() == CloseRequest("q", "drain", "b")
    assert setup.closes["a"].requests == [CloseRequest("q", "drain", "b")]  # a release, not a close of x


async def test_a_release_whose_reply_was_lost_is_not_repeated_and_the_head_it_admitted_is_learned(
    setup: Setup,
) -> None:
    a = await setup.start("a", via_proxy=True)
    b = await setup.start("b", via_proxy=False)
    await b.create("k", ticket_id="y")
    await a.create("k", ticket_id="x-reply-lost")
    await a.create("k", ticket_id="q")
    setup.proxy.lose_replies()
    setup.proxy.cut_at_reply_to(b"x-reply-lost")
    released = await a.release("x-reply-lost")  # Redis released it and admitted q here; the reply never came
    assert released.state is TicketState.RELEASED
    assert a.available is False
    snapshot = await setup.snapshot()
    assert (snapshot.state("x-reply-lost"), snapshot.held["a"]) == ("released", {"q": 0})
    assert a.held() == {}  # it does not know of q yet

    setup.proxy.restore()
    await asyncio.wait_for(a.wait_available(), timeout=5)
    assert a.held() == {"q": 0}  # the maintenance found a slot held here that no reply reported
    await setup.logs["a"].wait_for(SharedEventKind.ADMITTED, "q", replica="a")
    await b.create("k", ticket_id="fence")  # once A heard of it, A has read the whole stream up to it
    await setup.logs["a"].wait_for(SharedEventKind.QUEUED, "fence")
    assert setup.heard("a", "q").count(SharedEventKind.ADMITTED) == 1
    assert (await setup.snapshot()).held["a"] == {"q": 0}


async def test_a_cancelled_release_is_replayed_as_a_release(setup: Setup) -> None:
    a = await setup.start("a", via_proxy=True)
    b = await setup.start("b", via_proxy=False)
    await b.create("k", ticket_id="y")
    await a.create("k", ticket_id="x-cancelled")
    await a.create("k", ticket_id="q")
    setup.proxy.lose_requests()
    release = asyncio.create_task(a.release("x-cancelled"))
    await until(lambda: b"x-cancelled" in setup.proxy.lost_requests, "the proxy to lose x-cancelled's request")
    release.cancel()  # e.g. the DELETE's client went away
    with pytest.raises(asyncio.CancelledError):
        await release
    setup.proxy.restore()
    await until(lambda: _state_is(setup.raw, "x-cancelled", "released"), "x-cancelled to be released")
    await b.request_close("q", "drain")
    assert await setup.closes["a"].next() == CloseRequest("q", "drain", "b")
    assert setup.closes["a"].requests == [CloseRequest("q", "drain", "b")]  # nobody was asked to close x
    assert (await setup.snapshot()).held["a"] == {"q": 0}
    await until(lambda: dict(a.held()) == {"q": 0}, "A to hold q with no slot")


async def _state_is(raw: Redis, ticket_id: str, state: str) -> bool:
    return await _state(raw, ticket_id) == state


async def test_a_create_whose_reply_was_lost_is_taken_back_and_no_listener_hears_of_it(setup: Setup) -> None:
    a = await setup.start("a", via_proxy=True)
    await setup.start("b", via_proxy=False)
    setup.proxy.lose_replies()
    setup.proxy.cut_at_reply_to(b"lost-create")
    with pytest.raises(AdmissionUnavailableError):
        await a.create("k", ticket_id="lost-create")  # Redis admitted it; the caller heard "unavailable"
    assert await _state(setup.raw, "lost-create") == "admitted"

    setup.proxy.restore()
    await asyncio.wait_for(a.wait_available(), timeout=5)
    assert await _state(setup.raw, "lost-create") == "released"  # taken back before contact counts as regained
    assert (await a.create("k", ticket_id="after")).state is TicketState.ADMITTED  # its slot is free again
    await _fence(setup)
    assert setup.heard("a", "lost-create") == []
    await setup.snapshot()


async def test_a_cancelled_create_is_taken_back_and_no_listener_hears_of_it(setup: Setup) -> None:
    a = await setup.start("a", via_proxy=True)
    await setup.start("b", via_proxy=False)
    setup.proxy.lose_replies()
    create = asyncio.create_task(a.create("k", ticket_id="cancelled-create"))
    await until(lambda: _state_is(setup.raw, "cancelled-create", "admitted"), "cancelled-create to be admitted")
    create.cancel()  # the creating request was abandoned: its outcome is unknown here
    with pytest.raises(asyncio.CancelledError):
        await create
    setup.proxy.restore()
    await until(lambda: _state_is(setup.raw, "cancelled-create", "released"), "cancelled-create to be released")
    await _fence(setup)
    assert setup.heard("a", "cancelled-create") == []
    assert a.held() == {}
    await setup.snapshot()


async def _fence(setup: Setup) -> None:
    """B creates a ticket; once A's reader delivered it, A has read everything the stream held before it."""
    await setup.replicas["b"].create("k", ticket_id="fence")
    await setup.logs["a"].wait_for(SharedEventKind.ADMITTED, "fence", within=10)


async def test_a_drain_during_an_outage_reaches_redis_once_it_answers(setup: Setup) -> None:
    a = await setup.start("a", via_proxy=True)
    b = await setup.start("b", via_proxy=False)
    setup.proxy.refuse()
    assert await a.drain() == ()  # never raises for an outage
    assert a.available is False
    setup.proxy.restore()
    await asyncio.wait_for(a.wait_available(), timeout=5)
    overview = await b.shared_statistics()
    assert {r.replica_id: r.draining for r in overview.replicas} == {"a": True, "b": False}


async def test_slots_re_created_after_redis_lost_its_data_keep_their_creation_and_admission_times(
    setup: Setup,
) -> None:
    a = await setup.start("a", via_proxy=False)
    await a.create("k", ticket_id="run")
    queued = await a.create("k", ticket_id="x")
    await asyncio.sleep(0.005)  # so that x is admitted a few milliseconds after it was created
    await a.release("run")
    admitted = await a.wait_until_admitted("x")
    assert admitted.admitted_at != queued.created_at
    setup.server.restart()  # an empty Redis: A re-creates the records of the slots it holds
    await until(lambda: a.reconnections == 1, "A to reconnect")
    view = await a.get("x")
    assert (view.state, view.created_at, view.admitted_at) == (
        TicketState.ADMITTED,
        queued.created_at,
        admitted.admitted_at,
    )


# ----------------------------------------------------------------------------------------------- the event reader


async def test_events_from_before_start_are_not_delivered(setup: Setup) -> None:
    b = await setup.start("b", via_proxy=False)
    await b.create("k", ticket_id="old")
    await b.release("old")
    await setup.start("a", via_proxy=True)
    await b.create("k", ticket_id="new")
    await setup.logs["a"].wait_for(SharedEventKind.ADMITTED, "new", within=5)
    assert setup.heard("a", "old") == []  # the stream is read in order: "old" would have come first


async def test_a_close_request_sent_while_the_first_registration_went_unanswered_is_heard(setup: Setup) -> None:
    b = await setup.start("b", via_proxy=False)
    await b.create("k", ticket_id="y")
    await b.create("k", ticket_id="q")  # queued: B is full
    setup.proxy.refuse()
    a = await setup.start("a", via_proxy=True)  # Redis is unreachable when A starts
    setup.proxy.restore()
    # A's first registration admits q onto its free slot, and its reply is lost; q's client sends a DELETE to B.
    setup.proxy.cut_at_reply_to(hashlib.sha1(SCRIPTS["maintain"].encode()).hexdigest().encode())
    await until(lambda: _state_is(setup.raw, "q", "admitted"), "q to be admitted")
    assert a.available is False
    await b.request_close("q", "cancel")
    setup.proxy.restore()
    await asyncio.wait_for(a.wait_available(), timeout=5)
    assert a.held() == {"q": 0}
    assert await setup.closes["a"].next(within=5) == CloseRequest("q", "cancel", "b")


async def test_an_idle_event_reader_waits_on_redis_instead_of_polling(setup: Setup) -> None:
    await setup.start("a", via_proxy=False, replica_ttl_s=1.0, heartbeat_interval_s=0.1)

    async def calls(command: str) -> int:
        stats: dict[str, dict[str, int]] = await setup.raw.info("commandstats")
        return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))

    reads, passes = await calls("xread"), await calls("evalsha")
    # Three maintenance passes (0.1 s apart) measure the time: the reader blocks up to 1 s per read.
    await until(lambda: _more(calls("evalsha"), passes + 3), "three more maintenance passes")
    assert await calls("xread") - reads <= 2


async def _more(count: Awaitable[int], than: int) -> bool:
    return await count >= than
