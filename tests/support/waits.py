"""The one way a test waits for a state that announces itself with no event it could await: poll a predicate until
it holds, and fail with a sentence that names what was awaited and for how long.

    await until(lambda: runtime.readiness().ready, "the worker to be ready", within=30)
    await until(lambda: lease.holder == "b", "b to hold the lease", yields=1000)
    until_sync(lambda: room not in standin.rooms(), "the room to be deleted", within=20)

Prefer an event or a future when the code under test offers one; poll only state that lives in another thread, another
process, Redis, or an object with no notification. The predicate may be sync or async (an async one is awaited each
time, so it may ask the app over HTTP).

Three clocks, one per kind of state:
- `within` seconds (the default, 5 s), polling every `every` seconds (10 ms): state in threads, processes or Redis.
  `every=0` polls on each turn of the event loop, for state that in-process tasks change (a session's state, a
  scheduler's statistics): a transient state is not skipped over between two polls.
- `yields=N`: at most N turns of the event loop and no wall clock at all, for code driven by a fake clock, where
  nothing but the loop's own tasks can make the predicate true.
- `until_sync`: the same for a test with no event loop (the browser tests), sleeping `every` (100 ms) between polls.

On failure `until` raises AssertionError ("waited 5 s for the worker to be ready"); a predicate that raises fails the
wait at once with its own error, unless the error is one of `ignoring` (a service restarting refuses connections:
`ignoring=(httpx.TransportError,)`). An async predicate still running at the deadline is cancelled.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeAlias

__all__ = ["Predicate", "until", "until_sync"]

Predicate: TypeAlias = Callable[[], object | Awaitable[object]]


async def _holds(predicate: Predicate, ignoring: tuple[type[Exception], ...]) -> bool:
    try:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
    except ignoring:
        return False  # e.g. a process that is restarting refuses the connection: not yet
    return bool(value)


async def until(
    predicate: Predicate,
    what: str,
    *,
    within: float = 5.0,
    every: float = 0.01,
    yields: int | None = None,
    ignoring: tuple[type[Exception], ...] = (),
) -> None:
    """Return once `predicate()` holds; raise AssertionError naming `what` after `within` seconds (or, given
    `yields`, after that many turns of the event loop, whatever the time). A predicate that raises one of `ignoring`
    has not held yet; any other exception ends the wait."""
    if yields is not None:
        for _ in range(yields):
            if await _holds(predicate, ignoring):
                return
            await asyncio.sleep(0)
        raise AssertionError(f"waited {yields} turns of the event loop for {what}")
    deadline = asyncio.timeout(within)
    try:
        async with deadline:
            while not await _holds(predicate, ignoring):  # noqa: ASYNC110 - the state has no event of its own
                await asyncio.sleep(every)  # polling, against the deadline
    except TimeoutError:
        if not deadline.expired():
            raise  # the predicate's own timeout, not ours
        raise AssertionError(f"waited {within:g} s for {what}") from None


def until_sync(predicate: Callable[[], object], what: str, *, within: float = 5.0, every: float = 0.1) -> None:
    """`until` for a test without an event loop: return once `predicate()` holds, raise AssertionError naming `what`
    after `within` seconds."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {within:g} s for {what}")
        time.sleep(every)  # polling other processes against a deadline
