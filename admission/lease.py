"""Layer 2, the LingBot execution lease: which admitted session may run its next chunk on one model worker.

`LeaseCore` is the pure, deterministic state machine (no awaits, injected clock); `ExecutionLease` is the asyncio
shell that a LingBot worker uses as `async with lease.grant(session_id): <run one whole chunk>`. One lease exists
per model worker. It is a LingBot policy, not a pipeline feature: other `BidirectionalService` implementations
choose their own cross-session policy.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from admission.clock import Clock, MonotonicClock
from admission.errors import AdmissionInvariantError, LeaseAlreadyRequestedError, LeaseSessionRemovedError
from admission.summary import DurationSummary, RingBufferSummary

__all__ = ["ExecutionLease", "LeaseCore", "LeaseStatistics"]


@dataclass(frozen=True, slots=True)
class LeaseStatistics:
    """A snapshot of one lease. `waiters` are session ids in grant order; `grants_per_session` counts grants of
    every session that has requested and is not removed yet (0 while its first request waits); `total_grants`
    counts all grants since start; `wait_time` summarises request-to-grant times (0.0 on an idle lease)."""

    holder: str | None
    holder_since: float | None
    waiters: tuple[str, ...]
    grants_per_session: Mapping[str, int]
    total_grants: int
    wait_time: DurationSummary


class _Place:
    """One session's place in the lease: waiting, or holding the grant."""

    __slots__ = ("granted_at", "removed", "requested_at", "session_id", "ticket")

    def __init__(self, ticket: int, session_id: str, requested_at: float) -> None:
        self.ticket = ticket
        self.session_id = session_id
        self.requested_at = requested_at
        self.granted_at: float | None = None
        self.removed = False


class LeaseCore:
    """The lease's decisions, without asyncio: a strict FIFO of tickets and at most one holder.

    `request()` returns a ticket (an int, unique for the core's life) that is granted at once when the lease is
    idle, otherwise queued at the tail. `release(ticket)` gives up whatever that ticket is now: the grant (the
    next waiter is granted and its ticket returned so the shell can wake it), a waiting place (withdrawn), or
    nothing (already released or removed: a no-op). That one idempotent call covers the end of a chunk, a
    cancelled waiter and a waiter cancelled just after it was granted.
    """

    def __init__(self, clock: Clock | None = None, *, wait_window: int = 1024) -> None:
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._next_ticket = 1
        self._holder: _Place | None = None
        self._waiting: OrderedDict[int, _Place] = OrderedDict()
        self._place_of: dict[str, _Place] = {}
        self._grants: dict[str, int] = {}
        self._total_grants = 0
        self._waits = RingBufferSummary(wait_window)

    @property
    def holder(self) -> str | None:
        return None if self._holder is None else self._holder.session_id

    @property
    def waiters(self) -> tuple[str, ...]:
        return tuple(place.session_id for place in self._waiting.values())

    def has_place(self, session_id: str) -> bool:
        """Whether the session waits for or holds the lease (then a new `request` would be refused)."""
        return session_id in self._place_of

    def is_granted(self, ticket: int) -> bool:
        return self._holder is not None and self._holder.ticket == ticket

    def request(self, session_id: str) -> int:
        """Queue the session for one chunk; returns its ticket, already granted if the lease was idle.

        Raises `LeaseAlreadyRequestedError` if the session already waits or holds: one place per session.
        """
        existing = self._place_of.get(session_id)
        if existing is not None:
            raise LeaseAlreadyRequestedError(session_id, holding=existing is self._holder)
        place = _Place(self._next_ticket, session_id, self._clock.now())
        self._next_ticket += 1
        self._place_of[session_id] = place
        self._grants.setdefault(session_id, 0)
        if self._holder is None and not self._waiting:
            self._grant(place)
        else:
            self._waiting[place.ticket] = place
        return place.ticket

    def release(self, ticket: int) -> int | None:
        """Give up `ticket`'s grant or waiting place; returns the ticket granted next, if this freed the lease."""
        holder = self._holder
        if holder is not None and holder.ticket == ticket:
            self._holder = None
            self._forget(holder)
            return self._grant_next()
        place = self._waiting.pop(ticket, None)
        if place is not None:
            self._forget(place)
        return None

    def remove_session(self, session_id: str) -> int | None:
        """The session closed. A waiting place is withdrawn and its ticket returned (the shell fails that waiter).
        A held grant is not revoked (the chunk in flight must end first): it passes on when its holder releases.
        The session's grant count is forgotten once it holds nothing. Idempotent."""
        place = self._place_of.get(session_id)
        if place is None:
            self._grants.pop(session_id, None)
            return None
        place.removed = True
        if place is self._holder:
            return None
        del self._waiting[place.ticket]
        self._forget(place)
        return place.ticket

    def statistics(self) -> LeaseStatistics:
        holder = self._holder
        return LeaseStatistics(
            holder=None if holder is None else holder.session_id,
            holder_since=None if holder is None else holder.granted_at,
            waiters=self.waiters,
            grants_per_session=MappingProxyType(dict(self._grants)),
            total_grants=self._total_grants,
            wait_time=self._waits.snapshot(),
        )

    def _forget(self, place: _Place) -> None:
        if self._place_of.pop(place.session_id, None) is not place:
            raise AdmissionInvariantError(f"lease place of session {place.session_id!r} was not tracked")
        if place.removed:
            self._grants.pop(place.session_id, None)

    def _grant_next(self) -> int | None:
        if not self._waiting:
            return None
        _, place = self._waiting.popitem(last=False)
        self._grant(place)
        return place.ticket

    def _grant(self, place: _Place) -> None:
        now = self._clock.now()
        place.granted_at = now
        self._holder = place
        self._grants[place.session_id] = self._grants.get(place.session_id, 0) + 1
        self._total_grants += 1
        self._waits.record(now - place.requested_at)


