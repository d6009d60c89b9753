"""`MemoryAdmissionBackend`: the admission of one instance, in memory (the default `AdmissionBackend`).

It wraps `admission.AdmissionController` (the decisions: bounded FIFO, slots per worker) and its `AdmissionDriver`
(the timer that expires queued sessions) and hands every controller event about a live session to the runtime.
Everything here is synchronous and immediate: a decision is delivered before the call that made it returns. There
is no other replica, so every session has a record in the runtime and the registry calls find nothing (404).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from admission import (
    AdmissionConfig,
    AdmissionController,
    AdmissionDriver,
    AdmissionEvent,
    Clock,
    TicketReason,
    TicketState,
    UnknownTicketError,
)
from pipeline.bidirectional import CloseMode, PortableCheckpoint
from service.errors import DrainingError, QueueFullError, QuotaExceededError, SessionNotFoundError
from service.runtime.backend import AdmissionHost
from service.runtime.records import AdmissionReport, HandOffRoom, SnapshotStream
from service.runtime.sessions import Session, SessionSnapshot
from service.usage.ledger import UsageLedger, UsageReport, UsageTotals
from service.usage.meter import UsageMeter

__all__ = ["MemoryAdmissionBackend"]

logger = logging.getLogger(__name__)


class MemoryAdmissionBackend:
    """`AdmissionBackend` on this instance's own `AdmissionController`.

    `clock` is the controller's clock (tests inject a fake one); `tick_interval` the driver's expiry check
    interval (`RuntimeTuning.admission_tick_s`). Usage is counted in this process's memory (`UsageMeter`, fed by
    every controller event and chunk; durations on `clock`, bucketed by `wall`, Unix seconds): since start.
    """

    def __init__(
        self,
        config: AdmissionConfig,
        *,
        clock: Clock | None = None,
        tick_interval: float = 0.5,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._controller = AdmissionController(config, clock=clock)
        self._driver = AdmissionDriver(self._controller, tick_interval=tick_interval)
        self._unsubscribe: Callable[[], None] | None = None
        self._wall = wall
        self._meter = UsageMeter(UsageLedger(), self._controller.clock, wall)
        self._controller.subscribe(self._meter.event)

    @property
    def controller(self) -> AdmissionController:
        """The admission controller (read-only use: statistics and invariant checks)."""
        return self._controller

    # ---------------------------------------------------------------------------------------------- life

    async def start(self, host: AdmissionHost) -> None:
        def deliver(event: AdmissionEvent) -> None:
            # A controller listener: synchronous, after the controller's state is consistent.
            session = host.session(event.ticket.ticket_id)
            if session is not None and not session.terminal:
                host.admission_event(session, event)

        self._unsubscribe = self._controller.subscribe(deliver)
        self._driver.start()

    def stop_admitting(self) -> None:
        """Admit nothing more; every queued session is cancelled (reason draining) before this returns."""
        self._controller.drain()

    async def aclose(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        await self._driver.aclose()

    # ---------------------------------------------------------------------------------------------- state

    @property
    def available(self) -> bool:
        return True

    @property
    def shares_queue(self) -> bool:
        return False

    def statistics(self) -> AdmissionReport:
        return AdmissionReport(self._controller.statistics())

    def set_worker_healthy(self, index: int, healthy: bool) -> None:
        self._controller.set_worker_healthy(index, healthy)

    # ---------------------------------------------------------------------------------------------- tickets

    async def create(self, session: Session, config: Mapping[str, object], image: bytes | None) -> int | None:
        view = self._controller.create(owner=session.owner, ticket_id=session.id)
        if view.state is TicketState.REJECTED:
            if view.reason is TicketReason.QUEUE_FULL:
                raise QueueFullError(view.retry_after_s or self._controller.retry_after_s())
            if view.reason in (TicketReason.RUNNING_QUOTA, TicketReason.QUEUED_QUOTA):
                raise QuotaExceededError(*self._controller.config.quota_of(session.owner).limit_of(view.reason))
            raise DrainingError("the service is draining and admits no new sessions; retry on another instance")
        return view.position if view.state is TicketState.QUEUED else None

    def heartbeat(self, session_id: str) -> None:
        with contextlib.suppress(UnknownTicketError):
            self._controller.heartbeat(session_id)

    def cancel_queued(self, session: Session) -> None:
        self._controller.release(session.id)  # -> CANCELLED (client_cancelled), through the admission event

    def release(self, session: Session) -> None:
        self._controller.release(session.id)

    async def hand_off_room(self, session: Session) -> HandOffRoom:
        """One instance: there is no other replica to hand a session to."""
        return HandOffRoom.NEVER

    # ---------------------------------------------------------------------------------------------- usage

    def record_chunk(self, session: Session, frames: int) -> None:
        self._meter.chunk(session.id, session.owner, frames)

    def save_checkpoint(self, session: Session, checkpoint: PortableCheckpoint, *, resumable: bool) -> None:
        """One instance: the worker keeps the checkpoint on the session itself; nothing to do here."""

    async def usage(self, owner: str, since: float) -> UsageReport:
        self._meter.settle(owner)
        ledger = self._meter.ledger
        start = ledger.bucket_start(since)
        return UsageReport(owner, start, self._wall(), ledger.since(owner, start))

    def usage_totals(self) -> Mapping[str, UsageTotals]:
        return self._meter.ledger.totals()

    # ---------------------------------------------------------------------------------------------- registry

    async def lookup(self, owner: str, session_id: str) -> SessionSnapshot:
        raise SessionNotFoundError(session_id)

    async def lookup_here(self, owner: str, session_id: str) -> SessionSnapshot:
        raise SessionNotFoundError(session_id)

    async def sessions_of(self, owner: str) -> Sequence[SessionSnapshot]:
        """Nothing beyond the runtime's records; brings the queue's expiries up to date before it reads them."""
        self._controller.tick()
        return ()

    async def follow(self, owner: str, session_id: str) -> tuple[SessionSnapshot, SnapshotStream]:
        raise SessionNotFoundError(session_id)

    async def delete(self, owner: str, session_id: str, mode: CloseMode) -> SessionSnapshot:
        raise SessionNotFoundError(session_id)

    async def set_paused(self, owner: str, session_id: str, paused: bool) -> SessionSnapshot:
        raise SessionNotFoundError(session_id)
