"""`RedisRecordingCatalog`: the recordings catalog (`service.runtime.recording_catalog`) shared by every replica.

Keys (`P` is the prefix, default `lingstream:recordings:`):

    P e:<session id>   string  the entry, JSON (`encode_entry`); a removed entry expires after a day
    P o:<owner>        zset    the owner's listed session ids, score = when recording started (Unix seconds)
    P w:<replica>      set     the session ids whose recording that replica is making (recording, finishing or
                               uploading), written by a catalog that knows its `replica_id`

An entry and its indexes change together in one MULTI. When a replica is lost (the admission's reaper),
`fail_replica` moves each recording of its `w:` set that is still unfinished to FAILED in one script, so of several
racing callers one moves each, and an entry the replica finished in the meantime stays as it is. Listing reads ids
from the owner's zset by score (ties in id order, as Redis orders equal scores), then their entries. Errors reach
the caller as `RecordingCatalogError` (the recording store logs them: a recording never fails because the catalog
cannot be written).
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

_UNFINISHED = frozenset({RecordingState.RECORDING, RecordingState.FINISHING, RecordingState.UPLOADING})

# KEYS: the replica's set. ARGV: entry key prefix, code, reason, now. Returns the moved entries (JSON).
_FAIL_REPLICA = """
local moved = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local key = ARGV[1] .. id
  local raw = redis.call('GET', key)
  if raw then
    local entry = cjson.decode(raw)
    if entry.state == 'recording' or entry.state == 'finishing' or entry.state == 'uploading' then
      entry.state, entry.code, entry.reason, entry.updated_at = 'failed', ARGV[2], ARGV[3], tonumber(ARGV[4])
      local encoded = cjson.encode(entry)
      redis.call('SET', key, encoded, 'KEEPTTL')
      moved[#moved + 1] = encoded
    end
  end
end
redis.call('DEL', KEYS[1])
return moved
"""

__all__ = ["DEFAULT_RECORDINGS_PREFIX", "RecordingCatalogError", "RedisRecordingCatalog"]

DEFAULT_RECORDINGS_PREFIX = "lingstream:recordings:"
_REMOVED_TTL_S = 24 * 3600
_PAGE_SCAN = 4  # ids read per wanted entry at most, when some listed ids lost their entry


class RecordingCatalogError(Exception):
    """The shared catalog could not be read or written (Redis unreachable)."""


class RedisRecordingCatalog:
    """`RecordingCatalog` in Redis: `redis` is a URL (the catalog owns its client) or a client (the caller owns it);
    `replica_id`: the replica whose recordings it writes (so that they can be failed if it is lost)."""

    def __init__(
        self, redis: Redis | str, *, prefix: str = DEFAULT_RECORDINGS_PREFIX, replica_id: str | None = None
    ) -> None:
        self._owns = isinstance(redis, str)
        self._redis: Redis = (
            Redis.from_url(redis, socket_connect_timeout=2.0, retry=Retry(NoBackoff(), 0))
            if isinstance(redis, str)
            else redis
        )
        self._prefix = prefix
        self._replica = replica_id
        self._fail_replica = self._redis.register_script(_FAIL_REPLICA)

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
                if self._replica is not None:
                    making = f"{self._prefix}w:{self._replica}"
                    if entry.state in _UNFINISHED:
                        pipe.sadd(making, entry.session_id)
                    else:
                        pipe.srem(making, entry.session_id)
                await pipe.execute()
        except RedisError as exc:
            raise RecordingCatalogError(f"the recordings catalog could not be written: {exc}") from exc

    async def get(self, session_id: str) -> RecordingEntry | None:
        try:
            raw = await self._redis.get(f"{self._prefix}e:{session_id}")
        except RedisError as exc:
            raise RecordingCatalogError(f"the recordings catalog could not be read: {exc}") from exc
        return None if raw is None else decode_entry(raw)

    async def fail_replica(self, replica_id: str, code: str, reason: str, now: float) -> list[RecordingEntry]:
        try:
            moved = await self._fail_replica(
                keys=[f"{self._prefix}w:{replica_id}"], args=[f"{self._prefix}e:", code, reason, repr(now)]
            )
        except RedisError as exc:
            raise RecordingCatalogError(f"the recordings catalog could not be written: {exc}") from exc
        return [decode_entry(raw) for raw in moved]

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
