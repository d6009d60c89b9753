"""Errors raised by the admission package (session admission and the execution lease).

    AdmissionError
    ├── AdmissionConfigError             a configuration value is invalid (the message names the field)
    ├── UnknownTicketError               no live or remembered ticket has this id
    ├── TicketExistsError                a live or remembered ticket already has this id
    ├── IllegalTransitionError           a ticket move that the lifecycle table forbids
    ├── UnknownWorkerError               a worker index outside 0 .. num_workers - 1
    ├── AdmissionClosedError             the async driver was closed while a caller waited on it
    ├── AdmissionInvariantError          the slot accounting broke (a bug; never expected in operation)
    └── LeaseError
        ├── LeaseAlreadyRequestedError   the session already waits for or holds this lease
        └── LeaseSessionRemovedError     the session was removed while it waited for the lease

Being rejected (queue full, draining) is not an error: `AdmissionController.create` returns a ticket in state
`REJECTED` with a reason, because it is an expected answer to a well-formed request.
"""

from __future__ import annotations

__all__ = [
    "AdmissionClosedError",
    "AdmissionConfigError",
    "AdmissionError",
    "AdmissionInvariantError",
    "IllegalTransitionError",
    "LeaseAlreadyRequestedError",
    "LeaseError",
    "LeaseSessionRemovedError",
    "TicketExistsError",
    "UnknownTicketError",
    "UnknownWorkerError",
]


class AdmissionError(Exception):
    """Root of every error the admission package raises."""


class AdmissionConfigError(AdmissionError):
    """A configuration value is invalid."""


class UnknownTicketError(AdmissionError):
    """No live ticket, and none in the bounded history of finished tickets, has this id."""

    def __init__(self, ticket_id: str) -> None:
        super().__init__(f"no admission ticket has id {ticket_id!r} (never created, rejected, or aged out of history)")
        self.ticket_id = ticket_id


class TicketExistsError(AdmissionError):
    """A ticket with this id is live or still remembered; ids are never reused while remembered."""

    def __init__(self, ticket_id: str) -> None:
        super().__init__(f"an admission ticket with id {ticket_id!r} exists already")
        self.ticket_id = ticket_id


class IllegalTransitionError(AdmissionError):
    """A ticket state change that the lifecycle's transition table does not allow."""

    def __init__(self, ticket_id: str, old: str, new: str, hint: str = "") -> None:
        message = f"admission ticket {ticket_id!r} cannot move from {old} to {new}"
        super().__init__(f"{message}: {hint}" if hint else message)
        self.ticket_id = ticket_id
        self.old = old
        self.new = new


class UnknownWorkerError(AdmissionError):
    """A worker index outside `0 .. num_workers - 1`."""

    def __init__(self, index: int, num_workers: int) -> None:
        super().__init__(f"worker index {index} is out of range: this instance has workers 0..{num_workers - 1}")
        self.index = index


class AdmissionClosedError(AdmissionError):
    """The async admission driver was closed while a caller was waiting on it."""


class AdmissionInvariantError(AdmissionError):
    """The slot accounting is inconsistent. This is a bug in the admission package, never a caller's mistake."""


class LeaseError(AdmissionError):
    """A misuse of an execution lease."""


class LeaseAlreadyRequestedError(LeaseError):
    """The session already waits for or holds the lease; a session holds at most one place."""

    def __init__(self, session_id: str, holding: bool) -> None:
        where = "holds the lease" if holding else "is already waiting for the lease"
        super().__init__(
            f"session {session_id!r} {where}; a session may hold at most one place in the lease queue "
            "(request the next chunk after the current grant ends)"
        )
        self.session_id = session_id
        self.holding = holding


class LeaseSessionRemovedError(LeaseError):
    """The session was removed (closed) while it waited for the lease; it was never granted."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} was removed while waiting for the execution lease")
        self.session_id = session_id
