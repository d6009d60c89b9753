"""`EventOutbox`: the controller's events, collected while an operation runs and delivered once it is complete.

Package-private (only `admission.controller` uses it). The delivery rule is the controller's (its docstring,
"Events"): events are appended while an operation changes state and delivered in order by `publish()`, which the
controller calls at the end of every public call. A listener may call back into the controller: that nested call
appends its events to the same outbox and its own `publish()` returns at once, so they are delivered after the
current event, never recursively. A listener that raises is logged and skipped. Bounded by what one operation
changes; not thread-safe, like the controller.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from admission.ticket import AdmissionEvent, AdmissionEventKind, TicketView

__all__ = ["AdmissionListener", "EventOutbox"]

logger = logging.getLogger(__name__)

AdmissionListener = Callable[[AdmissionEvent], None]
"""Receives every ticket state change, after the change is complete (see `AdmissionController.subscribe`)."""


class EventOutbox:
    """The listeners and the events waiting for them (see the module docstring)."""

    def __init__(self) -> None:
        self._listeners: list[AdmissionListener] = []
        self._events: deque[AdmissionEvent] = deque()
        self._delivering = False

    def subscribe(self, listener: AdmissionListener) -> Callable[[], None]:
        """Register `listener` for every event from now on; returns a callable that unsubscribes it (idempotent)."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def emit(self, kind: AdmissionEventKind, view: TicketView) -> None:
        self._events.append(AdmissionEvent(kind, view))

    def publish(self) -> None:
        """Deliver queued events in order. Re-entrant calls only append; the outermost delivery drains the outbox."""
        if self._delivering:
            return
        self._delivering = True
        try:
            while self._events:
                event = self._events.popleft()
                for listener in tuple(self._listeners):
                    _deliver(listener, event)
        finally:
            self._delivering = False


def _deliver(listener: AdmissionListener, event: AdmissionEvent) -> None:
    try:
        listener(event)
    except Exception:
        logger.exception("admission listener %r failed on %s", listener, event.kind.value)
