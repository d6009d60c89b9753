"""Adoption on replica loss and hand-off, at the level of the Lua scripts on a real redis-server (issue #33;
docs/continuity.md): a lost replica's adoptable sessions with a checkpoint wait as orphans instead of failing;
racing adopters, exactly one wins and the slot moves with it; orphans go ahead of the queue; one without its
checkpoint, or that waits too long, fails `replica_lost` as before (told once, as lost, to the adopt caller's
reaped listeners); one stopped while waiting ends closed; nobody
adopts while Redis is unreachable; a drained owner hands off; the stale owner that comes back learns it lost the
session. Every step keeps the admission invariants (`Cluster.check`), orphans included."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from admission import AdmissionConfig, TicketState
from service.errors import AdmissionUnavailableError
from service.scaleout.admission import NotTicketOwnerError, RedisAdmission, SharedEventKind, SharedTicketView
from service.scaleout.ownership import adoption_paused_s
from tests.support.redis_cluster import PREFIX, Cluster

pytestmark = pytest.mark.timeout(60)


async def _checkpointed(cluster: Cluster, replica: RedisAdmission, ticket_id: str) -> None:
    """What the owner does once its session's first checkpoint is in Redis: the checkpoint, then the mark (which
    keeps the create payload, here written by hand: these tickets were created without one)."""
    await cluster.raw.set(f"{PREFIX}ckpt:h:{ticket_id}", b"{}", px=60_000)
    await cluster.raw.set(f"{PREFIX}p:{ticket_id}", b"{}", px=60_000)
    assert await replica.mark_adoptable(ticket_id)
    assert await cluster.raw.pttl(f"{PREFIX}p:{ticket_id}") == -1  # kept while the session runs


async def _lose(cluster: Cluster, name: str) -> None:
    """SIGKILL: no release, no deregistration, the heartbeat stops."""
    await cluster.replicas[name].aclose(deregister=False)
    del cluster.replicas[name]


async def _orphaned(cluster: Cluster, watcher: RedisAdmission, ticket_id: str) -> None:
    async with asyncio.timeout(10):
        while await cluster.raw.zscore(f"{PREFIX}orphans", ticket_id) is None:
            await watcher.tick()
            await asyncio.sleep(0.05)


async def _orphan_of(cluster: Cluster, *others: str, **options: Any) -> list[RedisAdmission]:
    """The opening of the loss tests: session x created on replica a and checkpointed (marked adoptable), replicas
    `others` added (with `options`), then a lost and x orphaned (the first other replica's maintenance pass).
    Returns the other replicas, in order."""
    a = await cluster.add("a")
    await a.create("k", ticket_id="x")
    await _checkpointed(cluster, a, "x")
    added = [await cluster.add(name, **options) for name in others]
    await _lose(cluster, "a")
    await _orphaned(cluster, added[0], "x")
    return added


async def test_racing_adopters_exactly_one_wins_and_the_slot_moves_with_it(cluster: Cluster) -> None:
    others = await _orphan_of(cluster, "b", "c", "d")
    view = await others[0].get("x")
    assert (view.state, view.replica, view.status, view.failure) == (TicketState.ADMITTED, "a", "recovering", None)
    await cluster.check()

    results = await asyncio.gather(*(replica.adopt(30.0, 4) for replica in others))
    winners = [replica.replica_id for replica, (adopted, _) in zip(others, results, strict=True) if adopted]
    assert len(winners) == 1, results
    (winner,) = winners
    (adopted,), failed = results[["b", "c", "d"].index(winner)]
    assert (adopted.ticket_id, adopted.replica, adopted.state, failed) == ("x", winner, TicketState.ADMITTED, [])
    assert adopted.orphan_reason == "replica_lost"  # the cause its adopter counts its recovery under
    assert cluster.replicas[winner].held() == {"x": 0}
    snapshot = await cluster.check()
    assert snapshot.orphans == []
    assert snapshot.held[winner] == {"x": 0}
    await cluster.logs["b"].wait_for(SharedEventKind.ADOPTED, "x")

    await cluster.replicas[winner].release("x")  # the adopter ends it as any owner does: the slot goes back once
    assert (await others[0].get("x")).state is TicketState.RELEASED
    await cluster.check()


async def test_a_session_not_marked_or_without_a_checkpoint_fails_replica_lost_as_before(cluster: Cluster) -> None:
    a = await cluster.add("a", config=AdmissionConfig(num_workers=1, max_sessions_per_worker=3, queue_size=8))
    for tid in ("marked", "unmarked", "stale"):
        await a.create("k", ticket_id=tid)
    await _checkpointed(cluster, a, "marked")
    await cluster.raw.set(f"{PREFIX}ckpt:h:unmarked", b"{}")  # a checkpoint, but the owner never marked it
    assert not await a.mark_adoptable("nobody")
    await _checkpointed(cluster, a, "stale")
    b = await cluster.add("b", config=AdmissionConfig(num_workers=1, max_sessions_per_worker=3, queue_size=8))
    await cluster.raw.delete(f"{PREFIX}ckpt:h:stale")  # its checkpoint expired before the reaper came
    await _lose(cluster, "a")
    await _orphaned(cluster, b, "marked")
    assert (await b.get("unmarked")).failure == "replica_lost: a"
    assert (await b.get("stale")).failure == "replica_lost: a"
    assert (await cluster.check()).orphans == ["marked"]


async def test_an_orphan_whose_checkpoint_is_gone_or_that_waits_too_long_fails(cluster: Cluster) -> None:
    config = AdmissionConfig(num_workers=1, max_sessions_per_worker=2, queue_size=8)
    a = await cluster.add("a", config=config)
    for tid in ("x", "y"):
        await a.create("k", ticket_id=tid)
        await _checkpointed(cluster, a, tid)
    b = await cluster.add("b", config=AdmissionConfig(num_workers=1, max_sessions_per_worker=1, queue_size=8))
    await b.create("k", ticket_id="busy")  # b has no free slot: nobody can adopt
    told: list[SharedTicketView] = []
    b.on_sessions_reaped(told.append)  # the sessions b declares lost (their session.ended goes out from b)
    await _lose(cluster, "a")
    await _orphaned(cluster, b, "y")
    assert told == []  # an orphan is not lost (yet)
    await cluster.raw.delete(f"{PREFIX}ckpt:h:x")  # expired while it waited
    adopted, failed = await b.adopt(30.0, 4)
    assert adopted == []
    assert [(v.ticket_id, v.failure) for v in failed] == [
        ("x", "replica_lost: a (no checkpoint to rebuild the session from)")
    ]
    await asyncio.sleep(0.15)
    adopted, failed = await b.adopt(0.1, 4)
    assert [(v.ticket_id, v.state, v.status) for v in failed] == [("y", TicketState.RELEASED, "failed")]
    assert failed[0].failure == "replica_lost: a (no replica adopted the session in time)"
    assert [view.ticket_id for view in told] == ["x", "y"]  # each once, when it failed
    assert all(view.last_seen_at is not None for view in told)  # a's last heartbeat, kept by the reaper
    assert (await cluster.check()).orphans == []


async def test_orphans_go_ahead_of_the_queue(cluster: Cluster) -> None:
    a = await cluster.add("a")
    await a.create("k", ticket_id="x")
    await _checkpointed(cluster, a, "x")
    b = await cluster.add("b")
    await b.create("k", ticket_id="y")
    await _lose(cluster, "a")
    await _orphaned(cluster, b, "x")
    assert (await b.create("k", ticket_id="q")).state is TicketState.QUEUED
    await b.release("y")  # a slot frees: the queue head does not take it while an orphan waits
    assert (await b.get("q")).state is TicketState.QUEUED
    assert b.held() == {}
    c = await cluster.add("c")  # a new replica's registration admits nothing either
    assert (await c.get("q")).state is TicketState.QUEUED
    await cluster.check()
    adopted, _ = await b.adopt(30.0, 4)
    assert [v.ticket_id for v in adopted] == ["x"]
    assert (await c.wait_until_admitted("q")).replica == "c"  # c's next pass: no orphan left, the head goes
    await cluster.check()


async def test_a_session_stopped_while_waiting_for_an_adopter_ends_closed_and_nobody_adopts_it(
    cluster: Cluster,
) -> None:
    (b,) = await _orphan_of(cluster, "b")
    await b.request_close("x", "drain")  # the client's DELETE reached b: nobody runs it, it ends now
    view = await b.get("x")
    assert (view.state, view.status, view.failure) == (TicketState.RELEASED, "closed", None)
    assert await b.adopt(30.0, 4) == ([], [])
    assert b.held() == {}
    assert (await cluster.check()).orphans == []


async def test_nobody_adopts_while_redis_is_unreachable_and_one_does_once_it_is_back(cluster: Cluster) -> None:
    (b,) = await _orphan_of(cluster, "b", call_timeout_s=0.3)
    await cluster.raw.client_pause(1500)  # an outage that keeps the data (every client waits)
    with pytest.raises(AdmissionUnavailableError):
        await b.adopt(30.0, 4)  # times out at the client; Redis runs it once the pause ends, or the next call does
    assert b.held() == {}
    async with asyncio.timeout(10):
        while b.held() != {"x": 0}:  # the adoption is learnt from its event, whichever call made it
            try:
                await b.adopt(30.0, 4)
            except AdmissionUnavailableError:
                await asyncio.sleep(0.1)
    event = await cluster.logs["b"].wait_for(SharedEventKind.ADOPTED, "x")
    assert event.ticket.replica == "b"
    assert len(cluster.logs["b"].of(SharedEventKind.ADOPTED)) == 1
    await cluster.check()


async def test_a_draining_owner_hands_off_and_a_stale_owner_learns_its_session_went_on_elsewhere(
    cluster: Cluster,
) -> None:
    a = await cluster.add("a")
    await a.create("k", ticket_id="x")
    b = await cluster.add("b")
    assert await a.hand_off("x") == "no_checkpoint"  # nothing to rebuild from: it stays a's
    await cluster.raw.set(f"{PREFIX}ckpt:h:x", b"{}")
    await cluster.raw.set(f"{PREFIX}p:x", b"{}")
    assert await a.hand_off("x") == "ok"
    assert a.held() == {}
    assert (await cluster.check()).orphans == ["x"]
    adopted, _ = await b.adopt(30.0, 4)
    assert [(v.ticket_id, v.replica) for v in adopted] == [("x", "b")]
    with pytest.raises(NotTicketOwnerError):
        await a.publish_status("x", "running")  # a's copy cannot write over the adopter's status
    await cluster.check()

    # A replica that stalled past its TTL while its session was adopted: its next pass hears it lost the session.
    c = await cluster.add("c", replica_ttl_s=60.0, heartbeat_interval_s=30.0)
    await b.release("x")
    await c.create("k", ticket_id="z")
    await _checkpointed(cluster, c, "z")
    await cluster.raw.delete(f"{PREFIX}replica:c")
    await _orphaned(cluster, b, "z")
    adopted, _ = await b.adopt(30.0, 4)
    assert [v.ticket_id for v in adopted] == ["z"]
    await c.tick()
    lost = await cluster.logs["c"].wait_for(SharedEventKind.LOST, "z")
    assert lost.ticket.failure == "replica_lost: c (the session went on elsewhere)"
    with pytest.raises(NotTicketOwnerError):
        await c.release("z")  # c stops its copy: b's slot stays b's
    assert b.held() == {"z": 0}
    await cluster.check()


async def test_a_draining_owner_hands_off_only_when_another_live_replica_has_room_beyond_the_waiting_orphans(
    cluster: Cluster,
) -> None:
    """`hand_off_room` writes nothing: room is a free healthy slot on a live replica other than the caller that
    is not draining, less the orphans already waiting for one."""
    config = AdmissionConfig(num_workers=1, max_sessions_per_worker=2, queue_size=8)
    a = await cluster.add("a", config=config)
    for tid in ("x", "y"):
        await a.create("k", ticket_id=tid)
        await _checkpointed(cluster, a, tid)
    assert await a.hand_off_room("x") == "nowhere"  # a's own free slots do not count; no other replica
    b = await cluster.add("b")
    await b.create("k", ticket_id="busy")
    assert await a.hand_off_room("x") == "nowhere"  # b is full
    c = await cluster.add("c")
    await c.drain()
    assert await a.hand_off_room("x") == "nowhere"  # c drains too
    d = await cluster.add("d")
    assert await a.hand_off_room("x") == "ok"
    assert a.held() == {"x": 0, "y": 0}  # the check moved nothing
    assert await a.hand_off("x") == "ok"
    assert await a.hand_off_room("y") == "nowhere"  # d's one slot is x's, which waits for it
    assert await b.hand_off_room("x") == "elsewhere"  # not b's
    adopted, _ = await d.adopt(30.0, 4)
    assert [v.ticket_id for v in adopted] == ["x"]
    assert await a.hand_off_room("y") == "nowhere"
    await cluster.check()


async def test_a_handed_off_session_whose_adopter_dies_mid_adoption_is_orphaned_again_and_adopted_once(
    cluster: Cluster,
) -> None:
    a = await cluster.add("a")
    await a.create("k", ticket_id="x")
    await _checkpointed(cluster, a, "x")
    b = await cluster.add("b")
    c = await cluster.add("c")
    assert await a.hand_off("x") == "ok"
    view = await c.get("x")
    assert (view.status, view.status_reason) == ("recovering", "replica_draining")
    handed_at = view.orphaned_at
    assert handed_at is not None
    adopted, _ = await b.adopt(30.0, 4)
    assert [v.ticket_id for v in adopted] == ["x"]
    # The adopter learns why and when the session left its replica (its recovery's cause and start), from the
    # adopt reply and from the adopted event alike.
    assert (adopted[0].orphan_reason, adopted[0].orphaned_at) == ("replica_draining", handed_at)
    assert adopted[0].adopted_at is not None
    assert adopted[0].adopted_at >= handed_at
    told = (await cluster.logs["c"].wait_for(SharedEventKind.ADOPTED, "x")).ticket
    assert (told.replica, told.orphan_reason, told.orphaned_at) == ("b", "replica_draining", handed_at)
    await _lose(cluster, "b")  # b dies before it rebuilt the session: its slot holds x, its liveness lapses
    await _orphaned(cluster, c, "x")
    view = await c.get("x")
    assert (view.status_reason, view.orphan_reason) == ("replica_lost", "replica_lost")
    assert view.orphaned_at is not None
    assert view.orphaned_at > handed_at
    await cluster.check()
    adopted, _ = await c.adopt(30.0, 4)
    assert [(v.ticket_id, v.replica, v.orphan_reason) for v in adopted] == [("x", "c", "replica_lost")]
    lost_seen, lost_at = adopted[0].last_seen_at, adopted[0].orphaned_at
    assert lost_seen is not None
    assert lost_at is not None
    assert lost_seen <= lost_at  # b's last heartbeat, then the reaper orphaned x
    assert await c.adopt(30.0, 4) == ([], [])  # once
    assert len(cluster.logs["c"].of(SharedEventKind.ADOPTED)) == 2  # b's, then c's
    await c.release("x")
    assert (await c.get("x")).state is TicketState.RELEASED
    snapshot = await cluster.check()
    assert (snapshot.orphans, c.held()) == ([], {})


async def test_a_hand_off_made_while_redis_is_unreachable_moves_nothing_and_is_made_once_it_is_back(
    cluster: Cluster,
) -> None:
    a = await cluster.add("a", call_timeout_s=0.3)
    await a.create("k", ticket_id="x")
    await _checkpointed(cluster, a, "x")
    b = await cluster.add("b")
    await cluster.raw.client_pause(1500)
    with pytest.raises(AdmissionUnavailableError):
        await a.hand_off_room("x")
    with pytest.raises(AdmissionUnavailableError):
        await a.hand_off("x")  # times out at the client: Redis may still run it once the pause ends
    async with asyncio.timeout(10):
        while True:
            try:
                code = await a.hand_off("x")
                break
            except AdmissionUnavailableError:
                await asyncio.sleep(0.1)
    assert code in ("ok", "elsewhere")  # "elsewhere": the call that timed out ran after all; orphaned once
    assert (await cluster.check()).orphans == ["x"]
    adopted, _ = await b.adopt(30.0, 4)
    assert [v.ticket_id for v in adopted] == ["x"]
    await cluster.check()


async def test_a_session_handed_off_paused_carries_when_its_pause_began_to_its_adopter_and_no_further(
    cluster: Cluster,
) -> None:
    """`hand_off(..., paused_for_s=)` keeps the pause's start on the Redis clock (`paused_at`): the adopter reads it
    from the adopt reply and from the adopted event, counts the pause from there; a later orphaning of the session
    running drops it; reaped, it keeps what the last status held (its adopter had not resumed it: still paused)."""
    a = await cluster.add("a")
    await a.create("k", ticket_id="x")
    await _checkpointed(cluster, a, "x")
    b = await cluster.add("b")
    assert await a.hand_off("x", paused_for_s=12.5) == "ok"
    view = await b.get("x")
    assert (view.status, view.status_reason) == ("recovering", "replica_draining")
    assert view.orphaned_at is not None
    assert view.paused_at == pytest.approx(view.orphaned_at - 12.5, abs=0.002)  # 12.5 s before the hand-off
    adopted, _ = await b.adopt(30.0, 4)
    assert [(v.ticket_id, v.paused_at) for v in adopted] == [("x", view.paused_at)]
    told = (await cluster.logs["b"].wait_for(SharedEventKind.ADOPTED, "x")).ticket
    assert told.paused_at == view.paused_at
    await cluster.check()

    # b resumed it, then drains in turn and hands it off running: no pause goes with it.
    c = await cluster.add("c")
    assert await b.hand_off("x") == "ok"
    adopted, _ = await c.adopt(30.0, 4)
    assert [(v.ticket_id, v.paused_at) for v in adopted] == [("x", None)]
    # Paused again on c, handed off again, and its adopter d dies before rebuilding it: reaped, it is still paused,
    # from the same instant (d never published a resume).
    d = await cluster.add("d")
    assert await c.hand_off("x", paused_for_s=1.0) == "ok"
    adopted, _ = await d.adopt(30.0, 4)
    paused_at = adopted[0].paused_at
    assert paused_at is not None
    await _lose(cluster, "d")
    await _orphaned(cluster, c, "x")
    assert (await c.get("x")).paused_at == paused_at
    await cluster.check()


async def _reaped_after(cluster: Cluster, statuses: list[tuple[str, float | None]]) -> tuple[SharedTicketView, ...]:
    """Session x created on replica a and checkpointed, a publishes `statuses` (status, paused_for_s) in order, then
    a is lost (SIGKILL) and x orphaned: the ticket as it waits for an adopter, then as b adopts it (the reply) and
    as b's listeners hear it (the adopted event)."""
    a = await cluster.add("a")
    await a.create("k", ticket_id="x")
    await _checkpointed(cluster, a, "x")
    for status, paused_for_s in statuses:
        await a.publish_status("x", status, paused_for_s=paused_for_s)
    b = await cluster.add("b")
    await _lose(cluster, "a")
    await _orphaned(cluster, b, "x")
    orphan = await b.get("x")
    await cluster.check()
    adopted, _ = await b.adopt(30.0, 4)
    assert [v.ticket_id for v in adopted] == ["x"]
    told = (await cluster.logs["b"].wait_for(SharedEventKind.ADOPTED, "x")).ticket
    await cluster.check()
    return orphan, adopted[0], told


async def test_a_session_paused_when_its_replica_is_lost_is_orphaned_and_adopted_paused_from_its_first_pause(
    cluster: Cluster,
) -> None:
    """The owner's status write of a paused session keeps its pause's start in the ticket (`paused`, the Redis clock);
    the reaper orphans it with it (not only a hand-off does), and its adopter reads it from the adopt reply and the
    adopted event and counts the pause from there (`adoption_paused_s`): 12.5 s before the pause was written, plus
    the time to the adoption. A resume that never reached Redis (lost with the replica) changes nothing: the last
    status Redis holds wins."""
    orphan, adopted, told = await _reaped_after(cluster, [("running", None), ("paused", 12.5)])
    assert (orphan.status, orphan.status_reason, orphan.orphan_reason) == ("recovering", "replica_lost", "replica_lost")
    paused_at, orphaned_at = orphan.paused_at, orphan.orphaned_at
    assert paused_at is not None
    assert orphaned_at is not None
    assert orphaned_at - paused_at >= 12.5 - 0.002  # paused 12.5 s before the write, then the reap
    assert adopted.paused_at == told.paused_at == paused_at
    assert adopted.adopted_at is not None
    paused_for = adoption_paused_s(adopted, time.monotonic())
    assert paused_for == pytest.approx(adopted.adopted_at - paused_at, abs=0.05)  # from the first pause
    assert adopted.adopted_at - paused_at >= 12.5 - 0.002


async def test_a_session_paused_then_resumed_before_its_replica_is_lost_is_adopted_running(cluster: Cluster) -> None:
    """A resume's status write deletes the pause: reaped after it, the session is an orphan that is not paused, and
    its adopter runs it."""
    orphan, adopted, told = await _reaped_after(cluster, [("paused", 3.0), ("running", None)])
    assert (orphan.status, orphan.paused_at) == ("recovering", None)
    assert (adopted.paused_at, told.paused_at) == (None, None)
    assert adoption_paused_s(adopted, time.monotonic()) is None


async def test_a_pause_older_than_the_longest_pause_reaches_the_adopter_whole(cluster: Cluster) -> None:
    """Paused 70 s before its replica is lost: its adopter counts at least 70 s of pause, which past
    LINGSTREAM_MAX_PAUSE (60 s in the runtime's test) ends it `paused_too_long` at once there
    (`test_pause_and_limits.py::test_a_session_handed_over_paused_past_the_longest_pause_ends_paused_too_long_at_once`)."""
    _, adopted, _ = await _reaped_after(cluster, [("paused", 70.0)])
    paused_for = adoption_paused_s(adopted, time.monotonic())
    assert paused_for is not None
    assert paused_for >= 70.0 - 0.002


async def test_the_pause_in_a_ticket_ends_with_a_resume_the_sessions_end_and_a_stale_owners_writes(
    cluster: Cluster,
) -> None:
    """`paused` is written with a paused status only, by the owner only: a status written without it deletes it, a
    released ticket keeps none (`Snapshot.check` holds every ticket to it), and a stale owner (reaped, its session
    orphaned) cannot resume the orphan."""
    a = await cluster.add("a")
    await a.create("k", ticket_id="x")
    await a.publish_status("x", "paused", paused_for_s=0.0)
    assert (await a.get("x")).paused_at is not None
    await a.publish_status("x", "running")  # a status without a pause: the pause is gone with it
    assert (await a.get("x")).paused_at is None
    await a.publish_status("x", "paused", paused_for_s=2.0)
    await cluster.check()
    await a.release("x")
    ended = await a.get("x")
    assert (ended.state, ended.paused_at) == (TicketState.RELEASED, None)
    await cluster.check()

    # A replica stalled past its TTL while its session was paused: reaped, the orphan stays paused whatever the
    # stale owner, back, writes of it (refused: the session is no longer its).
    s = await cluster.add("s", replica_ttl_s=60.0, heartbeat_interval_s=30.0)
    await s.create("k", ticket_id="y")
    await _checkpointed(cluster, s, "y")
    await s.publish_status("y", "paused", paused_for_s=1.0)
    await cluster.raw.delete(f"{PREFIX}replica:s")
    await _orphaned(cluster, a, "y")
    before = await a.get("y")
    assert before.paused_at is not None
    with pytest.raises(NotTicketOwnerError):
        await s.publish_status("y", "running")  # its resume, too late
    assert (await a.get("y")).paused_at == before.paused_at
    await cluster.check()
