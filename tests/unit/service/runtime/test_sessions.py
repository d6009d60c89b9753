"""The session lifecycle table and the bounded fan-out."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.bidirectional import CloseMode, PreparedSession
from service.errors import SessionTransitionError
from service.runtime.fanout import Broadcast, Flag
from service.runtime.sessions import (
    LIVE_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    Session,
    SessionBuffers,
    SessionState,
    require_transition,
)
from transport.base import DoneStatus, ErrorStatus, StateStatus


def _session() -> Session:
    prepared = PreparedSession(config={"fps": 10}, width=8, height=8, fps=10.0, frame_limit=None)
    return Session("s1", "owner", prepared, {"fps": 10}, SessionBuffers(snapshots=8, statuses=8, chunks=2))


def test_the_table_covers_every_state_and_terminal_states_have_no_moves() -> None:
    assert set(TRANSITIONS) == set(SessionState)
    assert frozenset({SessionState.CLOSED, SessionState.EXPIRED, SessionState.FAILED, SessionState.CANCELLED}) == (
        TERMINAL_STATES
    )
    assert LIVE_STATES.isdisjoint(TERMINAL_STATES)
    assert SessionState.QUEUED in LIVE_STATES


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (SessionState.QUEUED, SessionState.RUNNING),
        (SessionState.RUNNING, SessionState.QUEUED),
        (SessionState.CLOSED, SessionState.RUNNING),
        (SessionState.DRAINING, SessionState.RUNNING),
        (SessionState.ADMITTED, SessionState.EXPIRED),
    ],
)
def test_an_illegal_move_raises_with_a_sentence(old: SessionState, new: SessionState) -> None:
    with pytest.raises(SessionTransitionError, match=f"cannot move from {old.value} to {new.value}: "):
        require_transition("s1", old, new)


async def test_every_change_is_published_and_the_end_closes_every_stream() -> None:
    session = _session()
    with session.snapshots.subscribe() as snapshots, session.statuses.subscribe() as statuses:
        session.set_position(2)
        session.set_position(2)  # unchanged: not published
        session.set_position(1)
        session.move(SessionState.ADMITTED)
        session.move(SessionState.RUNNING)
        session.record_failure("model_failure", "boom")
        session.record_failure("later", "ignored")
        session.move(SessionState.FAILED, reason="model_failure")
        states = [(snap.state, snap.queue_position) async for snap in snapshots]
        messages = [message async for message in statuses]
    assert states == [
        (SessionState.QUEUED, 2),
        (SessionState.QUEUED, 1),
        (SessionState.ADMITTED, None),
        (SessionState.RUNNING, None),
        (SessionState.FAILED, None),
    ]
    assert messages[-2:] == [ErrorStatus("model_failure", "boom"), DoneStatus("model_failure")]
    assert StateStatus("running", None) in messages
    assert session.ended.is_set()
    assert session.settled.is_set()


def test_request_close_moves_to_draining_and_cancel_escalates_a_drain() -> None:
    session = _session()
    assert not session.request_close(CloseMode.DRAIN, "queued sessions are cancelled through admission")
    session.move(SessionState.ADMITTED)
    session.move(SessionState.RUNNING)
    assert session.request_close(CloseMode.DRAIN, "client_deleted")
    assert session.state is SessionState.DRAINING
    assert not session.escalated.is_set()
    assert not session.request_close(CloseMode.DRAIN, "again")
    assert session.request_close(CloseMode.CANCEL, "drain_deadline")
    assert session.escalated.is_set()
    assert session.close_reason == "client_deleted"


async def test_a_slow_subscriber_loses_the_oldest_items_not_memory() -> None:
    broadcast: Broadcast[int] = Broadcast(capacity=3)
    slow = broadcast.subscribe()
    fast = broadcast.subscribe()
    for item in range(10):
        broadcast.publish(item)
        assert await anext(fast) == item
    broadcast.close()
    assert [item async for item in slow] == [7, 8, 9]
    assert slow.dropped == 7
    stats = broadcast.statistics()
    assert (stats.published, stats.dropped, stats.subscribers, stats.closed) == (10, 7, 0, True)


async def test_a_subscriber_waits_for_the_next_item_and_ends_on_close() -> None:
    broadcast: Broadcast[str] = Broadcast(capacity=2)
    with broadcast.subscribe() as subscription:
        pending = asyncio.ensure_future(anext(subscription))
        await asyncio.sleep(0)
        assert not pending.done()
        broadcast.publish("x")
        assert await pending == "x"
        broadcast.close()
        with pytest.raises(StopAsyncIteration):
            await anext(subscription)
    late = broadcast.subscribe()
    assert [item async for item in late] == []


async def test_a_flag_wakes_every_waiter_once_set_and_keeps_nothing_for_cancelled_ones() -> None:
    flag = Flag()
    waiters = [asyncio.create_task(flag.wait()) for _ in range(3)]
    cancelled = asyncio.create_task(flag.wait())
    await asyncio.sleep(0)  # every waiter is parked
    assert not flag.is_set()
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert flag._waiters is not None
    assert len(flag._waiters) == 3  # the cancelled waiter left nothing behind
    flag.set()
    flag.set()  # idempotent
    assert await asyncio.gather(*waiters) == [True, True, True]
    assert flag.is_set()
    assert flag._waiters is None
    assert await asyncio.wait_for(flag.wait(), timeout=1) is True  # a set flag answers at once


def test_a_finished_session_keeps_no_per_instance_dict() -> None:
    # The history keeps LINGSTREAM_SESSION_HISTORY finished sessions: slots and lazy flags keep each one small.
    session = _session()
    assert not hasattr(session, "__dict__")
    assert isinstance(session.ended, Flag)


def test_the_record_is_written_only_through_its_transitions() -> None:
    session = _session()
    with pytest.raises(AttributeError):
        session.state = SessionState.RUNNING  # type: ignore[misc]
    with pytest.raises(AttributeError):
        session.holds_slot = True  # type: ignore[misc]
    session.admitted(1)
    assert (session.state, session.worker, session.holds_slot) == (SessionState.ADMITTED, 1, True)
    session.attached({"kind": "fake"})
    session.move(SessionState.RUNNING)
    assert session.snapshot().transport == {"kind": "fake"}
    session.time_limit_started(1234.0)
    assert session.snapshot().ends_at == 1234.0
    session.mark_service_draining("the service is draining")
    assert (session.state, session.reason, session.service_draining) == (
        SessionState.DRAINING,
        "service_draining",
        True,
    )
    assert session.slot_released()
    assert not session.slot_released()  # a slot goes back exactly once
    assert not session.holds_slot


def test_admitting_a_session_twice_raises_and_changes_nothing() -> None:
    session = _session()
    session.admitted(0)
    session.move(SessionState.RUNNING)
    with pytest.raises(SessionTransitionError, match="cannot move from running to admitted"):
        session.admitted(1)
    assert (session.state, session.worker) == (SessionState.RUNNING, 0)


def test_a_closing_session_is_told_of_the_drain_but_keeps_its_close() -> None:
    session = _session()
    session.admitted(0)
    session.move(SessionState.RUNNING)
    session.request_close(CloseMode.DRAIN, "client_deleted")
    session.mark_service_draining("the service is draining")
    assert (session.service_draining, session.reason) == (True, "client_deleted")


async def test_a_handed_off_session_tells_recovering_stops_here_without_done_and_keeps_its_clients_stop() -> None:
    session = _session()
    assert not session.hand_off("not running yet")
    session.move(SessionState.ADMITTED)
    session.move(SessionState.RUNNING)
    with session.snapshots.subscribe() as snapshots, session.statuses.subscribe() as statuses:
        assert session.hand_off("the service is draining; the session moves to another replica")
        assert not session.hand_off("twice")
        assert (session.state, session.close_mode, session.close_reason) == (
            SessionState.RECOVERING,
            CloseMode.CANCEL,
            "handed_off",
        )
        assert session.close_requested.is_set()
        assert session.escalated.is_set()
        # What the replica does to let go of it is not a stop; its client's own stop is kept for the adopter.
        assert not session.request_close(CloseMode.DRAIN, "completed")
        assert not session.request_close(CloseMode.CANCEL, "client_gone: closed")
        assert session.stop_after_hand_off is None
        assert not session.request_close(CloseMode.DRAIN, "client_stop")
        assert not session.request_close(CloseMode.CANCEL, "client_deleted")
        assert session.stop_after_hand_off == (CloseMode.DRAIN, "client_stop")  # the first one
        assert session.state is SessionState.RECOVERING
        session.move(SessionState.CLOSED, reason="handed_off")
        states = [snap.state async for snap in snapshots]
        messages = [message async for message in statuses]
    assert states == [SessionState.RECOVERING]  # its end here is not published
    assert messages == [StateStatus("recovering", "the service is draining; the session moves to another replica")]
    assert session.ended.is_set()
    assert session.handing_off


def test_a_paused_session_is_handed_off_with_how_long_it_has_been_paused_and_its_adopter_goes_on_paused() -> None:
    session = _session()
    session.move(SessionState.ADMITTED)
    session.move(SessionState.RUNNING)
    assert session.paused_for_s is None
    session.move(SessionState.PAUSED)
    paused_for = session.paused_for_s
    assert paused_for is not None
    assert 0.0 <= paused_for < 5.0
    session.move(SessionState.RUNNING)  # resumed: no longer paused
    assert session.paused_for_s is None
    session.move(SessionState.PAUSED)
    assert session.hand_off("the service is draining; the session moves to another replica (paused)")
    assert session.state is SessionState.RECOVERING
    assert session.paused_for_s is not None  # kept for its adopter through the hand-off

    adopted = _session()
    adopted.handed_over_paused(42.0)  # 42 s into its pause on the replica that handed it off
    waiting = adopted.paused_for_s
    assert waiting is not None  # its pause counts before it is admitted here
    assert waiting >= 42.0
    adopted.move(SessionState.ADMITTED)
    adopted.move(SessionState.RUNNING)
    adopted.move(SessionState.PAUSED)  # the conductor pauses it at once; its pause began 42 s ago, not now
    counted = adopted.paused_for_s
    assert counted is not None
    assert 42.0 <= counted < 47.0
