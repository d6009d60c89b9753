"""Behaviour of the admission controller (layer 1), driven step by step on a fake clock."""

from __future__ import annotations

import logging

import pytest

from admission import (
    AdmissionConfig,
    AdmissionConfigError,
    AdmissionController,
    AdmissionEvent,
    AdmissionEventKind,
    IllegalTransitionError,
    TicketExistsError,
    TicketReason,
    TicketState,
    UnknownTicketError,
    UnknownWorkerError,
)
from tests.support.admission import EventLog, assert_invariants, make_controller


def test_new_sessions_go_to_the_least_loaded_worker_ties_to_lowest_index() -> None:
    controller, _ = make_controller(num_workers=3, max_sessions_per_worker=2)
    workers = [controller.create("k", ticket_id=f"s{i}").worker for i in range(6)]
    assert workers == [0, 1, 2, 0, 1, 2]
    controller.release("s4")  # worker 1 now holds one session, the others two
    assert controller.create("k", ticket_id="s6").worker == 1
    assert_invariants(controller)


def test_queue_admits_in_fifo_order() -> None:
    controller, _ = make_controller(num_workers=1, queue_size=10)
    controller.create("k", ticket_id="running")
    for name in "abc":
        view = controller.create("k", ticket_id=name)
        assert view.state is TicketState.QUEUED
    assert [controller.get(n).position for n in "abc"] == [1, 2, 3]
    order = []
    current = "running"
    for _ in "abc":
        controller.release(current)
        (admitted,) = controller.list_tickets(state=TicketState.ADMITTED)
        order.append(admitted.ticket_id)
        current = admitted.ticket_id
        assert_invariants(controller)
    assert order == ["a", "b", "c"]


def test_full_queue_rejects_with_retry_after_that_follows_recent_session_lengths() -> None:
    controller, _ = make_controller(num_workers=1, queue_size=1, default_session_seconds=30.0)
    controller.create("k", ticket_id="running")
    controller.create("k", ticket_id="waiting")
    rejected = controller.create("k", ticket_id="late")
    assert rejected.state is TicketState.REJECTED
    assert rejected.reason is TicketReason.QUEUE_FULL
    assert rejected.retry_after_s == 30  # no session has ended yet: the configured default
    with pytest.raises(UnknownTicketError):
        controller.get("late")  # a rejected ticket is not remembered

    long_ctrl, long_clock = make_controller(num_workers=1, queue_size=0, queue_heartbeat_timeout=None)
    short_ctrl, short_clock = make_controller(num_workers=1, queue_size=0, queue_heartbeat_timeout=None)
    for i in range(5):
        long_ctrl.create("k", ticket_id=f"l{i}")
        long_clock.advance(200.0)
        long_ctrl.release(f"l{i}")
        short_ctrl.create("k", ticket_id=f"s{i}")
        short_clock.advance(20.0)
        short_ctrl.release(f"s{i}")
    long_ctrl.create("k", ticket_id="busy")
    short_ctrl.create("k", ticket_id="busy")
    long_retry = long_ctrl.create("k", ticket_id="late").retry_after_s
    short_retry = short_ctrl.create("k", ticket_id="late").retry_after_s
    assert long_retry == 200
    assert short_retry == 20

    # The estimate follows the newest sessions: after many short ones, the long controller's estimate drops.
    long_ctrl.release("busy")
    for i in range(40):
        long_ctrl.create("k", ticket_id=f"q{i}")
        long_clock.advance(5.0)
        long_ctrl.release(f"q{i}")
    long_ctrl.create("k", ticket_id="busy2")
    assert long_ctrl.create("k", ticket_id="later").retry_after_s == 5
    assert_invariants(long_ctrl)


def test_retry_after_divides_by_the_instance_slot_count_and_is_at_least_one_second() -> None:
    controller, clock = make_controller(num_workers=2, max_sessions_per_worker=2, queue_size=0)
    for i in range(4):
        controller.create("k", ticket_id=f"s{i}")
    clock.advance(40.0)
    for i in range(4):
        controller.release(f"s{i}")
    for i in range(4):
        controller.create("k", ticket_id=f"t{i}")
    assert controller.create("k", ticket_id="late").retry_after_s == 10  # 40 s / 4 slots

    tiny, tiny_clock = make_controller(num_workers=1, queue_size=0)
    tiny.create("k", ticket_id="a")
    tiny_clock.advance(0.01)
    tiny.release("a")
    tiny.create("k", ticket_id="b")
    assert tiny.create("k", ticket_id="c").retry_after_s == 1


