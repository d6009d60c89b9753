"""Per-owner quotas: how many sessions one owner (an API key) may run and keep waiting, decided with admission.

A `KeyQuota` bounds one owner's live tickets. `max_running` bounds the sessions it runs *or waits to run*: a create
that would take the owner past it is refused, so a queued ticket of one owner never waits on that owner's own
sessions and the global FIFO stays strict (the head can always be admitted when a slot frees; no other owner is
held up). `max_queued` bounds how many of them wait in the queue: a create that would have to queue is refused when
the owner already has that many waiting. None means no bound. A refused create never takes a place in the queue.

`quota_verdict` is the decision itself, pure, so that the in-memory controller and the Redis scripts (which repeat
it in Lua, in the same atomic step as the admission decision) can be tested against the same table::

    quota_verdict(KeyQuota(max_running=2), running=1, queued=1, would_queue=False)  # RUNNING_QUOTA
    quota_verdict(KeyQuota(max_queued=0), running=0, queued=0, would_queue=True)    # QUEUED_QUOTA
    quota_verdict(KeyQuota(max_queued=0), running=0, queued=0, would_queue=False)   # None: admitted at once
"""

from __future__ import annotations

from dataclasses import dataclass

from admission.errors import AdmissionConfigError
from admission.ticket import TicketReason

__all__ = ["UNLIMITED", "KeyQuota", "quota_verdict"]


@dataclass(frozen=True, slots=True)
class KeyQuota:
    """One owner's bounds (None: unbounded): `max_running` >= 1 sessions running or waiting to run, `max_queued`
    >= 0 of them waiting in the queue. Checked at construction."""

    max_running: int | None = None
    max_queued: int | None = None

    def __post_init__(self) -> None:
        _bound("max_running", self.max_running, 1)
        _bound("max_queued", self.max_queued, 0)

    @property
    def unlimited(self) -> bool:
        return self.max_running is None and self.max_queued is None

    def limit_of(self, reason: TicketReason) -> tuple[str, int]:
        """The bound a refusal with `reason` hit, as `(name, value)` (for the error message)."""
        if reason is TicketReason.RUNNING_QUOTA and self.max_running is not None:
            return "max_running", self.max_running
        if reason is TicketReason.QUEUED_QUOTA and self.max_queued is not None:
            return "max_queued", self.max_queued
        raise ValueError(f"{reason} is not a refusal this quota can make ({self})")


def quota_verdict(quota: KeyQuota, *, running: int, queued: int, would_queue: bool) -> TicketReason | None:
    """Whether a new create of an owner with `running` admitted and `queued` waiting tickets is refused, and why:
    RUNNING_QUOTA when admitting every live ticket of the owner plus this one would exceed `max_running`;
    QUEUED_QUOTA when it would have to queue (`would_queue`) and `max_queued` tickets of the owner already wait;
    None when it may go on to admission."""
    if quota.max_running is not None and running + queued >= quota.max_running:
        return TicketReason.RUNNING_QUOTA
    if would_queue and quota.max_queued is not None and queued >= quota.max_queued:
        return TicketReason.QUEUED_QUOTA
    return None


def _bound(name: str, value: int | None, minimum: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise AdmissionConfigError(f"{name} must be an integer >= {minimum} (or unset: no bound), got {value!r}")


UNLIMITED = KeyQuota()
"""No bound at all (the default)."""
