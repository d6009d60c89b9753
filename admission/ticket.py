"""The admission ticket's lifecycle and the immutable records the controller hands out.

A *ticket* is one session's claim on a slot of a model worker. It is created admitted (a worker had room), queued
(it waits in the bounded FIFO) or rejected (queue full, draining), and it ends released, expired or cancelled. This
module holds the lifecycle enum with its transition table, the reasons, the `TicketView` snapshot that every API
returns, and the `AdmissionEvent` that listeners receive.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from admission.errors import IllegalTransitionError

__all__ = [
    "INITIAL_STATES",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "AdmissionEvent",
    "AdmissionEventKind",
    "TicketReason",
    "TicketState",
    "TicketView",
    "require_transition",
]


class TicketState(enum.Enum):
    # Waiting in the bounded FIFO for a slot; holds a queue position but no slot.
    QUEUED = "queued"
    # Holds exactly one slot on one worker (a retained session, generating or not).
    ADMITTED = "admitted"
    # Was admitted; the session ended and its slot went back (terminal).
    RELEASED = "released"
    # Left the queue unadmitted because it waited too long or its client stopped heartbeating (terminal).
    EXPIRED = "expired"
    # Left the queue unadmitted because the client or a drain cancelled it (terminal).
    CANCELLED = "cancelled"
    # Refused at creation (queue full or draining); never held a place or a slot (terminal).
    REJECTED = "rejected"


TRANSITIONS: Mapping[TicketState, frozenset[TicketState]] = {
    TicketState.QUEUED: frozenset({TicketState.ADMITTED, TicketState.EXPIRED, TicketState.CANCELLED}),
    TicketState.ADMITTED: frozenset({TicketState.RELEASED}),
    TicketState.RELEASED: frozenset(),
    TicketState.EXPIRED: frozenset(),
    TicketState.CANCELLED: frozenset(),
    TicketState.REJECTED: frozenset(),
}
"""Every legal move, from each state. A ticket is born in one of `INITIAL_STATES`."""

INITIAL_STATES: frozenset[TicketState] = frozenset({TicketState.QUEUED, TicketState.ADMITTED, TicketState.REJECTED})
TERMINAL_STATES: frozenset[TicketState] = frozenset(state for state, moves in TRANSITIONS.items() if not moves)

_HINTS: Mapping[tuple[TicketState, TicketState], str] = {
    (TicketState.ADMITTED, TicketState.CANCELLED): "an admitted session ends with release(), not cancel()",
    (TicketState.ADMITTED, TicketState.EXPIRED): "queue timeouts apply only while a ticket waits in the queue",
}


def require_transition(ticket_id: str, old: TicketState, new: TicketState) -> None:
    """Raise `IllegalTransitionError` unless the table allows `old -> new`."""
    if new not in TRANSITIONS[old]:
        hint = _HINTS.get((old, new), f"{old.value} tickets are terminal" if old in TERMINAL_STATES else "")
        raise IllegalTransitionError(ticket_id, old.value, new.value, hint)


class TicketReason(enum.Enum):
    """Why a ticket is where it is. Set on every terminal ticket; None while queued or admitted."""

    # REJECTED: the queue was full (HTTP 429 with Retry-After).
    QUEUE_FULL = "queue_full"
    # REJECTED (new request) or CANCELLED (was queued): the instance is draining (HTTP 503).
    DRAINING = "draining"
    # REJECTED: the owner (API key) is at its `max_running` quota (HTTP 429 quota_exceeded).
    RUNNING_QUOTA = "running_quota"
    # REJECTED: the create would queue and the owner is at its `max_queued` quota (HTTP 429 quota_exceeded).
    QUEUED_QUOTA = "queued_quota"
    # EXPIRED: waited longer than `queue_timeout`.
    QUEUE_TIMEOUT = "queue_timeout"
    # EXPIRED: the waiting client sent no heartbeat for `queue_heartbeat_timeout` and lost its place.
    HEARTBEAT_LOST = "heartbeat_lost"
    # CANCELLED: the client cancelled while queued (or released a ticket that was still queued).
    CLIENT_CANCELLED = "client_cancelled"
    # RELEASED: the admitted session ended.
    SESSION_ENDED = "session_ended"


@dataclass(frozen=True, slots=True)
class TicketView:
    """An immutable snapshot of one ticket; every controller call and every event returns one.

    Times are seconds on the controller's clock. Fields that do not apply to the state are None:
    `position` (1 = next in line) and the two deadlines only while QUEUED; `worker` once ADMITTED (kept after
    RELEASED); `retry_after_s` only for REJECTED with reason QUEUE_FULL.
    """

    ticket_id: str
    owner: str
    state: TicketState
    reason: TicketReason | None
    position: int | None
    worker: int | None
    retry_after_s: int | None
    created_at: float
    admitted_at: float | None
    ended_at: float | None
    queue_deadline: float | None
    heartbeat_deadline: float | None

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class AdmissionEventKind(enum.Enum):
    # A ticket entered the queue (its view carries the position).
    QUEUED = "queued"
    # A ticket got a slot, at creation or from the queue (its view carries the worker).
    ADMITTED = "admitted"
    # A queued ticket moved up because someone ahead of it left the queue.
    POSITION_CHANGED = "position_changed"
    # A queued ticket timed out or lost its heartbeat (the view's reason says which).
    EXPIRED = "expired"
    # A queued ticket was cancelled (by the client or by a drain).
    CANCELLED = "cancelled"
    # An admitted session ended and its slot went back.
    RELEASED = "released"
    # A create was refused (queue full or draining).
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class AdmissionEvent:
    """One state change of one ticket, with the ticket's snapshot as of that change."""

    kind: AdmissionEventKind
    ticket: TicketView
