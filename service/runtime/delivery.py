"""Which checkpoint a session's successor goes on from: the last chunk the client was sent (issue #33).

A checkpoint (docs/continuity.md) is taken when the model worker hands a chunk to the runtime, but the transport sends
that chunk's frames later, paced in real time, and holds a chunk or two generated ahead. A successor that went on
from the newest checkpoint (an adopter after this replica's death, the replica a drain hands the session to) would
skip the chunks generated and never sent: the player's picture would jump by them. So the checkpoint a successor
reads is the one of the last chunk whose frames left the transport's pacer (sent, or dropped late: the client's clock
moved on), and the ones of the chunks still in flight are held here until then.

`DeliveryLedger` is the pure core (no awaits, no clock): `read` notes a chunk handed to the transport, `generated`
holds a checkpoint, `delivered` says how far the pacer got and returns the checkpoint to publish, `close` ends it
(nothing is published after). A transport that does not pace (none, or a test's) reports no delivery: the ledger is
told so and publishes each checkpoint at once, as before. `SessionDelivery` is the thin shell a runner holds for one
session: it publishes what the ledger says, and lets a hand-off wait until every chunk read has been delivered.

Bounded: at most `HELD_CHECKPOINTS` checkpoints are held per session (the pipeline's look-ahead is one or two chunks:
the session's chunk broadcast holds two, the pacer's ring 32 frames); past that the oldest is dropped (counted as
`overflowed`), and a delivery that reaches it publishes the next newer one instead.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.bidirectional import PortableCheckpoint

__all__ = ["HELD_CHECKPOINTS", "DeliveryLedger", "DeliveryStatistics", "SessionDelivery"]

HELD_CHECKPOINTS = 8
"""The most checkpoints of chunks in flight held for one session (the oldest is dropped beyond it)."""


@dataclass(frozen=True, slots=True)
class DeliveryStatistics:
    """`delivered_through`: the newest chunk whose frames all left the pacer (-1: none yet). `held`: checkpoints
    waiting for their chunk's delivery. `published`: checkpoints handed on for a successor. `superseded`: held ones
    passed over because a newer one was delivered at the same time (a report covers several chunks). `overflowed`:
    held ones dropped for the bound. `closed`: nothing is published any more."""

    delivered_through: int
    held: int
    published: int
    superseded: int
    overflowed: int
    closed: bool


class DeliveryLedger:
    """Holds the checkpoints of a session's chunks in flight and says which to publish when (see the module).

    A checkpoint describes the session after chunk `next_chunk - 1`: it is published once that chunk is delivered.
    `tracks_delivery=False`: nobody will report deliveries, every checkpoint is published as it comes.

    Example::

        ledger = DeliveryLedger(tracks_delivery=True)
        ledger.generated(after_chunk_4)   # None: held, chunk 4 is still in the pacer
        ledger.generated(after_chunk_5)   # None
        ledger.delivered(4)               # after_chunk_4: publish it
        ledger.delivered(5)               # after_chunk_5
    """

    def __init__(self, *, tracks_delivery: bool, bound: int = HELD_CHECKPOINTS) -> None:
        if bound < 1:
            raise ValueError(f"a delivery ledger holds at least one checkpoint, got {bound}")
        self._tracks = tracks_delivery
        self._bound = bound
        self._held: deque[PortableCheckpoint] = deque()
        self._through = -1
        self._read = -1  # the newest chunk the reader took (its frames went to the transport)
        self._published = 0
        self._superseded = 0
        self._overflowed = 0
        self._closed = False

    @property
    def settled(self) -> bool:
        """Every chunk read so far was delivered (a worker's checkpoints may run ahead of what its reader took: the
        ones of chunks never read, dropped by a cancel, are not waited for), or the ledger is closed."""
        return self._closed or not self._tracks or self._through >= self._read

    @property
    def delivered_through(self) -> int:
        return self._through

    def read(self, chunk_index: int) -> None:
        """The reader took chunk `chunk_index` and handed it to the transport: `settled` waits for its delivery."""
        self._read = max(self._read, chunk_index)

    def generated(self, checkpoint: PortableCheckpoint) -> PortableCheckpoint | None:
        """A chunk was generated and `checkpoint` describes the session after it: the checkpoint to publish now (its
        chunk was delivered already, or deliveries are not tracked), or None (held until `delivered` reaches it)."""
        if self._closed:
            return None
        if not self._tracks or checkpoint.next_chunk - 1 <= self._through:
            self._published += 1
            return checkpoint
        if len(self._held) >= self._bound:
            self._held.popleft()
            self._overflowed += 1
        self._held.append(checkpoint)
        return None

    def delivered(self, chunk_index: int) -> PortableCheckpoint | None:
        """Every frame of chunks up to `chunk_index` left the pacer: the newest held checkpoint that describes the
        session after one of them, to publish (older ones are passed over), or None (nothing new)."""
        if self._closed or chunk_index <= self._through:
            return None
        self._through = chunk_index
        newest: PortableCheckpoint | None = None
        while self._held and self._held[0].next_chunk - 1 <= chunk_index:
            if newest is not None:
                self._superseded += 1
            newest = self._held.popleft()
        if newest is not None:
            self._published += 1
        return newest

    def close(self) -> None:
        """The session ended here (or was handed on): nothing is published from now on; held checkpoints go."""
        self._closed = True
        self._held.clear()

    def statistics(self) -> DeliveryStatistics:
        return DeliveryStatistics(
            delivered_through=self._through,
            held=len(self._held),
            published=self._published,
            superseded=self._superseded,
            overflowed=self._overflowed,
            closed=self._closed,
        )


class SessionDelivery:
    """One session's `DeliveryLedger` on the event loop: `publish` gets each checkpoint to hand on (the runtime's
    `save_checkpoint`), `wait_settled` lets a hand-off wait until the chunks generated were delivered.

    Ordering: checkpoints are published in chunk order, each at most once, never after `close`. Cancellation:
    cancelling `wait_settled` changes nothing.
    """

    def __init__(self, publish: Callable[[PortableCheckpoint], None], *, tracks_delivery: bool) -> None:
        self._ledger = DeliveryLedger(tracks_delivery=tracks_delivery)
        self._publish = publish
        self._settled = asyncio.Event()
        self._settled.set()

    @property
    def ledger(self) -> DeliveryLedger:
        return self._ledger

    def read(self, chunk_index: int) -> None:
        self._ledger.read(chunk_index)
        self._note()

    def generated(self, checkpoint: PortableCheckpoint) -> None:
        ready = self._ledger.generated(checkpoint)
        if ready is not None:
            self._publish(ready)
        self._note()

    def delivered(self, chunk_index: int) -> None:
        ready = self._ledger.delivered(chunk_index)
        if ready is not None:
            self._publish(ready)
        self._note()

    async def wait_settled(self, timeout_s: float) -> bool:
        """Wait until nothing generated waits for its delivery, at most `timeout_s`; whether it settled."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._settled.wait()
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self._ledger.close()
        self._note()

    def _note(self) -> None:
        if self._ledger.settled:
            self._settled.set()
        else:
            self._settled.clear()
