"""Timers behind a seam: the grace timers of the bindings run on the event loop in production and on a fake
scheduler in tests, so "the controller left and came back 1 s before the grace expired" is a deterministic test.
`GraceTimer` is the one deadline a binding keeps on that seam (join, reconnect grace), with the reason it ends."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

__all__ = ["GraceTimer", "LoopTimers", "TimerHandle", "Timers"]


class TimerHandle(Protocol):
    def cancel(self) -> None:
        """Stop the timer; a no-op after it fired or was cancelled."""
        ...


class Timers(Protocol):
    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        """Run `callback` (a plain function) once, `delay` seconds from now, on the event loop."""
        ...


class LoopTimers:
    """The real timers: `loop.call_later` on the running loop."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        return asyncio.get_running_loop().call_later(delay, callback)


class GraceTimer:
    """At most one pending deadline, each with the reason the session ends if it expires.

    Example::

        timer = GraceTimer(timers, on_expiry=lambda reason: port.client_gone(reason))
        timer.start(20.0, "the client left")   # the client left: it has 20 s to come back
        timer.cancel()                         # it came back

    `start` replaces the pending deadline (the newest reason wins); `cancel` is a no-op when none is pending. On
    expiry the timer is no longer `pending` when `on_expiry(reason)` runs, so the callback may start a new one.
    """

    def __init__(self, timers: Timers, on_expiry: Callable[[str], None]) -> None:
        self._timers = timers
        self._on_expiry = on_expiry
        self._handle: TimerHandle | None = None

    @property
    def pending(self) -> bool:
        return self._handle is not None

    def start(self, delay: float, reason: str) -> None:
        self.cancel()
        self._handle = self._timers.call_later(delay, lambda: self._expired(reason))

    def cancel(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.cancel()

    def _expired(self, reason: str) -> None:
        self._handle = None
        self._on_expiry(reason)
