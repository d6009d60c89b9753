"""`Maintenance`: the background loops that keep one replica's `RedisAdmission` in step with Redis.

Three loops, each owned by the admission's `TaskSet`: the maintenance pass (replay deferred calls, heartbeat,
expire, reap dead replicas, re-assert this replica's slots, admit onto free ones, reconnect after an outage with
back-off), the event-stream reader, and the queue-position follower. They talk to Redis only through the
`RedisLink` and change local state only through the `ReplicaMirror`. Each loop ends when its task is cancelled,
even if a Redis client swallowed the cancellation (`stop_if_cancelled`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import Any

from redis.exceptions import ResponseError

from admission import AdmissionConfig
from service.scaleout.link import UNAVAILABLE, RedisLink, stop_if_cancelled
from service.scaleout.redis_side.mirror import ReplicaMirror
from service.scaleout.redis_side.records import decode_fields, decode_text, decode_view

__all__ = ["Maintenance"]

logger = logging.getLogger(__name__)


class Maintenance:
    """The maintenance pass and the two readers of one replica (see the module docstring).

    `once()` is one pass now (what `start` and `tick` call); `forever()`, `read_events_forever()` and
    `follow_positions_forever()` are the loops. `interval_s` paces the pass, `replica_ttl_ms` is the liveness TTL,
    `backoff_s` the reconnect back-off (first, max), `block_ms` how long one stream read waits. `positions_dirty` is
    the event the mirror sets when queue positions need reading. `replica_url` is this replica's address for the
    other replicas (None: none), kept with its liveness key by every pass.
    """

    def __init__(
        self,
        link: RedisLink,
        mirror: ReplicaMirror,
        config: AdmissionConfig,
        positions_dirty: asyncio.Event,
        *,
        replica_ttl_ms: int,
        interval_s: float,
        backoff_s: tuple[float, float],
        block_ms: int,
        replica_url: str | None = None,
    ) -> None:
        self._link = link
        self._url = replica_url or ""
        self._mirror = mirror
        self._config = config
        self._positions_dirty = positions_dirty
        self._ttl_ms = replica_ttl_ms
        self._interval = interval_s
        self._backoff = backoff_s
        self._block_ms = block_ms
        self._stream_key = f"{link.prefix}events"
        self._epoch: str | None = None
        self._audit_at: float | None = None  # on the link's clock: when to look for queued tickets Redis lost
        self._reader_reset = False
        self._stream_from: Any = None

    async def once(self) -> float:
        """Replay deferred calls, then one `maintain` script; returns the seconds until the next pass is due."""
        link = self._link
        recovering = not link.available
        if recovering and self._epoch is not None:
            # Idle pooled connections may predate the outage (a restarted Redis closed them): each would fail its
            # next call once and flap `available`. Drop them; calls reconnect.
            with contextlib.suppress(*UNAVAILABLE):
                await link.timed(link.redis.connection_pool.disconnect(inuse_connections=False))
        if self._stream_from is None:
            # Listeners hear every event from when this replica first reached Redis (those before concern tickets
            # it never saw). That point is read before the first registration, which may admit tickets here whose
            # later events (a close request) must not be skipped, even if its reply is lost and it is retried.
            newest: Any = await link.timed(link.redis.xrevrange(self._stream_key, count=1))
            self._stream_from = newest[0][0] if newest else "0-0"
        await self._replay_deferred()
        args: list[str | int] = [self._ttl_ms, self._epoch or "", secrets.token_hex(8), self._url]
        for view in self._mirror.held_views():  # re-asserted (and re-created if Redis lost its data)
            admitted_ms = round((view.admitted_at if view.admitted_at is not None else view.created_at) * 1000)
            args += [view.ticket_id, view.worker or 0, view.owner, round(view.created_at * 1000), admitted_ms]
            args.append(view.version)
        reply = await link.run("maintain", *args)
        existed, raw_epoch, dead, lost, unknown, next_ms, reaped = reply.result
        epoch = decode_text(raw_epoch)
        if self._epoch is not None and epoch != self._epoch:
            logger.warning(
                "redis admission %s: Redis lost its data; re-asserted %d slot(s)",
                link.replica_id,
                (len(args) - 4) // 6,
            )
            self._reader_reset = True
            self._audit_at = link.clock.now() + self._ttl_ms / 1000  # once every live replica re-asserted
        elif self._epoch is not None and not existed:
            logger.warning("redis admission %s: its liveness key had lapsed; re-registered", link.replica_id)
        self._epoch = epoch
        for replica in dead:
            logger.warning(
                "redis admission: replica %s stopped heartbeating; its slots were reclaimed", decode_text(replica)
            )
            self._mirror.apply_replica_reaped(decode_text(replica))
        for flat in reaped:
            self._mirror.apply_reaped(decode_view(decode_fields(flat)))
        for flat in lost:
            self._mirror.apply_lost(decode_view(decode_fields(flat)))
        for flat in unknown:
            self._mirror.apply_unknown(decode_view(decode_fields(flat)))
        if self._audit_at is not None and link.clock.now() >= self._audit_at:
            self._audit_at = None
            queued = self._mirror.queued_here()
            replies = await link.run_pipelined("get", [(ticket_id,) for ticket_id in queued]) if queued else []
            for ticket_id, answer in zip(queued, replies, strict=True):
                if answer.code == "unknown":
                    self._mirror.apply_vanished(ticket_id, time.time())
        if recovering:
            link.came_back()
            self._mirror.positions_stale()
            logger.info("redis admission %s: registered with Redis", link.replica_id)
        delay = self._interval if self._audit_at is None else min(self._interval, self._ttl_ms / 1000)
        if int(next_ms) >= 0:
            delay = min(delay, int(next_ms) / 1000 + 0.002)
        return delay

    async def _replay_deferred(self) -> None:
        """The releases and aborted creates kept while Redis could not be reached, in the order they were kept."""
        window = self._config.session_length_window
        for ticket_id, action in list(self._mirror.deferred.items()):
            if action == "release":
                await self._link.run("release", ticket_id, window)
            else:  # abort a create whose outcome is unknown: cancel it, or close it wherever it was admitted
                reply = await self._link.run("request_close", ticket_id, "cancel")
                if reply.code == "requested" and decode_view(decode_fields(reply.result)).replica == (
                    self._link.replica_id
                ):
                    await self._link.run("release", ticket_id, window)
            self._mirror.deferred.pop(ticket_id, None)

    async def forever(self) -> None:
        """The maintenance pass every `interval_s` (sooner when kicked), with back-off through outages."""
        link = self._link
        backoff = self._backoff[0]
        while True:
            stop_if_cancelled()
            link.kick.clear()
            try:
                delay = await self.once()
                backoff = self._backoff[0]
            except UNAVAILABLE as exc:
                link.lost_contact(exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._backoff[1])
                continue
            except ResponseError:
                logger.exception("redis admission %s: the maintenance script failed", link.replica_id)
                delay = self._interval
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await link.kick.wait()

    async def read_events_forever(self) -> None:
        """Read the event stream from where it stood when this replica first reached Redis; resume after outages
        (from the start of a new stream when Redis lost its data)."""
        link = self._link
        last: Any = None
        while True:
            stop_if_cancelled()
            await link.up.wait()
            if self._reader_reset:
                last, self._reader_reset = "0-0", False
            elif last is None:
                last = self._stream_from  # read before the registration that set `up`
            try:
                read = link.redis.xread({self._stream_key: last}, count=512, block=self._block_ms)
                reply: Any = await link.timed(read, self._block_ms / 1000)
            except UNAVAILABLE as exc:
                link.lost_contact(exc)
                continue
            except ResponseError:  # e.g. the stream key was overwritten: a bug or an operator; keep trying
                logger.exception("redis admission %s: reading the event stream failed", link.replica_id)
                await asyncio.sleep(self._interval)
                continue
            for _stream, entries in reply or ():
                for entry_id, raw in entries:
                    last = entry_id
                    fields = {decode_text(key): bytes(value) for key, value in raw.items()}
                    try:
                        if fields.get("k") == b"close":
                            self._mirror.apply_close(fields)
                        elif fields.get("k") == b"pause":
                            self._mirror.apply_pause(fields)
                        else:
                            self._mirror.apply(fields)
                    except Exception:
                        logger.exception("redis admission: bad event %r", fields)

    async def follow_positions_forever(self) -> None:
        """Read the positions the mirror asks for (those behind a departure, new ones) in one script call each
        time, coalescing every change that arrives meanwhile."""
        link = self._link
        while True:
            stop_if_cancelled()
            await self._positions_dirty.wait()
            self._positions_dirty.clear()
            if not link.available:
                continue  # the recovery marks every position stale again
            request = self._mirror.positions_request()
            if request is None:
                continue
            whole, ranked = request
            try:
                reply = await link.run("positions", len(whole), *whole, *ranked)
            except UNAVAILABLE as exc:
                link.lost_contact(exc)
                continue
            except ResponseError:
                logger.exception("redis admission %s: reading queue positions failed", link.replica_id)
                continue
            records, flat = reply.result
            views = []
            for record in records:
                fields = decode_fields(record)
                views.append((decode_view(fields), int(fields["seq"]) if fields.get("seq") else None))
            ranks = [(decode_text(flat[i]), int(flat[i + 1])) for i in range(0, len(flat) - 1, 2)]
            self._mirror.apply_positions([*whole, *ranked], views, ranks)
