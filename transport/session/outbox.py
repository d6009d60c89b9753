"""Status messages on their way to the client: encoded, queued (bounded), sent by one task per session.

The session produces status messages (`SessionPort.status()`); the bindings' connections come and go. A
`StatusOutbox` sits between them: a bounded FIFO that drops its oldest message when full, and a sender loop
(`run`) that waits for the link to be up before sending a reliable message and drops a lossy one (a frequent
`chunk` status, stale by the time a link is back) rather than holding it while the link is down.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from transport.base import ChunkStatus, SessionPort, StatusMessage
from transport.errors import LinkLostError
from transport.protocol import MAX_STATUS_BYTES, encode_status

__all__ = [
    "Outbound",
    "OutboxStatistics",
    "StatusLink",
    "StatusOutbox",
    "encode_outbound",
    "flush_status",
    "relay_status",
]

logger = logging.getLogger(__name__)

_SEND_ERROR_LOG_EVERY = 100


@dataclass(frozen=True, slots=True)
class Outbound:
    """One encoded message. `destination` is a participant identity (LiveKit) or None for everyone."""

    payload: bytes
    reliable: bool
    destination: str | None = None


@dataclass(frozen=True, slots=True)
class OutboxStatistics:
    queued: int
    sent: int
    dropped_overflow: int
    dropped_offline: int
    send_failures: int


class StatusLink(Protocol):
    """The binding's current connection, as the sender loop sees it."""

    @property
    def link_ready(self) -> bool: ...

    async def wait_link_ready(self) -> None: ...

    async def send_status(self, message: Outbound) -> None: ...


class StatusOutbox:
    """A bounded FIFO of outbound status messages (overflow drops the oldest, counted) and its sender loop.

    `put` never blocks (it is called from SDK callbacks and the relay task). `run(link)` sends in order, one at a
    time; a failed send is counted and logged (rate-limited), never retried. `wait_idle` lets a closing binding
    flush the last messages (the final `done`). Cancel `run` to stop it.
    """

    def __init__(self, capacity: int = 64) -> None:
        self._queue: deque[Outbound] = deque()
        self._capacity = capacity
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._sent = 0
        self._dropped_overflow = 0
        self._dropped_offline = 0
        self._send_failures = 0

    def put(self, message: Outbound) -> None:
        if len(self._queue) >= self._capacity:
            self._queue.popleft()
            self._dropped_overflow += 1
        self._queue.append(message)
        self._idle.clear()
        self._ready.set()

    def put_first(self, message: Outbound) -> None:
        """Queue `message` ahead of everything waiting (a greeting that must precede older statuses)."""
        if len(self._queue) >= self._capacity:
            self._queue.pop()
            self._dropped_overflow += 1
        self._queue.appendleft(message)
        self._idle.clear()
        self._ready.set()

    async def wait_idle(self) -> None:
        """Wait until every queued message was sent, dropped or failed (for a flush before closing)."""
        await self._idle.wait()

    async def run(self, link: StatusLink) -> None:
        while True:
            while not self._queue:
                self._idle.set()
                self._ready.clear()
                await self._ready.wait()
            message = self._queue.popleft()
            if not link.link_ready:
                if not message.reliable:
                    self._dropped_offline += 1
                    continue
                await link.wait_link_ready()
            try:
                await link.send_status(message)
            except asyncio.CancelledError:
                raise
            except LinkLostError as exc:
                # The connection ended under the message (a deleted room, a closed peer): expected at the end of
                # a session, so counted and said without a stack.
                self._send_failures += 1
                if self._send_failures % _SEND_ERROR_LOG_EVERY == 1:
                    logger.info("a status message was not sent (%d so far): %s", self._send_failures, exc)
            except Exception:
                self._send_failures += 1
                if self._send_failures % _SEND_ERROR_LOG_EVERY == 1:
                    logger.warning("sending a status message failed (%d so far)", self._send_failures, exc_info=True)
            else:
                self._sent += 1

    def statistics(self) -> OutboxStatistics:
        return OutboxStatistics(
            queued=len(self._queue),
            sent=self._sent,
            dropped_overflow=self._dropped_overflow,
            dropped_offline=self._dropped_offline,
            send_failures=self._send_failures,
        )


def encode_outbound(
    message: StatusMessage,
    *,
    max_bytes: int = MAX_STATUS_BYTES,
    lossy_max_bytes: int = 0,
    destination: str | None = None,
) -> Outbound:
    """Encode a status message. A `chunk` status no bigger than `lossy_max_bytes` goes lossy (0: never); discrete
    messages (state, error, done) are always reliable."""
    payload = encode_status(message, max_bytes=max_bytes)
    lossy = isinstance(message, ChunkStatus) and len(payload) <= lossy_max_bytes
    return Outbound(payload=payload, reliable=not lossy, destination=destination)


async def relay_status(
    port: SessionPort, outbox: StatusOutbox, encode: Callable[[StatusMessage], Outbound | None]
) -> None:
    """Forward the session's status messages, encoded by the binding's `encode` (which picks reliability), into
    the outbox until the session's stream ends (after `done`). `encode` returns None for a message it holds back
    to send later itself (a chunk status waiting for its first frame)."""
    async for message in port.status():
        outbound = encode(message)
        if outbound is not None:
            outbox.put(outbound)


_FLUSH_YIELDS = 3


async def flush_status(relay: asyncio.Task[None] | None, outbox: StatusOutbox) -> None:
    """Send what the session has published so far before the binding closes: the service publishes its final
    `done` just before it detaches, and the client should get it. The relay task is given a few turns of the event
    loop to move what the session already queued into the outbox (never a timed wait), then the outbox is waited
    for until it is empty. Callers bound it with `asyncio.timeout` (a link that is down never drains)."""
    for _ in range(_FLUSH_YIELDS):
        if relay is None or relay.done():
            break
        await asyncio.sleep(0)
    await outbox.wait_idle()