def test_queue_size_zero_rejects_when_full_and_admits_when_a_slot_is_free() -> None:
    controller, _ = make_controller(num_workers=1, queue_size=0)
    assert controller.create("k", ticket_id="a").state is TicketState.ADMITTED
    rejected = controller.create("k", ticket_id="b")
    assert (rejected.state, rejected.reason) == (TicketState.REJECTED, TicketReason.QUEUE_FULL)
    assert rejected.retry_after_s is not None
    assert rejected.retry_after_s > 0
    controller.release("a")
    assert controller.create("k", ticket_id="b").state is TicketState.ADMITTED
    stats = controller.statistics()
    assert (stats.queued_total, stats.rejected_total, stats.admitted_total) == (0, 1, 2)
    assert_invariants(controller)


def test_queue_timeout_expires_the_ticket_and_moves_the_others_up() -> None:
    controller, clock = make_controller(num_workers=1, queue_timeout=30.0, queue_heartbeat_timeout=None)
    log = EventLog()
    controller.subscribe(log)
    controller.create("k", ticket_id="running")
    controller.create("k", ticket_id="a")
    clock.advance(10.0)
    controller.create("k", ticket_id="b")
    clock.advance(20.0)  # a's deadline (t=30) is due now; b's (t=40) is not
    controller.tick()
    a = controller.get("a")
    assert (a.state, a.reason, a.ended_at, a.position) == (TicketState.EXPIRED, TicketReason.QUEUE_TIMEOUT, 30.0, None)
    assert controller.get("b").position == 1
    assert log.kinds_for("b")[-1] == "position_changed"
    stats = controller.statistics()
    assert (stats.queue_depth, stats.expired_total, stats.retained) == (1, 1, (1,))
    # The freed position goes to the next create, and the freed slot to b.
    controller.release("running")
    assert controller.get("b").state is TicketState.ADMITTED
    assert_invariants(controller)


def test_expiry_happens_on_any_call_before_a_freed_slot_is_handed_out() -> None:
    controller, clock = make_controller(num_workers=1, queue_timeout=30.0, queue_heartbeat_timeout=None)
    controller.create("k", ticket_id="running")
    controller.create("k", ticket_id="a")
    clock.advance(31.0)
    controller.release("running")  # a was already expired at t=30, so it must not take the slot at t=31
    assert controller.get("a").state is TicketState.EXPIRED
    assert controller.statistics().retained == (0,)
    assert_invariants(controller)


def test_client_that_stops_heartbeating_loses_its_place_with_a_distinct_reason() -> None:
    controller, clock = make_controller(num_workers=1, queue_timeout=100.0, queue_heartbeat_timeout=10.0)
    controller.create("k", ticket_id="running")
    controller.create("k", ticket_id="silent")
    controller.create("k", ticket_id="polling")
    for _ in range(3):
        clock.advance(6.0)
        assert controller.heartbeat("polling").heartbeat_deadline == clock.now() + 10.0
    silent = controller.get("silent")
    assert (silent.state, silent.reason, silent.ended_at) == (TicketState.EXPIRED, TicketReason.HEARTBEAT_LOST, 10.0)
    assert controller.get("polling").position == 1
    stats = controller.statistics()
    assert (stats.expired_total, stats.heartbeat_lost_total) == (1, 1)
    controller.release("running")
    assert controller.get("polling").state is TicketState.ADMITTED
    assert_invariants(controller)


def test_heartbeat_on_admitted_or_finished_ticket_is_a_no_op() -> None:
    controller, _ = make_controller(num_workers=1)
    controller.create("k", ticket_id="a")
    assert controller.heartbeat("a").state is TicketState.ADMITTED
    controller.release("a")
    assert controller.heartbeat("a").state is TicketState.RELEASED
    with pytest.raises(UnknownTicketError):
        controller.heartbeat("nope")


