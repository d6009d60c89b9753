"""`UsageMeter`: one instance's admission events and generated chunks, turned into usage in a `UsageLedger`.

The in-memory admission's counterpart of what the Redis scripts do at each ticket transition (docs/scale-out.md,
§12): a create that gets a ticket counts one session; leaving the queue (admitted, expired, cancelled) counts the
wait; holding a slot counts running time, up to each chunk boundary (with the chunk and its frames), up to every
`settle()` (a read of the usage) and finally up to the release. Durations are measured on the admission's clock,
as the events report them, and placed in the ledger's wall-clock buckets by the wall time they ended at. Pure:
`now` and `wall` are read from the injected clocks, nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from admission import AdmissionEvent, AdmissionEventKind, Clock
from service.usage.ledger import UsageLedger, UsageTotals

__all__ = ["UsageMeter"]


@dataclass(slots=True)
class _Running:
    owner: str
    mark: float  # admission clock: running time is counted up to here


class UsageMeter:
    """Feeds `ledger` from admission events (`event`, a controller listener) and chunks (`chunk`).

    Example::

        meter = UsageMeter(ledger, controller.clock, time.time)
        controller.subscribe(meter.event)
        meter.chunk(session_id, frames=4)     # on every generated chunk
        meter.settle(owner)                   # before reading the owner's usage: running time up to now
    """

    def __init__(self, ledger: UsageLedger, clock: Clock, wall: Callable[[], float]) -> None:
        self._ledger = ledger
        self._clock = clock
        self._wall = wall
        self._queued: dict[str, float] = {}  # ticket id -> created_at (admission clock)
        self._running: dict[str, _Running] = {}

    @property
    def ledger(self) -> UsageLedger:
        return self._ledger

    def event(self, event: AdmissionEvent) -> None:
        view = event.ticket
        kind = event.kind
        tid, owner = view.ticket_id, view.owner
        if kind is AdmissionEventKind.QUEUED:
            self._queued[tid] = view.created_at
            self._ledger.add(owner, self._wall(), UsageTotals(sessions=1))
        elif kind is AdmissionEventKind.ADMITTED:
            admitted = view.admitted_at if view.admitted_at is not None else self._clock.now()
            created = self._queued.pop(tid, None)
            if created is None:
                self._ledger.add(owner, self._wall(), UsageTotals(sessions=1))
            else:
                self._span(owner, created, admitted, queued=True)
            self._running[tid] = _Running(owner, admitted)
        elif kind in (AdmissionEventKind.EXPIRED, AdmissionEventKind.CANCELLED):
            created = self._queued.pop(tid, None)
            if created is not None:
                ended = view.ended_at if view.ended_at is not None else self._clock.now()
                self._span(owner, created, ended, queued=True)
        elif kind is AdmissionEventKind.RELEASED:
            running = self._running.pop(tid, None)
            if running is not None:
                ended = view.ended_at if view.ended_at is not None else self._clock.now()
                self._span(owner, running.mark, ended, queued=False)

    def chunk(self, ticket_id: str, owner: str, frames: int) -> None:
        """A chunk of `frames` frames was generated: running time up to now, then the chunk."""
        running = self._running.get(ticket_id)
        if running is not None:
            self._advance(running)
        self._ledger.add(owner, self._wall(), UsageTotals(chunks=1, frames=frames))

    def settle(self, owner: str | None = None) -> None:
        """Count running time up to now for every running session (of `owner`)."""
        for running in self._running.values():
            if owner is None or running.owner == owner:
                self._advance(running)

    def _advance(self, running: _Running) -> None:
        now = self._clock.now()
        self._span(running.owner, running.mark, now, queued=False)
        running.mark = max(running.mark, now)

    def _span(self, owner: str, start: float, end: float, *, queued: bool) -> None:
        """Place a span measured on the admission clock into wall time (it ended `now - end` ago)."""
        if end <= start:
            return
        offset = self._wall() - self._clock.now()
        self._ledger.add_span(owner, start + offset, end + offset, queued=queued)
