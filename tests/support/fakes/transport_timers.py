"""Timers that fire only when the test advances time (the `transport.session.timers.Timers` seam)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable


def _describe(predicate: Callable[[], bool]) -> str:
    """The predicate's source line when it can be read (a lambda at the call site), else its name."""
    try:
        return inspect.getsource(predicate).strip()
    except (OSError, TypeError):
        return getattr(predicate, "__qualname__", repr(predicate))


class FakeTimer:
    def __init__(self, owner: FakeTimers, due: float, callback: Callable[[], None]) -> None:
        self._owner = owner
        self.due = due
        self.callback = callback
        self.cancelled = False
        self.fired = False

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self._owner.notify()


class FakeTimers:
    """`call_later` records; `advance(seconds)` moves time and runs every due, live timer in due order.

    Starting or cancelling a timer is often the only visible effect of an event (a peer connection closing starts
    the grace timer), so `wait_until(predicate)` waits for the timers to reach a state, for at most `within`
    seconds of real time: a regression fails fast with the predicate named instead of hanging until the test
    timeout.
    """

    def __init__(self) -> None:
        self.now = 0.0
        self._timers: list[FakeTimer] = []
        self._changed = asyncio.Event()

    def notify(self) -> None:
        self._changed.set()

    def call_later(self, delay: float, callback: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(self, self.now + delay, callback)
        self._timers.append(timer)
        self.notify()
        return timer

    @property
    def live(self) -> list[FakeTimer]:
        """Timers neither fired nor cancelled, soonest first."""
        return sorted((t for t in self._timers if not t.cancelled and not t.fired), key=lambda t: t.due)

    async def wait_until(self, predicate: Callable[[], bool], *, within: float = 5.0) -> None:
        try:
            async with asyncio.timeout(within):
                while not predicate():
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            live = [round(t.due - self.now, 3) for t in self.live]
            raise AssertionError(
                f"the timers did not reach {_describe(predicate)} within {within} s "
                f"(fake time {self.now}, live timers due in {live})"
            ) from None

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not go back")
        target = self.now + seconds
        while True:
            due = [t for t in self.live if t.due <= target]
            if not due:
                break
            timer = due[0]
            self.now = timer.due
            timer.fired = True
            timer.callback()
        self.now = target
        self.notify()