def test_cancel_while_queued_updates_the_positions_of_those_behind() -> None:
    controller, _ = make_controller(num_workers=1, queue_size=10)
    log = EventLog()
    controller.subscribe(log)
    controller.create("k", ticket_id="running")
    for name in "abcd":
        controller.create("k", ticket_id=name)
    log.clear()
    cancelled = controller.cancel("b")
    assert (cancelled.state, cancelled.reason) == (TicketState.CANCELLED, TicketReason.CLIENT_CANCELLED)
    assert [controller.get(n).position for n in "acd"] == [1, 2, 3]
    assert [(e.kind, e.ticket.ticket_id, e.ticket.position) for e in log.events] == [
        (AdmissionEventKind.CANCELLED, "b", None),
        (AdmissionEventKind.POSITION_CHANGED, "c", 2),
        (AdmissionEventKind.POSITION_CHANGED, "d", 3),
    ]
    assert_invariants(controller)


def test_freed_slot_admits_the_head_onto_any_worker_with_room() -> None:
    controller, _ = make_controller(num_workers=3, max_sessions_per_worker=1, queue_size=5)
    for name in ("w0", "w1", "w2", "a", "b"):
        controller.create("k", ticket_id=name)
    controller.set_worker_healthy(0, False)
    controller.release("w0")  # worker 0 has room but is unhealthy: nothing moves
    assert controller.get("a").state is TicketState.QUEUED
    controller.release("w2")  # the head goes to worker 2, the only healthy one with room
    assert (controller.get("a").state, controller.get("a").worker) == (TicketState.ADMITTED, 2)
    controller.set_worker_healthy(0, True)  # room on worker 0 again: the new head goes there, not to its "own" worker
    assert (controller.get("b").state, controller.get("b").worker) == (TicketState.ADMITTED, 0)
    assert_invariants(controller)


def test_freed_capacity_is_filled_least_loaded_first() -> None:
    controller, _ = make_controller(num_workers=2, max_sessions_per_worker=3, queue_size=5)
    controller.set_worker_healthy(1, False)
    for i in range(5):
        controller.create("k", ticket_id=f"s{i}")  # three on worker 0, two queued
    assert controller.statistics().retained == (3, 0)
    controller.set_worker_healthy(1, True)
    assert controller.statistics().retained == (3, 2)
    assert {controller.get("s3").worker, controller.get("s4").worker} == {1}
    assert_invariants(controller)


def test_release_and_cancel_are_idempotent() -> None:
    controller, _ = make_controller(num_workers=1, queue_size=2)
    controller.create("k", ticket_id="a")
    controller.create("k", ticket_id="b")
    first = controller.release("a")
    assert first.state is TicketState.RELEASED
    assert controller.release("a") == first
    assert controller.get("b").state is TicketState.ADMITTED
    controller.create("k", ticket_id="c")
    assert controller.cancel("c").state is TicketState.CANCELLED
    assert controller.cancel("c").state is TicketState.CANCELLED
    assert controller.release("c").state is TicketState.CANCELLED
    stats = controller.statistics()
    assert (stats.released_total, stats.cancelled_total, stats.retained) == (1, 1, (1,))
    assert_invariants(controller)
    with pytest.raises(UnknownTicketError):
        controller.release("never-created")


def test_release_of_a_queued_ticket_cancels_it() -> None:
    controller, _ = make_controller(num_workers=1)
    controller.create("k", ticket_id="a")
    controller.create("k", ticket_id="b")
    view = controller.release("b")
    assert (view.state, view.reason) == (TicketState.CANCELLED, TicketReason.CLIENT_CANCELLED)
    assert_invariants(controller)


def test_cancel_of_an_admitted_ticket_is_an_illegal_transition() -> None:
    controller, _ = make_controller(num_workers=1)
    controller.create("k", ticket_id="a")
    with pytest.raises(IllegalTransitionError, match=r"cannot move from admitted to cancelled: .*release"):
        controller.cancel("a")
    assert controller.get("a").state is TicketState.ADMITTED
    assert_invariants(controller)


