"""Timers behind a seam: the grace timers of the bindings run on the event loop in production and on a fake
scheduler in tests, so "the controller left and came back 1 s before the grace expired" is a deterministic test."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

__all__ = ["LoopTimers", "TimerHandle", "Timers"]


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
