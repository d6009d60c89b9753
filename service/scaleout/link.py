"""`RedisLink`: how one replica's `RedisAdmission` talks to Redis — the script plumbing and the contact state.

Every call to Redis goes through here: it is bounded by the call timeout, a script runs with the header every
script takes (prefix, replica, TTLs, this replica's info), and its reply is applied to the `ReplicaMirror` (queue
depth, payloads taken, events) before the caller sees it. The link also holds what the rest reads to know whether
Redis answers: `available`, since when it does not, and the `up` and `kick` events the background loops wait on.
It decides nothing about tickets (`service.scaleout.tickets`) and runs no loop (`service.scaleout.maintenance`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from admission import AdmissionClosedError, AdmissionInvariantError, Clock
from service.errors import AdmissionUnavailableError
from service.scaleout.redis_side import SCRIPTS
from service.scaleout.redis_side.mirror import ReplicaMirror
from service.scaleout.redis_side.records import ScriptReply, decode_reply

__all__ = ["UNAVAILABLE", "UNAVAILABLE_MESSAGE", "RedisLink", "stop_if_cancelled"]

logger = logging.getLogger(__name__)

# What an unreachable, restarting or failed-over Redis raises (BusyLoadingError is a ConnectionError).
UNAVAILABLE: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, OSError)
UNAVAILABLE_MESSAGE = "the shared admission backend is unavailable; retry shortly"

T = TypeVar("T")


class RedisLink:
    """One replica's connection to the shared admission in Redis: its scripts, its call bounds, its contact state.

    `run` and `run_pipelined` let Redis errors propagate (the maintenance loops handle them); `call` is the form for
    the public calls (an outage becomes `AdmissionUnavailableError`, a script error `AdmissionInvariantError`).
    `lost_contact` and `registration_lapsed` mark the replica unavailable and wake the maintenance loop, which
    reconnects and calls `came_back`. Cancelling a call cancels only the wait for Redis.
    """

    def __init__(
        self,
        redis: Redis,
        replica_id: str,
        mirror: ReplicaMirror,
        kick: asyncio.Event,
        *,
        clock: Clock,
        prefix: str,
        finished_ttl_ms: int,
        payload_ttl_ms: int,
        events_maxlen: int,
        call_timeout_s: float,
    ) -> None:
        self.redis = redis
        self.replica_id = replica_id
        self.prefix = prefix
        self.clock = clock
        self.kick = kick  # wakes the maintenance loop
        self.up = asyncio.Event()  # set while available
        self.started = False
        self.closed = False
        self.available = False
        self.unavailable_since: float | None = None
        self.reconnections = 0
        self._registered_once = False
        self._mirror = mirror
        self._finished_ttl_ms = finished_ttl_ms
        self._payload_ttl_ms = payload_ttl_ms
        self._events_maxlen = events_maxlen
        self._call_timeout = call_timeout_s
        self._scripts = {name: redis.register_script(source) for name, source in SCRIPTS.items()}

    def require_started(self) -> None:
        if self.closed or not self.started:
            raise AdmissionClosedError("the redis admission backend is not running (start() it; closed for good)")

    async def timed(self, call: Awaitable[T], extra_s: float = 0.0) -> T:
        """Every Redis call is bounded here; the timeout surfaces as `TimeoutError`, i.e. an outage."""
        async with asyncio.timeout(self._call_timeout + extra_s):
            return await call

    def _header(self) -> list[str | int | bytes]:
        return [
            *(self.prefix, self.replica_id, self._finished_ttl_ms, self._events_maxlen, self._mirror.info()),
            self._payload_ttl_ms,
        ]

    async def run(self, name: str, *args: str | int | bytes) -> ScriptReply:
        """Run one script; deliver the events it reports. Redis errors propagate."""
        return self._take(await self.timed(self._scripts[name](args=[*self._header(), *args])))

    async def run_pipelined(self, name: str, calls: list[tuple[str | int | bytes, ...]]) -> list[ScriptReply]:
        """Run one script once per argument tuple, in one round trip (a pipeline, not a transaction: each call is
        atomic on its own); deliver the events of each in order. Redis errors propagate."""
        pipe = self.redis.pipeline(transaction=False)
        header = self._header()
        for args in calls:
            await self._scripts[name](args=[*header, *args], client=pipe)
        raw: list[Any] = await self.timed(pipe.execute())
        return [self._take(reply) for reply in raw]

    def _take(self, raw: Any) -> ScriptReply:
        """Decode a script's reply and apply it: queue depth, payloads taken, events."""
        reply = decode_reply(raw)
        self._mirror.queue_depth = reply.queue_depth
        for ticket_id, payload in reply.taken:  # before the events: a listener may ask for the payload
            if payload is not None:
                self._mirror.stash_payload(ticket_id, bytes(payload))
        for fields in reply.events:
            self._mirror.apply(fields)
        return reply

    async def call(self, name: str, *args: str | int | bytes) -> ScriptReply:
        """`run` for the public calls: Redis errors become `AdmissionUnavailableError` (or an invariant error)."""
        self.require_started()
        try:
            return await self.run(name, *args)
        except UNAVAILABLE as exc:
            self.lost_contact(exc)
            raise AdmissionUnavailableError(UNAVAILABLE_MESSAGE) from exc
        except ResponseError as exc:
            raise AdmissionInvariantError(f"admission script {name!r} failed: {exc}") from exc

    def lost_contact(self, exc: BaseException) -> None:
        if self.available:
            logger.warning(
                "redis admission %s: lost contact with Redis (%s: %s); creates are refused, running sessions go on",
                self.replica_id,
                type(exc).__name__,
                exc,
            )
            self.unavailable_since = self.clock.now()
        self.available = False
        self.up.clear()
        self.kick.set()

    def registration_lapsed(self) -> None:
        logger.warning("redis admission %s: its liveness key lapsed; re-registering", self.replica_id)
        if self.available:
            self.unavailable_since = self.clock.now()
        self.available = False
        self.up.clear()
        self.kick.set()

    def came_back(self) -> None:
        """The maintenance pass registered this replica after it had been unavailable (or for the first time)."""
        if self._registered_once:
            self.reconnections += 1
        self._registered_once = True
        self.available = True
        self.unavailable_since = None
        self.up.set()


def stop_if_cancelled() -> None:
    """Re-raise a cancellation that a library swallowed (asyncio.wait_for on Python 3.11 can), so that a
    background loop still ends when its owner cancels it."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