def test_unhealthy_worker_admits_nothing_and_admission_resumes_when_healthy() -> None:
    controller, _ = make_controller(num_workers=2, queue_size=3)
    controller.set_worker_healthy(0, False)
    controller.set_worker_healthy(1, False)
    assert controller.create("k", ticket_id="a").state is TicketState.QUEUED
    assert controller.statistics().free_slots == 0
    controller.set_worker_healthy(1, True)
    assert (controller.get("a").state, controller.get("a").worker) == (TicketState.ADMITTED, 1)
    assert controller.create("k", ticket_id="b").state is TicketState.QUEUED
    controller.set_worker_healthy(0, True)
    assert controller.get("b").worker == 0
    assert controller.statistics().healthy == (True, True)
    assert_invariants(controller)
    with pytest.raises(UnknownWorkerError, match="out of range"):
        controller.set_worker_healthy(2, True)


def test_sessions_on_a_worker_that_turns_unhealthy_keep_their_slots_until_released() -> None:
    controller, _ = make_controller(num_workers=1, queue_size=1)
    controller.create("k", ticket_id="a")
    controller.create("k", ticket_id="b")
    controller.set_worker_healthy(0, False)
    assert controller.statistics().retained == (1,)
    controller.release("a")
    assert controller.statistics().retained == (0,)
    assert controller.get("b").state is TicketState.QUEUED
    assert_invariants(controller)


def test_drain_rejects_new_sessions_cancels_queued_ones_and_keeps_running_ones() -> None:
    controller, _ = make_controller(num_workers=1, queue_size=3)
    log = EventLog()
    controller.subscribe(log)
    controller.create("k", ticket_id="running")
    controller.create("k", ticket_id="a")
    controller.create("k", ticket_id="b")
    cancelled = controller.drain()
    assert [(v.ticket_id, v.state, v.reason) for v in cancelled] == [
        ("a", TicketState.CANCELLED, TicketReason.DRAINING),
        ("b", TicketState.CANCELLED, TicketReason.DRAINING),
    ]
    assert controller.drain() == ()
    assert controller.draining
    rejected = controller.create("k", ticket_id="new")
    assert (rejected.state, rejected.reason, rejected.retry_after_s) == (
        TicketState.REJECTED,
        TicketReason.DRAINING,
        None,
    )
    assert controller.get("running").state is TicketState.ADMITTED
    assert controller.release("running").state is TicketState.RELEASED
    stats = controller.statistics()
    assert (stats.retained, stats.queue_depth, stats.rejected_draining_total, stats.draining) == ((0,), 0, 1, True)
    assert controller.create("k", ticket_id="after").reason is TicketReason.DRAINING  # drain is one-way
    assert_invariants(controller)


def test_owner_is_recorded_and_filterable() -> None:
    controller, _ = make_controller(num_workers=1, queue_size=3)
    controller.create("alice", ticket_id="a1")
    controller.create("bob", ticket_id="b1")
    controller.create("alice", ticket_id="a2")
    assert [v.ticket_id for v in controller.list_tickets(owner="alice")] == ["a1", "a2"]
    assert controller.get("b1").owner == "bob"


def test_ticket_ids_are_unique_while_remembered_and_generated_when_omitted() -> None:
    controller, _ = make_controller(num_workers=1, finished_history=1)
    generated = controller.create("k")
    assert generated.ticket_id.startswith("ticket-")
    with pytest.raises(TicketExistsError):
        controller.create("k", ticket_id=generated.ticket_id)
    controller.release(generated.ticket_id)
    with pytest.raises(TicketExistsError):
        controller.create("k", ticket_id=generated.ticket_id)
    controller.create("k", ticket_id="other")
    controller.release("other")  # history of one: the first ticket is forgotten
    with pytest.raises(UnknownTicketError):
        controller.get(generated.ticket_id)


def test_listeners_get_every_change_after_it_is_complete_and_may_call_back() -> None:
    controller, _ = make_controller(num_workers=1, queue_size=3)
    seen: list[tuple[str, str, int]] = []

    def release_on_admit(event: AdmissionEvent) -> None:
        # Re-entering from a listener is allowed; the state it sees is already consistent.
        controller.check_invariants()
        seen.append((event.kind.value, event.ticket.ticket_id, controller.statistics().retained[0]))
        if event.kind is AdmissionEventKind.ADMITTED and event.ticket.ticket_id == "b":
            controller.release("b")

    controller.subscribe(release_on_admit)
    controller.create("k", ticket_id="a")
    controller.create("k", ticket_id="b")
    controller.create("k", ticket_id="c")
    seen.clear()
    controller.release("a")
    # a released -> b admitted -> (listener releases b) -> c admitted; events arrive in that order, never nested.
    assert [(kind, tid) for kind, tid, _ in seen] == [
        ("released", "a"),
        ("admitted", "b"),
        ("position_changed", "c"),
        ("released", "b"),
        ("admitted", "c"),
    ]
    assert controller.get("c").state is TicketState.ADMITTED
    assert_invariants(controller)