class ExecutionLease:
    """The FIFO execution lease of one model worker: only the holder may submit model work, for one whole chunk.

    Problem: several admitted sessions share one model worker. If each submitted chunks whenever its client sent
    input, a client that keeps sending input could occupy the model forever and starve the others. The lease makes
    sessions take turns: a grant covers exactly one whole chunk of one session (from submission until its frames
    are emitted), and the next chunk needs a new turn.

    Example::

        lease = ExecutionLease()
        while session.has_work():                   # a session with nothing to generate does not queue
            async with lease.grant(session.id):     # waits for its turn
                await run_one_chunk(session)        # encode/denoise/decode may overlap inside the chunk
        ...
        lease.remove_session(session.id)            # when the session closes

    Ordering: strict FIFO by request time. A release hands the grant straight to the head waiter (no barging: a
    session that re-requests right after its chunk goes to the tail), so K busy sessions are served round-robin,
    one chunk each. A session holds at most one place: a second `grant()` while it waits or holds raises
    `LeaseAlreadyRequestedError` at once, so spamming input cannot buy extra turns.

    Backpressure: the waiting line is bounded by the number of sessions on the worker (one place each, and layer 1
    bounds sessions per worker); no other buffer exists.

    Cancellation: cancelling a waiter removes its place; if it had just been granted but not yet resumed, the
    grant passes to the next waiter (no lost wake-up). Leaving the `async with` block, by return, exception or
    cancellation, ends the grant and wakes the next waiter. `remove_session()` fails a waiting `grant()` with
    `LeaseSessionRemovedError`; a held grant is not revoked (the caller cancels the chunk task, whose exit
    releases). Not thread-safe: use it from the worker's event loop.
    """

    def __init__(self, *, clock: Clock | None = None, wait_window: int = 1024) -> None:
        self._core = LeaseCore(clock, wait_window=wait_window)
        self._wakeups: dict[int, asyncio.Future[None]] = {}

    @property
    def core(self) -> LeaseCore:
        return self._core

    @property
    def holder(self) -> str | None:
        return self._core.holder

    def has_place(self, session_id: str) -> bool:
        """Whether the session already waits for or holds the lease (then `grant` would raise)."""
        return self._core.has_place(session_id)

    @contextlib.asynccontextmanager
    async def grant(self, session_id: str) -> AsyncIterator[None]:
        """Wait for the session's turn, hold the lease for the body (one chunk), then pass it on."""
        ticket = self._core.request(session_id)
        try:
            if not self._core.is_granted(ticket):
                wakeup: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._wakeups[ticket] = wakeup
                try:
                    await wakeup
                finally:
                    self._wakeups.pop(ticket, None)
            yield
        finally:
            self._wake(self._core.release(ticket))

    def remove_session(self, session_id: str) -> None:
        """The session closed: withdraw its waiting place (its `grant()` raises `LeaseSessionRemovedError`) and
        forget its statistics once it holds nothing. Idempotent."""
        withdrawn = self._core.remove_session(session_id)
        if withdrawn is None:
            return
        wakeup = self._wakeups.pop(withdrawn, None)
        if wakeup is not None and not wakeup.done():
            wakeup.set_exception(LeaseSessionRemovedError(session_id))

    def statistics(self) -> LeaseStatistics:
        return self._core.statistics()

    def _wake(self, ticket: int | None) -> None:
        # A cancelled waiter's future is already done; its own release() (in grant's finally) passes the grant on.
        if ticket is None:
            return
        wakeup = self._wakeups.get(ticket)
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)
