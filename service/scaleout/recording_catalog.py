"""`RedisRecordingCatalog`: the recordings catalog (`service.runtime.recording_catalog`) shared by every replica.

Keys (`P` is the prefix, default `lingstream:recordings:`):

    P e:<session id>   string  the entry, JSON (`encode_entry`); a removed entry expires after a day
    P o:<owner>        zset    the owner's listed session ids, score = when recording started (Unix seconds)

An entry and its index change together in one MULTI. Listing reads ids from the owner's zset by score (ties in id
order, as Redis orders equal scores), then their entries. Errors reach the caller as `RecordingCatalogError` (the
recording store logs them: a recording never fails because the catalog cannot be written).
"""

from __future__ import annotations

import math
from typing import cast

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from service.runtime.recording_catalog import RecordingEntry, decode_entry, encode_entry, parse_cursor
from service.runtime.recordings import RecordingState

__all__ = ["DEFAULT_RECORDINGS_PREFIX", "RecordingCatalogError", "RedisRecordingCatalog"]

DEFAULT_RECORDINGS_PREFIX = "lingstream:recordings:"
_REMOVED_TTL_S = 24 * 3600
_PAGE_SCAN = 4  # ids read per wanted entry at most, when some listed ids lost their entry


class RecordingCatalogError(Exception):
    """The shared catalog could not be read or written (Redis unreachable)."""


class RedisRecordingCatalog:
    """`RecordingCatalog` in Redis: `redis` is a URL (the catalog owns its client) or a client (the caller owns it)."""

    def __init__(self, redis: Redis | str, *, prefix: str = DEFAULT_RECORDINGS_PREFIX) -> None:
        self._owns = isinstance(redis, str)
        self._redis: Redis = (
            Redis.from_url(redis, socket_connect_timeout=2.0, retry=Retry(NoBackoff(), 0))
            if isinstance(redis, str)
            else redis
        )
        self._prefix = prefix

    async def put(self, entry: RecordingEntry) -> None:
        key = f"{self._prefix}e:{entry.session_id}"
        index = f"{self._prefix}o:{entry.owner}"
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                if entry.state is RecordingState.REMOVED:
                    pipe.set(key, encode_entry(entry), ex=_REMOVED_TTL_S)
                    pipe.zrem(index, entry.session_id)
                else:
                    pipe.set(key, encode_entry(entry))
                    pipe.zadd(index, {entry.session_id: entry.started_at})
                await pipe.execute()
        except RedisError as exc:
            raise RecordingCatalogError(f"the recordings catalog could not be written: {exc}") from exc

    async def get(self, session_id: str) -> RecordingEntry | None:
        try:
            raw = await self._redis.get(f"{self._prefix}e:{session_id}")
        except RedisError as exc:
            raise RecordingCatalogError(f"the recordings catalog could not be read: {exc}") from exc
        return None if raw is None else decode_entry(raw)

    async def of_owner(self, owner: str, since: float, after: str | None, limit: int) -> list[RecordingEntry]:
        start = parse_cursor(after) if after is not None else (since, "")
        low = max(since, start[0])
        found: list[RecordingEntry] = []
        offset = 0
        try:
            while len(found) < limit:
                batch = limit * _PAGE_SCAN
                rows = cast(
                    "list[tuple[bytes, float]]",
                    await self._redis.zrangebyscore(
                        f"{self._prefix}o:{owner}", low, math.inf, start=offset, num=batch, withscores=True
                    ),
                )
                if not rows:
                    return found
                offset += len(rows)
                wanted = [
                    f"{self._prefix}e:{member.decode()}"
                    for member, score in rows
                    if (float(score), member.decode()) > start and float(score) >= since
                ]
                raws = await self._redis.mget(wanted) if wanted else []
                for raw in raws:
                    if raw is not None:
                        entry = decode_entry(raw)
                        if entry.state is not RecordingState.REMOVED:
                            found.append(entry)
                if len(rows) < batch:
                    break
        except RedisError as exc:
            raise RecordingCatalogError(f"the recordings catalog could not be read: {exc}") from exc
        return found[:limit]

    async def aclose(self) -> None:
        if self._owns:
            await self._redis.aclose()