def test_a_failing_listener_is_logged_and_does_not_break_admission(caplog: pytest.LogCaptureFixture) -> None:
    controller, _ = make_controller(num_workers=1)
    log = EventLog()

    def broken(event: AdmissionEvent) -> None:
        raise RuntimeError("listener bug")

    controller.subscribe(broken)
    unsubscribe = controller.subscribe(log)
    with caplog.at_level(logging.ERROR, logger="admission._outbox"):
        assert controller.create("k", ticket_id="a").state is TicketState.ADMITTED
    assert "listener" in caplog.text
    assert [e.kind for e in log.events] == [AdmissionEventKind.ADMITTED]
    unsubscribe()
    unsubscribe()
    controller.release("a")
    assert len(log.events) == 1


def test_statistics_report_totals_and_a_bounded_queue_wait_summary() -> None:
    controller, clock = make_controller(num_workers=1, queue_size=5, wait_window=2, queue_heartbeat_timeout=None)
    controller.create("k", ticket_id="a")  # waits 0
    controller.create("k", ticket_id="b")
    controller.create("k", ticket_id="c")
    clock.advance(4.0)
    controller.release("a")  # b waited 4
    clock.advance(6.0)
    controller.release("b")  # c waited 10
    stats = controller.statistics()
    assert (stats.admitted_total, stats.queued_total, stats.released_total) == (3, 2, 2)
    wait = stats.queue_wait
    assert (wait.total_count, wait.window_count, wait.mean, wait.max) == (3, 2, 7.0, 10.0)
    assert (wait.p50, wait.p95) == (4.0, 10.0)
    assert stats.session_length.total_count == 2
    assert stats.session_length.mean == 5.0


def test_next_deadline_is_the_earliest_queue_or_heartbeat_deadline() -> None:
    controller, clock = make_controller(num_workers=1, queue_timeout=50.0, queue_heartbeat_timeout=10.0)
    assert controller.next_deadline() is None
    controller.create("k", ticket_id="a")
    controller.create("k", ticket_id="b")
    assert controller.next_deadline() == 10.0
    clock.advance(5.0)
    controller.heartbeat("b")
    assert controller.next_deadline() == 15.0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_workers", 0),
        ("max_sessions_per_worker", 0),
        ("queue_size", -1),
        ("queue_timeout", 0.0),
        ("queue_heartbeat_timeout", float("nan")),
        ("default_session_seconds", -1.0),
        ("finished_history", -1),
        ("num_workers", True),
    ],
)
def test_invalid_config_is_rejected_with_the_field_named(field: str, value: object) -> None:
    with pytest.raises(AdmissionConfigError, match=field):
        AdmissionConfig(**{field: value})  # type: ignore[arg-type]


def test_default_config_builds_a_working_controller() -> None:
    controller = AdmissionController(AdmissionConfig())
    assert controller.create("k").state is TicketState.ADMITTED
    assert controller.config.capacity == 1


def test_a_dead_workers_sessions_can_be_found_and_released_without_leaking_slots() -> None:
    controller, _ = make_controller(num_workers=2, max_sessions_per_worker=2, queue_size=4)
    for i in range(6):
        controller.create("k", ticket_id=f"s{i}")  # four running (two per worker), two queued
    controller.set_worker_healthy(1, False)
    on_dead_worker = controller.list_tickets(worker=1)
    assert [v.ticket_id for v in on_dead_worker] == ["s1", "s3"]
    for view in on_dead_worker:
        controller.release(view.ticket_id)
        controller.release(view.ticket_id)
    assert controller.statistics().retained == (2, 0)
    assert controller.list_tickets(state=TicketState.QUEUED)[0].position == 1
    controller.release("s0")  # room on the healthy worker: the head goes there
    assert controller.get("s4").worker == 0
    assert_invariants(controller)
