"""Shared helpers for the admission tests: a controller factory and the invariant checks run after every step."""

from __future__ import annotations

from admission import (
    AdmissionConfig,
    AdmissionController,
    AdmissionEvent,
    TicketState,
)
from tests.support.fakes.clock import FakeClock


def make_controller(clock: FakeClock | None = None, **overrides: object) -> tuple[AdmissionController, FakeClock]:
    """A controller on a fake clock; defaults: 2 workers x 1 slot, queue of 4, 100 s queue and 10 s heartbeat."""
    settings: dict[str, object] = {
        "num_workers": 2,
        "max_sessions_per_worker": 1,
        "queue_size": 4,
        "queue_timeout": 100.0,
        "queue_heartbeat_timeout": 10.0,
    }
    settings.update(overrides)
    clock = clock if clock is not None else FakeClock()
    return AdmissionController(AdmissionConfig(**settings), clock=clock), clock  # type: ignore[arg-type]


def assert_invariants(controller: AdmissionController) -> None:
    """Slot accounting seen from the public API, plus the controller's own check."""
    controller.check_invariants()
    stats = controller.statistics()
    admitted = controller.list_tickets(state=TicketState.ADMITTED)
    queued = controller.list_tickets(state=TicketState.QUEUED)
    assert sum(stats.retained) == len(admitted)
    per_worker = [0] * len(stats.retained)
    for view in admitted:
        assert view.worker is not None
        per_worker[view.worker] += 1
    assert per_worker == list(stats.retained)
    assert all(0 <= count <= stats.max_sessions_per_worker for count in stats.retained)
    assert stats.queue_depth == len(queued) <= stats.queue_size
    assert sorted(view.position or 0 for view in queued) == list(range(1, len(queued) + 1))
    if queued:
        assert stats.free_slots == 0 or stats.draining


class EventLog:
    """A listener that records every event."""

    def __init__(self) -> None:
        self.events: list[AdmissionEvent] = []

    def __call__(self, event: AdmissionEvent) -> None:
        self.events.append(event)

    def kinds_for(self, ticket_id: str) -> list[str]:
        return [e.kind.value for e in self.events if e.ticket.ticket_id == ticket_id]

    def clear(self) -> None:
        self.events.clear()
