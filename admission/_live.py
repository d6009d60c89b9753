"""The controller's own records: `LiveTicket`, its mutable record of one live ticket, and the per-owner counts.

Package-private (only `admission.controller` uses it). A `LiveTicket` never leaves the controller: callers get its
frozen `TicketView` (`view()`), and it is born only in an initial state (`admission.ticket.INITIAL_STATES`).
"""

from __future__ import annotations

from collections import Counter

from admission.errors import AdmissionInvariantError
from admission.ticket import (
    INITIAL_STATES,
    AdmissionEventKind,
    TicketReason,
    TicketState,
    TicketView,
)

__all__ = ["END_EVENT", "LiveTicket", "decrement"]

END_EVENT = {
    TicketState.EXPIRED: AdmissionEventKind.EXPIRED,
    TicketState.CANCELLED: AdmissionEventKind.CANCELLED,
}
"""The event a queued ticket's end emits, by the state it ended in."""


class LiveTicket:
    """The controller's mutable record of one live ticket. Never leaves the controller: callers get `TicketView`."""

    __slots__ = (
        "admitted_at",
        "created_at",
        "ended_at",
        "heartbeat_deadline",
        "owner",
        "position",
        "queue_deadline",
        "reason",
        "retry_after_s",
        "state",
        "ticket_id",
        "worker",
    )

    def __init__(self, ticket_id: str, owner: str, state: TicketState, created_at: float) -> None:
        if state not in INITIAL_STATES:
            raise AdmissionInvariantError(f"a ticket cannot be born {state.value}")
        self.ticket_id = ticket_id
        self.owner = owner
        self.state = state
        self.created_at = created_at
        self.reason: TicketReason | None = None
        self.position: int | None = None
        self.worker: int | None = None
        self.retry_after_s: int | None = None
        self.admitted_at: float | None = None
        self.ended_at: float | None = None
        self.queue_deadline: float | None = None
        self.heartbeat_deadline: float | None = None

    def view(self) -> TicketView:
        queued = self.state is TicketState.QUEUED
        return TicketView(
            ticket_id=self.ticket_id,
            owner=self.owner,
            state=self.state,
            reason=self.reason,
            position=self.position if queued else None,
            worker=self.worker,
            retry_after_s=self.retry_after_s,
            created_at=self.created_at,
            admitted_at=self.admitted_at,
            ended_at=self.ended_at,
            queue_deadline=self.queue_deadline if queued else None,
            heartbeat_deadline=self.heartbeat_deadline if queued else None,
        )


def decrement(counts: Counter[str], owner: str) -> None:
    """One live ticket of `owner` fewer; an owner with none left is removed (the counters stay bounded)."""
    counts[owner] -= 1
    if counts[owner] <= 0:
        del counts[owner]
