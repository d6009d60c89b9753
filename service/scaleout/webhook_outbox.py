"""`RedisOutbox`: the webhook outbox every replica shares, so that deliveries survive the replica that queued them.

Keys (under the deployment's prefix, `lingstream:webhooks:` by default):

- `due`, a sorted set: delivery id -> the millisecond it is due (or, while claimed, its lease's end);
- `items`, a hash: delivery id -> the delivery (JSON: body, endpoint, attempts, event time);
- `holder`, a hash: delivery id -> the replica that queued or last claimed it.

A replica claims (one script, atomic) the due deliveries it holds, and those of any replica once they are
`handover_ms` overdue: a delivery's holder sends it as soon as it is due, and a delivery whose holder died
(its lease ran out without a `done` or a `retry`, or it was never claimed) is taken by another replica
`handover_ms` later (the replica TTL: by then the holder is known lost). Claiming moves the delivery's score to the
lease's end (`lease_ms`, longer than a send's timeout), so nobody else takes it while it is being sent;
`done` removes it, `retry` sets its new due time and attempts. At-least-once: a replica lost between a
receiver's 2xx and its `done` leaves the delivery to be sent again by another (same event id). Bounded: `put`
refuses deliveries past `capacity` (counted as dropped). Times are Redis server time (`TIME`), so replicas agree.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from redis.asyncio import Redis

from service.webhooks.outbox import Delivery, OutboxStatistics

__all__ = ["DEFAULT_WEBHOOK_PREFIX", "RedisOutbox"]

DEFAULT_WEBHOOK_PREFIX = "lingstream:webhooks:"

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: due, items, holder. ARGV: replica, capacity, then (id, json) pairs. Returns how many were dropped.
_PUT = (
    _NOW
    + """
local dropped = 0
local count = redis.call('ZCARD', KEYS[1])
for i = 3, #ARGV, 2 do
  if count >= tonumber(ARGV[2]) then
    dropped = dropped + 1
  else
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
    redis.call('HSET', KEYS[3], ARGV[i], ARGV[1])
    redis.call('ZADD', KEYS[1], now, ARGV[i])
    count = count + 1
  end
end
return dropped
"""
)

# KEYS: due, items, holder. ARGV: replica, limit, lease_ms, handover_ms.
# Returns {pending, item json...}: the claimed deliveries, now leased to this replica.
_CLAIM = (
    _NOW
    + """
local limit = tonumber(ARGV[2])
local taken = {}
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit * 8)
for _, id in ipairs(ids) do
  if #taken >= limit then break end
  local holder = redis.call('HGET', KEYS[3], id)
  local due = tonumber(redis.call('ZSCORE', KEYS[1], id))
  if holder == ARGV[1] or not holder or due + tonumber(ARGV[4]) <= now then
    local item = redis.call('HGET', KEYS[2], id)
    if item then
      redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), id)
      redis.call('HSET', KEYS[3], id, ARGV[1])
      taken[#taken + 1] = item
    else
      redis.call('ZREM', KEYS[1], id)
      redis.call('HDEL', KEYS[3], id)
    end
  end
end
local result = {redis.call('ZCARD', KEYS[1])}
for _, item in ipairs(taken) do result[#result + 1] = item end
return result
"""
)

# KEYS: due, items, holder. ARGV: id, replica, json, delay_ms (json empty: done).
_SETTLE = (
    _NOW
    + """
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then
  return 0
end
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
else
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), ARGV[1])
end
return 1
"""
)


class RedisOutbox:
    """An `service.webhooks.outbox.Outbox` in Redis (see the module docstring). `redis` is a client
    (`decode_responses=False`) or a URL (the outbox then makes and owns its client). A `done` or `retry` for a
    delivery another replica claimed since (this one's lease ran out) changes nothing: the claimant decides.
    """

    def __init__(
        self,
        redis: Redis | str,
        replica_id: str,
        *,
        capacity: int,
        lease_s: float,
        handover_s: float,
        prefix: str = DEFAULT_WEBHOOK_PREFIX,
    ) -> None:
        self._own = isinstance(redis, str)
        self._redis: Redis = Redis.from_url(redis) if isinstance(redis, str) else redis
        self._replica = replica_id
        self._capacity = capacity
        self._lease_ms = int(lease_s * 1000)
        self._handover_ms = int(handover_s * 1000)
        self._keys = [f"{prefix}due", f"{prefix}items", f"{prefix}holder"]
        self._put = self._redis.register_script(_PUT)
        self._claim = self._redis.register_script(_CLAIM)
        self._settle = self._redis.register_script(_SETTLE)
        self._pending = 0
        self._dropped = 0

    async def put(self, deliveries: Sequence[Delivery]) -> int:
        args: list[str | int] = [self._replica, self._capacity]
        for delivery in deliveries:
            args += [delivery.id, delivery.encode()]
        dropped = int(await self._put(keys=self._keys, args=args))
        self._dropped += dropped
        return dropped

    async def claim(self, limit: int) -> list[Delivery]:
        reply = await self._claim(keys=self._keys, args=[self._replica, limit, self._lease_ms, self._handover_ms])
        self._pending = int(reply[0])
        return [Delivery.decode(raw) for raw in reply[1:]]

    async def done(self, delivery: Delivery) -> None:
        await self._settle(keys=self._keys, args=[delivery.id, self._replica, "", 0])

    async def retry(self, delivery: Delivery, due_at: float) -> None:
        delay_ms = max(0, int((due_at - time.time()) * 1000))  # the wait, added to Redis time (replicas agree)
        await self._settle(keys=self._keys, args=[delivery.id, self._replica, delivery.encode(), delay_ms])

    def next_due(self) -> float | None:
        return None  # other replicas' deliveries come due unseen: the dispatcher polls

    def statistics(self) -> OutboxStatistics:
        return OutboxStatistics(pending=self._pending, dropped=self._dropped)

    async def aclose(self) -> None:
        if self._own:
            await self._redis.aclose()
