"""A bounded one-to-many fan-out: every subscriber gets its own small buffer, and a slow one loses old items.

A session publishes three streams: its state snapshots (for the SSE event streams), its status messages and its
generated chunks (for the transport). A producer must never wait for a consumer, and no consumer may make memory
grow, so each `Broadcast` gives every subscriber a buffer of `capacity` items with the overflow policy
*drop oldest*: the subscriber reads the newest `capacity` items, and its `dropped` counter says how many it missed.
For full snapshots (session state) and video chunks, newest-wins is exactly right; nothing older is worth waiting for.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Generic, Self, TypeVar

__all__ = ["Broadcast", "BroadcastStatistics", "Flag", "Subscription"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BroadcastStatistics:
    """`subscribers` now; `published` items since creation; `dropped` items lost by overflow (all subscribers)."""

    subscribers: int
    published: int
    dropped: int
    closed: bool


class Subscription(Generic[T]):
    """One subscriber's view of a `Broadcast`: an async iterator over the items published after it subscribed.

    Iteration ends once the broadcast is closed and the buffer is empty. `close()` (or leaving `with`) unsubscribes;
    it is idempotent. Cancelling a pending `__anext__` loses nothing.
    """

    def __init__(self, owner: Broadcast[T], capacity: int) -> None:
        self._owner = owner
        self._items: deque[T] = deque()
        self._capacity = capacity
        self._wakeup = asyncio.Event()
        self._ended = False
        self.dropped = 0

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T:
        while not self._items:
            if self._ended:
                raise StopAsyncIteration
            self._wakeup.clear()
            await self._wakeup.wait()
        return self._items.popleft()

    def close(self) -> None:
        self._ended = True
        self._items.clear()
        self._wakeup.set()
        self._owner._forget(self)

    def _offer(self, item: T) -> int:
        dropped = 0
        if len(self._items) >= self._capacity:
            self._items.popleft()
            self.dropped += 1
            dropped = 1
        self._items.append(item)
        self._wakeup.set()
        return dropped

    def _end(self) -> None:
        self._ended = True
        self._wakeup.set()


class Flag:
    """A one-way `asyncio.Event` (set, never cleared) that costs almost nothing until someone waits.

    Problem: a finished session stays readable for a while (`LINGSTREAM_SESSION_HISTORY` of them), and an
    `asyncio.Event` allocates its waiter deque (about 760 bytes) up front; four per session were most of a
    finished session's memory. A `Flag` creates its waiter list only while a coroutine waits. Example::

        ended = Flag()
        await ended.wait()     # in one task
        ended.set()            # in another: every waiter wakes; later waits return at once

    Not thread-safe: use it on its event loop, like `asyncio.Event`.
    """

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self) -> bool:
        if self._set:
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)  # cancelled: no reference stays behind
                if not self._waiters:
                    self._waiters = None
        return True


class Broadcast(Generic[T]):
    """Publishes items to every current subscriber without ever blocking the publisher.

    Example::

        states: Broadcast[Snapshot] = Broadcast(capacity=16)
        with states.subscribe() as updates:    # only items published from now on
            async for snapshot in updates:     # ends after states.close()
                ...
        states.publish(snapshot)               # never waits; a full subscriber drops its oldest item

    Ordering: each subscriber sees items in publish order (minus the ones it dropped). Backpressure: none by
    design; overflow policy drop-oldest per subscriber, bounded by `capacity`. Cancellation: a subscriber that stops
    reading only fills its own buffer. Not thread-safe: publish and subscribe on the event loop.
    """

    __slots__ = ("_capacity", "_closed", "_dropped", "_published", "_subscribers")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a broadcast needs capacity >= 1, got {capacity}")
        self._capacity = capacity
        self._subscribers: list[Subscription[T]] = []
        self._closed = False
        self._published = 0
        self._dropped = 0

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def has_subscribers(self) -> bool:
        """Whether anyone listens (a publisher may skip building an item nobody would read)."""
        return bool(self._subscribers)

    def subscribe(self) -> Subscription[T]:
        """A new subscription; on a closed broadcast it is already at its end."""
        subscription = Subscription(self, self._capacity)
        if self._closed:
            subscription._end()
        else:
            self._subscribers.append(subscription)
        return subscription

    def publish(self, item: T) -> None:
        """Offer `item` to every subscriber (ignored once closed)."""
        if self._closed:
            return
        self._published += 1
        for subscription in self._subscribers:
            self._dropped += subscription._offer(item)

    def close(self) -> None:
        """No more items: subscribers read what they hold, then their iteration ends. Idempotent."""
        if self._closed:
            return
        self._closed = True
        subscribers, self._subscribers = self._subscribers, []
        for subscription in subscribers:
            subscription._end()

    def statistics(self) -> BroadcastStatistics:
        return BroadcastStatistics(
            subscribers=len(self._subscribers), published=self._published, dropped=self._dropped, closed=self._closed
        )

    def _forget(self, subscription: Subscription[T]) -> None:
        if subscription in self._subscribers:
            self._subscribers.remove(subscription)
