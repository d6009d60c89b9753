"""Hypothesis drives the admission controller through random interleavings and checks the slot accounting after
every step: creates, cancels, releases, heartbeats, clock advances, worker health flips and drain. One owner
("alice") may have a quota: it is never exceeded, and the other owner is never refused for it."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from admission import (
    AdmissionConfig,
    AdmissionController,
    AdmissionEvent,
    AdmissionEventKind,
    IllegalTransitionError,
    KeyQuota,
    TicketReason,
    TicketState,
)
from tests.support.admission import assert_invariants
from tests.support.fakes.clock import FakeClock


class AdmissionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.controller: AdmissionController | None = None
        self.created: list[str] = []
        self.creation_order: dict[str, int] = {}
        self.admitted_from_queue: list[str] = []
        self.was_queued: set[str] = set()
        self.max_admitted = 0
        self.capacity = 0
        self.quota = KeyQuota()

    @initialize(
        num_workers=st.integers(1, 3),
        per_worker=st.integers(1, 2),
        queue_size=st.integers(0, 4),
        heartbeat=st.one_of(st.none(), st.floats(1.0, 20.0)),
        max_running=st.one_of(st.none(), st.integers(1, 3)),
        max_queued=st.one_of(st.none(), st.integers(0, 2)),
    )
    def setup(
        self,
        num_workers: int,
        per_worker: int,
        queue_size: int,
        heartbeat: float | None,
        max_running: int | None,
        max_queued: int | None,
    ) -> None:
        self.quota = KeyQuota(max_running=max_running, max_queued=max_queued)
        config = AdmissionConfig(
            num_workers=num_workers,
            max_sessions_per_worker=per_worker,
            queue_size=queue_size,
            queue_timeout=25.0,
            queue_heartbeat_timeout=heartbeat,
            finished_history=10_000,
            key_quotas=(("alice", self.quota),),
        )
        self.capacity = config.capacity
        self.controller = AdmissionController(config, clock=self.clock)
        self.controller.subscribe(self.on_event)

    @property
    def ctl(self) -> AdmissionController:
        assert self.controller is not None
        return self.controller

    def on_event(self, event: AdmissionEvent) -> None:
        ticket = event.ticket
        if event.kind is AdmissionEventKind.QUEUED:
            self.was_queued.add(ticket.ticket_id)
        if event.kind is AdmissionEventKind.ADMITTED and ticket.ticket_id in self.was_queued:
            self.admitted_from_queue.append(ticket.ticket_id)
        if event.kind in (AdmissionEventKind.EXPIRED, AdmissionEventKind.POSITION_CHANGED):
            # A queued ticket never outlives its deadlines unnoticed: expiry is stamped at the deadline itself.
            assert ticket.ended_at is None or ticket.ended_at <= self.clock.now()

    def pick(self, data: st.DataObject) -> str | None:
        if not self.created:
            return None
        return data.draw(st.sampled_from(self.created))

    @rule(owner=st.sampled_from(["alice", "bob"]))
    def create(self, owner: str) -> None:
        ticket_id = f"t{len(self.created)}"
        live_before = self.ctl.list_tickets(owner=owner)
        view = self.ctl.create(owner, ticket_id=ticket_id)
        if view.reason in (TicketReason.RUNNING_QUOTA, TicketReason.QUEUED_QUOTA):
            assert owner == "alice", "an owner without a quota was refused for one"
            queued = [v for v in live_before if v.state is TicketState.QUEUED]
            limit = self.quota.limit_of(view.reason)[1]
            assert (len(live_before) if view.reason is TicketReason.RUNNING_QUOTA else len(queued)) >= limit
        if view.state is not TicketState.REJECTED:
            self.created.append(ticket_id)
            self.creation_order[ticket_id] = len(self.created)
        else:
            assert view.retry_after_s is None or view.retry_after_s >= 1

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        ticket_id = self.pick(data)
        if ticket_id is None:
            return
        before = self.ctl.get(ticket_id).state
        try:
            after = self.ctl.cancel(ticket_id).state
        except IllegalTransitionError:
            assert self.ctl.get(ticket_id).state is TicketState.ADMITTED
            return
        if before is TicketState.QUEUED:
            assert after is TicketState.CANCELLED
        else:
            assert after is before

    @rule(data=st.data(), twice=st.booleans())
    def release(self, data: st.DataObject, twice: bool) -> None:
        ticket_id = self.pick(data)
        if ticket_id is None:
            return
        first = self.ctl.release(ticket_id)
        assert first.is_terminal
        if twice:
            assert self.ctl.release(ticket_id) == first

    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        ticket_id = self.pick(data)
        if ticket_id is not None:
            self.ctl.heartbeat(ticket_id)

    @rule(seconds=st.floats(0.0, 15.0), tick=st.booleans())
    def advance(self, seconds: float, tick: bool) -> None:
        self.clock.advance(seconds)
        if tick:
            self.ctl.tick()

    @rule(data=st.data(), healthy=st.booleans())
    def set_health(self, data: st.DataObject, healthy: bool) -> None:
        index = data.draw(st.integers(0, self.ctl.config.num_workers - 1))
        self.ctl.set_worker_healthy(index, healthy)

    @precondition(lambda self: self.controller is not None and len(self.created) > 6)
    @rule()
    def drain(self) -> None:
        self.ctl.drain()

    @invariant()
    def slots_are_counted_exactly(self) -> None:
        if self.controller is None:
            return
        assert_invariants(self.ctl)
        alice = self.ctl.list_tickets(owner="alice")
        if self.quota.max_running is not None:
            assert len(alice) <= self.quota.max_running
        if self.quota.max_queued is not None:
            assert sum(1 for v in alice if v.state is TicketState.QUEUED) <= self.quota.max_queued
        stats = self.ctl.statistics()
        self.max_admitted = max(self.max_admitted, stats.retained_total)
        assert self.max_admitted <= self.capacity
        # Every ticket is accounted for once: live, or finished in exactly one way.
        assert stats.admitted_total == stats.retained_total + stats.released_total
        assert stats.queued_total == (
            stats.queue_depth + stats.expired_total + stats.cancelled_total + self.admitted_from_queue_count()
        )

    @invariant()
    def queue_is_fifo(self) -> None:
        if self.controller is None:
            return
        order = [self.creation_order[t] for t in self.admitted_from_queue]
        assert order == sorted(order)
        queued = self.ctl.list_tickets(state=TicketState.QUEUED)
        by_position = sorted(queued, key=lambda v: v.position or 0)
        assert [self.creation_order[v.ticket_id] for v in by_position] == sorted(
            self.creation_order[v.ticket_id] for v in queued
        )
        now = self.clock.now()
        for view in queued:
            assert view.queue_deadline is not None
            assert view.queue_deadline > now
            assert view.heartbeat_deadline is None or view.heartbeat_deadline > now

    def admitted_from_queue_count(self) -> int:
        return len(self.admitted_from_queue)


AdmissionMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestAdmissionInterleavings = AdmissionMachine.TestCase
