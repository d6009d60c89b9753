"""The outbox: deliveries not yet made, each due at a wall-clock second. `MemoryOutbox` keeps them in this process;
`service.webhooks.redis_outbox.RedisOutbox` keeps them in the Redis every replica shares, so that another replica
delivers what a lost one left pending.

A `Delivery` is one event for one endpoint: its id (the event id and the endpoint's index), the exact body, how many
attempts were made, and whether the endpoint is a caller's (its address is checked again before each attempt).

The contract (`Outbox`): `put` adds deliveries, due now; `claim` takes up to `limit` deliveries that are due, and
they are this claimant's until it calls `done` (delivered, or given up) or `retry` (due again later) — in Redis until
its lease runs out; `statistics` says how many are pending. Bounded: `capacity` deliveries at most; overflow policy
*refuse the newest* — a `put` past it drops the deliveries that do not fit (counted as dropped, result `dropped`),
so deliveries already promised keep their place.
"""

from __future__ import annotations

import heapq
import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

__all__ = ["Delivery", "MemoryOutbox", "Outbox", "OutboxStatistics"]


@dataclass(frozen=True, slots=True)
class Delivery:
    """One event for one endpoint. `created_at`: when the event happened (wall seconds; the delivery latency is
    measured from it); `attempts`: made so far; `guarded`: a caller's URL (its address is checked before each try)."""

    id: str
    event_id: str
    url: str
    body: bytes
    created_at: float
    attempts: int = 0
    guarded: bool = False

    def tried(self) -> Delivery:
        return replace(self, attempts=self.attempts + 1)

    def encode(self) -> str:
        return json.dumps(
            {
                "id": self.id,
                "event_id": self.event_id,
                "url": self.url,
                "body": self.body.decode(),
                "created_at": self.created_at,
                "attempts": self.attempts,
                "guarded": self.guarded,
            },
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, raw: str | bytes) -> Delivery:
        data = json.loads(raw)
        return cls(
            id=str(data["id"]),
            event_id=str(data["event_id"]),
            url=str(data["url"]),
            body=str(data["body"]).encode(),
            created_at=float(data["created_at"]),
            attempts=int(data["attempts"]),
            guarded=bool(data["guarded"]),
        )


@dataclass(frozen=True, slots=True)
class OutboxStatistics:
    """`pending`: deliveries waiting or being tried (in Redis: the whole deployment's, as of the last claim);
    `dropped`: deliveries this process refused because the outbox was full."""

    pending: int
    dropped: int


class Outbox(Protocol):
    async def put(self, deliveries: Sequence[Delivery]) -> int:
        """Add deliveries, due now; returns how many were dropped (outbox full)."""
        ...

    async def claim(self, limit: int) -> list[Delivery]:
        """Up to `limit` due deliveries, now this claimant's."""
        ...

    async def done(self, delivery: Delivery) -> None:
        """Delivered or given up: it leaves the outbox."""
        ...

    async def retry(self, delivery: Delivery, due_at: float) -> None:
        """Try it again at `due_at` (its `attempts` updated)."""
        ...

    def next_due(self) -> float | None:
        """When the earliest waiting delivery is due, when this outbox knows (None: none, or unknown: poll)."""
        ...

    def statistics(self) -> OutboxStatistics: ...

    async def aclose(self) -> None: ...


class MemoryOutbox:
    """An `Outbox` in this process (one replica): a heap by due time; claimed deliveries leave the heap until they
    come back with `retry`. Lost with the process (the Redis outbox is the one that survives a replica)."""

    def __init__(self, capacity: int, clock: Callable[[], float]) -> None:
        if capacity < 1:
            raise ValueError(f"an outbox needs capacity >= 1, got {capacity}")
        self._capacity = capacity
        self._clock = clock
        self._heap: list[tuple[float, int, Delivery]] = []
        self._order = itertools.count()
        self._in_flight = 0
        self._dropped = 0

    async def put(self, deliveries: Sequence[Delivery]) -> int:
        now = self._clock()
        dropped = 0
        for delivery in deliveries:
            if len(self._heap) + self._in_flight >= self._capacity:
                dropped += 1
                continue
            heapq.heappush(self._heap, (now, next(self._order), delivery))
        self._dropped += dropped
        return dropped

    async def claim(self, limit: int) -> list[Delivery]:
        now = self._clock()
        taken: list[Delivery] = []
        while self._heap and len(taken) < limit and self._heap[0][0] <= now:
            taken.append(heapq.heappop(self._heap)[2])
        self._in_flight += len(taken)
        return taken

    async def done(self, delivery: Delivery) -> None:
        self._in_flight -= 1

    async def retry(self, delivery: Delivery, due_at: float) -> None:
        self._in_flight -= 1
        heapq.heappush(self._heap, (due_at, next(self._order), delivery))

    def next_due(self) -> float | None:
        """When the earliest waiting delivery is due (None: none waits)."""
        return self._heap[0][0] if self._heap else None

    def statistics(self) -> OutboxStatistics:
        return OutboxStatistics(pending=len(self._heap) + self._in_flight, dropped=self._dropped)

    async def aclose(self) -> None:
        pass
