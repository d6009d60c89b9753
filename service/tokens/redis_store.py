"""`RedisTokenStore`: the `TokenStore` every replica of a deployment shares (the redis admission backend).

A client token's creates are one counter per token id (`<prefix>uses:<id>`), taken by a Lua script that increments
it and gives the increment back past the limit, in one step, so two replicas racing for a token's last create
cannot both win; it expires with the token (`EXPIREAT`). A revoked share is one key (`<prefix>revoked:<session>:
<share>`) that expires with the share's tokens. Every call is bounded by `call_timeout_s`; Redis unreachable
answers 503 `admission_unavailable` (a create could not be admitted then either), never a token let through.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable
from typing import Any

from redis.asyncio import Redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from service.errors import AdmissionUnavailableError

__all__ = ["DEFAULT_TOKEN_PREFIX", "RedisTokenStore"]

DEFAULT_TOKEN_PREFIX = "lingstream:tokens:"

# KEYS[1] the counter; ARGV[1] the limit, ARGV[2] the expiry (Unix seconds). 1: taken, 0: none left.
_CLAIM = """
local used = redis.call('INCR', KEYS[1])
if used == 1 then redis.call('EXPIREAT', KEYS[1], ARGV[2]) end
if used > tonumber(ARGV[1]) then
  redis.call('DECR', KEYS[1])
  return 0
end
return 1
"""
# KEYS[1] the counter: one create given back, never below zero.
_REFUND = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
if used > 0 then redis.call('DECR', KEYS[1]) end
return 1
"""


class RedisTokenStore:
    """`TokenStore` in Redis; see the module docstring. `redis`: a URL (the store makes and owns its client) or a
    client (the caller owns it)."""

    def __init__(self, redis: Redis | str, *, prefix: str = DEFAULT_TOKEN_PREFIX, call_timeout_s: float = 2.0) -> None:
        self._owns = isinstance(redis, str)
        if isinstance(redis, str):
            redis = Redis.from_url(redis, socket_timeout=None, socket_connect_timeout=2.0, retry=Retry(NoBackoff(), 0))
        self._redis = redis
        self._prefix = prefix
        self._timeout = call_timeout_s
        self._claim = redis.register_script(_CLAIM)
        self._refund = redis.register_script(_REFUND)

    async def _call(self, what: str, awaitable: Awaitable[Any]) -> Any:
        try:
            async with asyncio.timeout(self._timeout):
                return await awaitable
        except (RedisError, OSError, TimeoutError) as exc:
            raise AdmissionUnavailableError(
                f"the shared token registry cannot be reached ({what}); retry shortly"
            ) from exc

    async def claim(self, token_id: str, limit: int, expires_at: float) -> bool:
        key = f"{self._prefix}uses:{token_id}"
        taken = await self._call("claim", self._claim(keys=[key], args=[limit, math.ceil(expires_at)]))
        return bool(int(taken))

    async def refund(self, token_id: str) -> None:
        await self._call("refund", self._refund(keys=[f"{self._prefix}uses:{token_id}"]))

    async def revoke(self, share_key: str, expires_at: float) -> None:
        key = f"{self._prefix}revoked:{share_key}"
        await self._call("revoke", self._redis.set(key, b"1", exat=math.ceil(expires_at) + 1))

    async def revoked(self, share_key: str) -> bool:
        found = await self._call("revoked", self._redis.exists(f"{self._prefix}revoked:{share_key}"))
        return bool(found)

    async def aclose(self) -> None:
        if self._owns:
            await self._redis.aclose()
