"""Layer 1, session admission: which session may hold a slot on which model worker, and who waits.

`AdmissionController` owns the slot accounting of one service instance: `num_workers` model workers with
`max_sessions_per_worker` retained sessions each, a bounded FIFO of waiting tickets with a queue timeout and a
heartbeat timeout, drain, worker health and statistics. It is a pure, deterministic core: no awaits, no threads,
time read from an injected `Clock`. `admission.driver.AdmissionDriver` is the thin asyncio shell around it. Its
mutable ticket record is `admission._live.LiveTicket` and its event delivery `admission._outbox.EventOutbox`.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections import Counter, OrderedDict
from collections.abc import Callable

from admission._live import END_EVENT, LiveTicket, decrement
from admission._outbox import AdmissionListener, EventOutbox
from admission.clock import Clock, MonotonicClock
from admission.config import AdmissionConfig, AdmissionStatistics
from admission.errors import (
    AdmissionInvariantError,
    TicketExistsError,
    UnknownTicketError,
    UnknownWorkerError,
)
from admission.quota import quota_verdict
from admission.summary import RingBufferSummary
from admission.ticket import (
    AdmissionEventKind,
    TicketReason,
    TicketState,
    TicketView,
    require_transition,
)

__all__ = ["AdmissionController", "AdmissionListener"]

logger = logging.getLogger(__name__)


class AdmissionController:
    """Admits sessions onto model workers, queues the rest in a bounded FIFO, and never leaks a slot.

    Problem: a service instance has a fixed number of session slots (`num_workers * max_sessions_per_worker`).
    Creates, deletes, timeouts and worker failures arrive in any order; every slot must be counted exactly once.

    Example (what a REST handler does)::

        view = controller.create(owner=api_key_id, ticket_id=session_id)
        if view.state is TicketState.ADMITTED:      # 201, start the session on worker `view.worker`
            ...
        elif view.state is TicketState.QUEUED:      # 202, `view.position` (1 = next in line)
            ...
        elif view.reason is TicketReason.QUEUE_FULL:  # 429, Retry-After: `view.retry_after_s`
            ...
        elif view.reason in (TicketReason.RUNNING_QUOTA, TicketReason.QUEUED_QUOTA):  # 429 quota_exceeded
            ...
        else:                                       # TicketReason.DRAINING: 503
            ...
        controller.heartbeat(session_id)            # on every GET / while the client's SSE stream is open
        controller.release(session_id)              # DELETE, or the session ended: idempotent

    Ordering: strict FIFO. A create is admitted at once only when nobody waits and a healthy worker has room;
    otherwise it queues at the tail. Whenever room appears (a release, a worker turning healthy) the head of the
    queue is admitted onto any healthy worker with room, least-loaded first, ties to the lowest index.

    Quotas: each owner's `KeyQuota` (`config.quota_of(owner)`, see `admission.quota`) is checked in `create`, in
    the same step as the admission decision, before the queue bound: a refused create (reason RUNNING_QUOTA or
    QUEUED_QUOTA) never takes a place in the queue, and since an owner's live tickets never exceed its
    `max_running`, the FIFO stays strict and one owner never holds up another.

    Backpressure: the queue is bounded by `queue_size` (overflow policy: reject, with a Retry-After estimate);
    `queue_size = 0` rejects whenever no slot is free. Waiting is bounded by `queue_timeout` (state EXPIRED, reason
    QUEUE_TIMEOUT) and by `queue_heartbeat_timeout` (state EXPIRED, reason HEARTBEAT_LOST).

    Time: deadlines are checked at the start of every public call (reads included) and by `tick()`, which the
    async driver calls in the background. A ticket whose deadline passed before a slot freed expires first.

    Drain: `drain()` is one-way (the service calls it on SIGTERM). New creates are rejected with reason DRAINING,
    every queued ticket is cancelled with reason DRAINING (an instance that is going away cannot admit them, and
    clients should retry elsewhere now rather than time out), admitted sessions keep their slots until released.

    Worker health: an unhealthy worker admits nothing; the sessions it already holds stay retained until the
    service releases them (the controller cannot know whether their state survived). Turning it healthy again
    admits from the queue at once.

    Events: listeners registered with `subscribe()` receive one `AdmissionEvent` per ticket state change,
    including position changes of every ticket behind one that left the queue. Delivery rule: events are collected
    while an operation runs and delivered, in order, only after the operation has finished and the state is
    consistent. A listener may call back into the controller; that nested call completes its own state change at
    once, and its events are appended to the same outbox and delivered after the current event (never
    recursively). An event carries a snapshot; the controller's current state may already be newer. A listener
    that raises is logged and skipped; it cannot break the controller.

    Threads: not thread-safe. Call it from one thread (the event loop); no call ever blocks.
    """

    def __init__(self, config: AdmissionConfig, *, clock: Clock | None = None) -> None:
        self._config = config
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._retained = [0] * config.num_workers
        self._healthy = [True] * config.num_workers
        self._live: dict[str, LiveTicket] = {}
        # Queued tickets in FIFO order; their queue deadlines are therefore in ascending order.
        self._queue: OrderedDict[str, LiveTicket] = OrderedDict()
        # Queued tickets ordered by last heartbeat, oldest first; heartbeat deadlines ascend in this order.
        self._silence: OrderedDict[str, LiveTicket] = OrderedDict()
        self._finished: OrderedDict[str, TicketView] = OrderedDict()
        self._positions_dirty = False
        self._draining = False
        self._outbox = EventOutbox()
        self._ids = itertools.count(1)
        self._session_lengths = RingBufferSummary(config.session_length_window)
        self._waits = RingBufferSummary(config.wait_window)
        self._queued_total = 0
        self._admitted_total = 0
        self._rejected_total = 0
        self._rejected_draining_total = 0
        self._quota_rejected_total = 0
        # Live tickets per owner: admitted (running) and queued; owners with none are removed.
        self._running_of: Counter[str] = Counter()
        self._queued_of: Counter[str] = Counter()
        self._expired_total = 0
        self._heartbeat_lost_total = 0
        self._cancelled_total = 0
        self._released_total = 0

    # ----------------------------------------------------------------------------------------------- observers

    @property
    def config(self) -> AdmissionConfig:
        return self._config

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def draining(self) -> bool:
        return self._draining

    def subscribe(self, listener: AdmissionListener) -> Callable[[], None]:
        """Register `listener` for every event from now on; returns a callable that unsubscribes it (idempotent)."""
        return self._outbox.subscribe(listener)

    def get(self, ticket_id: str) -> TicketView:
        """The ticket's current snapshot (live, or finished and still in history). Not a heartbeat."""
        now = self._begin()
        try:
            return self._view_of(ticket_id)
        finally:
            self._end(now)

    def list_tickets(
        self, *, owner: str | None = None, state: TicketState | None = None, worker: int | None = None
    ) -> tuple[TicketView, ...]:
        """Live (queued or admitted) tickets in creation order, filtered by owner, state and/or worker (e.g. to
        release every session of a worker that died)."""
        now = self._begin()
        try:
            return tuple(
                ticket.view()
                for ticket in self._live.values()
                if (owner is None or ticket.owner == owner)
                and (state is None or ticket.state is state)
                and (worker is None or ticket.worker == worker)
            )
        finally:
            self._end(now)

    def retry_after_s(self) -> int:
        """Whole seconds a rejected client should wait before retrying: the mean of recent session lengths (or
        `default_session_seconds` before any session ended) divided by the instance's slot count, i.e. the expected
        time until some slot frees and the queue moves up by one; clamped to `1 .. max_retry_after_s`."""
        mean = self._session_lengths.mean()
        length = self._config.default_session_seconds if mean is None else mean
        estimate = math.ceil(length / self._config.capacity)
        return min(self._config.max_retry_after_s, max(1, estimate))

    def next_deadline(self) -> float | None:
        """The earliest queue or heartbeat deadline among queued tickets (clock seconds), or None if none waits."""
        deadlines: list[float] = []
        head = next(iter(self._queue.values()), None)
        if head is not None and head.queue_deadline is not None:
            deadlines.append(head.queue_deadline)
        quiet = next(iter(self._silence.values()), None)
        if quiet is not None and quiet.heartbeat_deadline is not None:
            deadlines.append(quiet.heartbeat_deadline)
        return min(deadlines, default=None)

    def statistics(self) -> AdmissionStatistics:
        now = self._begin()
        try:
            return AdmissionStatistics(
                retained=tuple(self._retained),
                healthy=tuple(self._healthy),
                max_sessions_per_worker=self._config.max_sessions_per_worker,
                queue_depth=len(self._queue),
                queue_size=self._config.queue_size,
                draining=self._draining,
                queued_total=self._queued_total,
                admitted_total=self._admitted_total,
                rejected_total=self._rejected_total,
                rejected_draining_total=self._rejected_draining_total,
                expired_total=self._expired_total,
                heartbeat_lost_total=self._heartbeat_lost_total,
                cancelled_total=self._cancelled_total,
                released_total=self._released_total,
                queue_wait=self._waits.snapshot(),
                session_length=self._session_lengths.snapshot(),
                quota_rejected_total=self._quota_rejected_total,
            )
        finally:
            self._end(now)

    # ----------------------------------------------------------------------------------------------- commands

    def create(self, owner: str, *, ticket_id: str | None = None) -> TicketView:
        """Ask for a slot for a new session owned by `owner` (an opaque identity, e.g. the API key's id).

        Returns the new ticket: ADMITTED (with `worker`), QUEUED (with `position`), or REJECTED with reason
        DRAINING, RUNNING_QUOTA / QUEUED_QUOTA (the owner's quota) or QUEUE_FULL (with `retry_after_s`). A rejected
        ticket is not remembered; its id may be reused. `ticket_id` defaults to a generated `ticket-N`; an id that
        is live or in history raises `TicketExistsError`.
        """
        now = self._begin()
        try:
            ticket_id = self._claim_id(ticket_id)
            if self._draining:
                return self._reject(ticket_id, owner, now, TicketReason.DRAINING, None)
            worker = None if self._queue else self._pick_worker()
            refusal = quota_verdict(
                self._config.quota_of(owner),
                running=self._running_of[owner],
                queued=self._queued_of[owner],
                would_queue=worker is None,
            )
            if refusal is not None:
                return self._reject(ticket_id, owner, now, refusal, None)
            if worker is not None:
                ticket = LiveTicket(ticket_id, owner, TicketState.ADMITTED, now)
                self._live[ticket_id] = ticket
                self._occupy(ticket, worker, now)
                return ticket.view()
            if len(self._queue) < self._config.queue_size:
                return self._enqueue(ticket_id, owner, now).view()
            return self._reject(ticket_id, owner, now, TicketReason.QUEUE_FULL, self.retry_after_s())
        finally:
            self._end(now)

    def heartbeat(self, ticket_id: str) -> TicketView:
        """The waiting client is still there: push its heartbeat deadline out. A no-op for tickets that are not
        queued (admitted or finished), so the service may call it on every GET and SSE keep-alive."""
        now = self._begin()
        try:
            ticket = self._live.get(ticket_id)
            if ticket is None:
                return self._view_of(ticket_id)
            timeout = self._config.queue_heartbeat_timeout
            if ticket.state is TicketState.QUEUED and timeout is not None:
                ticket.heartbeat_deadline = now + timeout
                self._silence.move_to_end(ticket_id)
            return ticket.view()
        finally:
            self._end(now)

    def cancel(self, ticket_id: str) -> TicketView:
        """Withdraw a queued ticket (state CANCELLED, reason CLIENT_CANCELLED); everyone behind moves up.

        Idempotent on finished tickets (returns their snapshot). On an ADMITTED ticket it raises
        `IllegalTransitionError`: an admitted session ends with `release()`. A DELETE handler that does not care
        which state the ticket is in should call `release()`, which also cancels queued tickets.
        """
        now = self._begin()
        try:
            ticket = self._live.get(ticket_id)
            if ticket is None:
                return self._view_of(ticket_id)
            require_transition(ticket_id, ticket.state, TicketState.CANCELLED)
            self._leave_queue(ticket, TicketState.CANCELLED, TicketReason.CLIENT_CANCELLED, now)
            self._settle(now)
            return ticket.view()
        finally:
            self._end(now)

    def release(self, ticket_id: str) -> TicketView:
        """The session is over, whatever its state: ADMITTED -> RELEASED (the slot goes back and the queue head is
        admitted), QUEUED -> CANCELLED (reason CLIENT_CANCELLED), finished -> no-op. Idempotent; unknown ids
        raise `UnknownTicketError`."""
        now = self._begin()
        try:
            ticket = self._live.get(ticket_id)
            if ticket is None:
                return self._view_of(ticket_id)
            if ticket.state is TicketState.QUEUED:
                self._leave_queue(ticket, TicketState.CANCELLED, TicketReason.CLIENT_CANCELLED, now)
            else:
                self._release_slot(ticket, now)
            self._settle(now)
            return ticket.view()
        finally:
            self._end(now)

    def tick(self) -> None:
        """Expire every queued ticket whose queue or heartbeat deadline has passed. Any other call does too."""
        self._end(self._begin())

    def set_worker_healthy(self, index: int, healthy: bool) -> None:
        """Mark worker `index` (un)healthy. Unhealthy workers admit nothing; turning healthy admits from the queue.
        Sessions already on the worker keep their slots until released. Idempotent."""
        if not 0 <= index < self._config.num_workers:
            raise UnknownWorkerError(index, self._config.num_workers)
        now = self._begin()
        try:
            if self._healthy[index] != healthy:
                logger.info("admission: worker %d is now %s", index, "healthy" if healthy else "unhealthy")
            self._healthy[index] = healthy
            self._settle(now)
        finally:
            self._end(now)

    def drain(self) -> tuple[TicketView, ...]:
        """Stop admitting for good: reject new creates (reason DRAINING) and cancel every queued ticket (reason
        DRAINING). Admitted sessions keep their slots until released. Returns the tickets it cancelled; idempotent
        (a second call cancels nothing)."""
        now = self._begin()
        try:
            if not self._draining:
                logger.info("admission: draining; %d queued ticket(s) cancelled", len(self._queue))
            self._draining = True
            cancelled = []
            while self._queue:
                ticket = next(iter(self._queue.values()))
                self._leave_queue(ticket, TicketState.CANCELLED, TicketReason.DRAINING, now)
                cancelled.append(ticket.view())
            return tuple(cancelled)
        finally:
            self._end(now)

    def check_invariants(self) -> None:
        """Raise `AdmissionInvariantError` if the accounting is inconsistent (tests call this after every step)."""
        problems: list[str] = []
        cap = self._config.max_sessions_per_worker
        admitted = [t for t in self._live.values() if t.state is TicketState.ADMITTED]
        per_worker = [0] * self._config.num_workers
        for ticket in admitted:
            if ticket.worker is None:
                problems.append(f"admitted ticket {ticket.ticket_id!r} has no worker")
            else:
                per_worker[ticket.worker] += 1
        if per_worker != self._retained:
            problems.append(f"retained counts {self._retained} != admitted tickets per worker {per_worker}")
        problems.extend(f"worker {i} retains {n} > {cap}" for i, n in enumerate(self._retained) if not 0 <= n <= cap)
        queued = [t for t in self._live.values() if t.state is TicketState.QUEUED]
        if {t.ticket_id for t in queued} != set(self._queue):
            problems.append("the FIFO and the live queued tickets differ")
        if self._config.queue_heartbeat_timeout is not None and set(self._silence) != set(self._queue):
            problems.append("the heartbeat order and the FIFO hold different tickets")
        if len(self._queue) > self._config.queue_size:
            problems.append(f"queue depth {len(self._queue)} exceeds queue_size {self._config.queue_size}")
        positions = [t.position for t in self._queue.values()]
        if positions != list(range(1, len(positions) + 1)):
            problems.append(f"queue positions are {positions}, not 1..{len(positions)}")
        if self._queue and (self._draining or self._pick_worker() is not None):
            problems.append("a ticket waits although it could be admitted (or the controller is draining)")
        if any(t.state not in (TicketState.QUEUED, TicketState.ADMITTED) for t in self._live.values()):
            problems.append("a finished ticket is still live")
        running_of = Counter(t.owner for t in admitted)
        queued_of = Counter(t.owner for t in queued)
        if running_of != self._running_of or queued_of != self._queued_of:
            problems.append("the per-owner counts differ from the live tickets")
        for owner in set(running_of) | set(queued_of):
            quota = self._config.quota_of(owner)
            live = running_of[owner] + queued_of[owner]
            if quota.max_running is not None and live > quota.max_running:
                problems.append(f"owner {owner!r} has {live} live tickets > max_running {quota.max_running}")
            if quota.max_queued is not None and queued_of[owner] > quota.max_queued:
                problems.append(f"owner {owner!r} has {queued_of[owner]} queued > max_queued {quota.max_queued}")
        if problems:
            raise AdmissionInvariantError("; ".join(problems))

    # ----------------------------------------------------------------------------------------------- internals

    def _begin(self) -> float:
        """Start of every public call: read the clock, expire what is due, settle the queue."""
        now = self._clock.now()
        self._expire_due(now)
        self._settle(now)
        return now

    def _end(self, now: float) -> None:
        """End of every public call, also on error: settle again, then deliver the collected events."""
        self._settle(now)
        self._outbox.publish()

    def _claim_id(self, ticket_id: str | None) -> str:
        if ticket_id is None:
            ticket_id = f"ticket-{next(self._ids)}"
            while ticket_id in self._live or ticket_id in self._finished:
                ticket_id = f"ticket-{next(self._ids)}"
            return ticket_id
        if ticket_id in self._live or ticket_id in self._finished:
            raise TicketExistsError(ticket_id)
        return ticket_id

    def _view_of(self, ticket_id: str) -> TicketView:
        ticket = self._live.get(ticket_id)
        if ticket is not None:
            return ticket.view()
        finished = self._finished.get(ticket_id)
        if finished is None:
            raise UnknownTicketError(ticket_id)
        return finished

    def _pick_worker(self) -> int | None:
        """Least-loaded healthy worker with a free slot; ties go to the lowest index."""
        best: int | None = None
        cap = self._config.max_sessions_per_worker
        for index, (count, healthy) in enumerate(zip(self._retained, self._healthy, strict=True)):
            if healthy and count < cap and (best is None or count < self._retained[best]):
                best = index
        return best

    def _enqueue(self, ticket_id: str, owner: str, now: float) -> LiveTicket:
        ticket = LiveTicket(ticket_id, owner, TicketState.QUEUED, now)
        ticket.position = len(self._queue) + 1
        ticket.queue_deadline = now + self._config.queue_timeout
        self._live[ticket_id] = ticket
        self._queue[ticket_id] = ticket
        if self._config.queue_heartbeat_timeout is not None:
            ticket.heartbeat_deadline = now + self._config.queue_heartbeat_timeout
            self._silence[ticket_id] = ticket
        self._queued_of[owner] += 1
        self._queued_total += 1
        self._outbox.emit(AdmissionEventKind.QUEUED, ticket.view())
        return ticket

    def _reject(
        self, ticket_id: str, owner: str, now: float, reason: TicketReason, retry_after_s: int | None
    ) -> TicketView:
        ticket = LiveTicket(ticket_id, owner, TicketState.REJECTED, now)
        ticket.reason = reason
        ticket.retry_after_s = retry_after_s
        ticket.ended_at = now
        self._rejected_total += 1
        if reason is TicketReason.DRAINING:
            self._rejected_draining_total += 1
        elif reason in (TicketReason.RUNNING_QUOTA, TicketReason.QUEUED_QUOTA):
            self._quota_rejected_total += 1
        self._outbox.emit(AdmissionEventKind.REJECTED, ticket.view())
        return ticket.view()

    def _admit_from_queue(self, ticket: LiveTicket, worker: int, now: float) -> None:
        """QUEUED -> ADMITTED onto `worker`; the caller has already taken the ticket out of the queue."""
        require_transition(ticket.ticket_id, ticket.state, TicketState.ADMITTED)
        ticket.state = TicketState.ADMITTED
        self._occupy(ticket, worker, now)

    def _occupy(self, ticket: LiveTicket, worker: int, now: float) -> None:
        """Count an ADMITTED ticket's slot on `worker` (born admitted, or just moved out of the queue)."""
        if self._retained[worker] >= self._config.max_sessions_per_worker or not self._healthy[worker]:
            raise AdmissionInvariantError(f"worker {worker} has no room for ticket {ticket.ticket_id!r}")
        ticket.worker = worker
        ticket.admitted_at = now
        ticket.position = None
        self._retained[worker] += 1
        self._running_of[ticket.owner] += 1
        self._admitted_total += 1
        self._waits.record(now - ticket.created_at)
        logger.debug("admission: %s admitted on worker %d", ticket.ticket_id, worker)
        self._outbox.emit(AdmissionEventKind.ADMITTED, ticket.view())

    def _release_slot(self, ticket: LiveTicket, now: float) -> None:
        require_transition(ticket.ticket_id, ticket.state, TicketState.RELEASED)
        worker = ticket.worker
        if worker is None or self._retained[worker] <= 0:
            raise AdmissionInvariantError(f"ticket {ticket.ticket_id!r} is admitted but holds no counted slot")
        ticket.state = TicketState.RELEASED
        ticket.reason = TicketReason.SESSION_ENDED
        ticket.ended_at = now
        self._retained[worker] -= 1
        decrement(self._running_of, ticket.owner)
        self._released_total += 1
        if ticket.admitted_at is not None:
            self._session_lengths.record(now - ticket.admitted_at)
        self._finish(ticket)
        self._outbox.emit(AdmissionEventKind.RELEASED, ticket.view())

    def _leave_queue(self, ticket: LiveTicket, state: TicketState, reason: TicketReason, at: float) -> None:
        """QUEUED -> EXPIRED or CANCELLED; everyone behind moves up at the next settle."""
        require_transition(ticket.ticket_id, ticket.state, state)
        del self._queue[ticket.ticket_id]
        self._silence.pop(ticket.ticket_id, None)
        decrement(self._queued_of, ticket.owner)
        self._positions_dirty = True
        ticket.state = state
        ticket.reason = reason
        ticket.ended_at = at
        if state is TicketState.EXPIRED:
            self._expired_total += 1
            if reason is TicketReason.HEARTBEAT_LOST:
                self._heartbeat_lost_total += 1
        else:
            self._cancelled_total += 1
        logger.debug("admission: %s left the queue: %s (%s)", ticket.ticket_id, state.value, reason.value)
        self._finish(ticket)
        self._outbox.emit(END_EVENT[state], ticket.view())

    def _finish(self, ticket: LiveTicket) -> None:
        del self._live[ticket.ticket_id]
        if self._config.finished_history == 0:
            return
        self._finished[ticket.ticket_id] = ticket.view()
        while len(self._finished) > self._config.finished_history:
            self._finished.popitem(last=False)

    def _expire_due(self, now: float) -> None:
        """Expire, earliest deadline first, every queued ticket whose queue or heartbeat deadline is <= now."""
        while self._queue:
            head = next(iter(self._queue.values()))
            ticket, deadline, reason = head, head.queue_deadline, TicketReason.QUEUE_TIMEOUT
            quiet = next(iter(self._silence.values()), None)
            silent_until = None if quiet is None else quiet.heartbeat_deadline
            if quiet is not None and silent_until is not None and (deadline is None or silent_until < deadline):
                ticket, deadline, reason = quiet, silent_until, TicketReason.HEARTBEAT_LOST
            if deadline is None or deadline > now:
                return
            self._leave_queue(ticket, TicketState.EXPIRED, reason, deadline)

    def _settle(self, now: float) -> None:
        """Admit from the head while a healthy worker has room, then renumber the queue (emitting position events)."""
        if not self._draining:
            while self._queue:
                worker = self._pick_worker()
                if worker is None:
                    break
                _, ticket = self._queue.popitem(last=False)
                self._silence.pop(ticket.ticket_id, None)
                decrement(self._queued_of, ticket.owner)
                self._positions_dirty = True
                self._admit_from_queue(ticket, worker, now)
        if self._positions_dirty:
            self._positions_dirty = False
            for position, ticket in enumerate(self._queue.values(), start=1):
                if ticket.position != position:
                    ticket.position = position
                    self._outbox.emit(AdmissionEventKind.POSITION_CHANGED, ticket.view())
