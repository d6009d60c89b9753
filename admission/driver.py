"""The thin asyncio shell around `AdmissionController`: background expiry and awaiting admission.

Everything that decides lives in the controller; this module only turns its events into wake-ups for awaiting
coroutines and calls `tick()` in the background so that deadlines pass even when no request arrives.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Self

from admission.controller import AdmissionController
from admission.errors import AdmissionClosedError, AdmissionConfigError
from admission.ticket import AdmissionEvent, TicketState, TicketView

__all__ = ["AdmissionDriver"]

logger = logging.getLogger(__name__)


class AdmissionDriver:
    """Runs admission on an asyncio event loop: a background expiry task and `wait_until_admitted`.

    Problem: the controller is a pure core that only moves when called; a queue with no traffic would never notice
    its deadlines, and request handlers need to await the moment their ticket is admitted.

    Example::

        controller = AdmissionController(config)
        async with AdmissionDriver(controller) as driver:    # starts the expiry task; exit cancels and awaits it
            view = controller.create(owner="key-1", ticket_id="s1")
            if view.state is TicketState.QUEUED:
                view = await driver.wait_until_admitted("s1")  # ADMITTED, or EXPIRED / CANCELLED

    Ordering: waiters are woken from the controller's event delivery, i.e. after the state change is complete and
    in event order. Several coroutines may wait on one ticket; all are woken with the same snapshot.

    Backpressure: none of its own. Waiting does not count as a heartbeat: whoever holds the client's connection
    must keep calling `controller.heartbeat()`.

    Cancellation: cancelling `wait_until_admitted` only stops that wait (the ticket stays queued; cancel it through
    the controller if the client is gone). `aclose()` cancels and awaits the expiry task and fails pending waits
    with `AdmissionClosedError`; the controller itself stays usable.

    The expiry task sleeps until the next deadline or `tick_interval` seconds, whichever is sooner, and re-checks.
    """

    def __init__(self, controller: AdmissionController, *, tick_interval: float = 0.5) -> None:
        if not tick_interval > 0:
            raise AdmissionConfigError(f"tick_interval must be > 0 seconds, got {tick_interval!r}")
        self._controller = controller
        self._interval = tick_interval
        self._waiters: dict[str, set[asyncio.Future[TicketView]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._unsubscribe = controller.subscribe(self._on_event)

    @property
    def controller(self) -> AdmissionController:
        return self._controller

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def start(self) -> None:
        """Start the background expiry task (on the running loop). Idempotent."""
        if self._closed:
            raise AdmissionClosedError("the admission driver is closed")
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._expire_forever(), name="admission-expiry")

    async def aclose(self) -> None:
        """Cancel and await the expiry task, stop listening, fail pending waits. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._unsubscribe()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        waiters, self._waiters = self._waiters, {}
        for futures in waiters.values():
            for future in futures:
                if not future.done():
                    future.set_exception(AdmissionClosedError("the admission driver closed while waiting"))

    async def wait_until_admitted(self, ticket_id: str) -> TicketView:
        """Wait until the ticket is no longer queued and return its snapshot then: ADMITTED, or EXPIRED/CANCELLED
        (read `state` and `reason`). Returns at once for a ticket that is not queued; unknown ids raise
        `UnknownTicketError`. Bound the wait with `asyncio.timeout` if needed."""
        if self._closed:
            raise AdmissionClosedError("the admission driver is closed")
        view = self._controller.get(ticket_id)
        if view.state is not TicketState.QUEUED:
            return view
        future: asyncio.Future[TicketView] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(ticket_id, set()).add(future)
        try:
            return await future
        finally:
            futures = self._waiters.get(ticket_id)
            if futures is not None:
                futures.discard(future)
                if not futures:
                    del self._waiters[ticket_id]

    def _on_event(self, event: AdmissionEvent) -> None:
        if event.ticket.state is TicketState.QUEUED:
            return
        for future in self._waiters.pop(event.ticket.ticket_id, set()):
            if not future.done():
                future.set_result(event.ticket)

    async def _expire_forever(self) -> None:
        clock = self._controller.clock
        while True:
            try:
                self._controller.tick()
            except Exception:
                # Only a broken invariant can raise here; ticking on would repeat it. `aclose` collects the error.
                logger.exception("admission expiry task stopped")
                raise
            delay = self._interval
            deadline = self._controller.next_deadline()
            if deadline is not None:
                delay = min(delay, max(0.0, deadline - clock.now()))
            await asyncio.sleep(delay)
