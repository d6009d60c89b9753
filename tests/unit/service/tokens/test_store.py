"""The token stores: creates counted to their limit and refunded, revocations, entries dropped once their token
lapsed; the Redis store on a real redis-server, with replicas racing for a token's last create."""

from __future__ import annotations

import asyncio

from service.tokens import MemoryTokenStore
from service.tokens.redis_store import RedisTokenStore
from tests.support.fakes.redis_server import RedisServer


class Clock:
    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_memory_counts_creates_refunds_and_forgets_lapsed_tokens() -> None:
    clock = Clock()
    store = MemoryTokenStore(clock=clock)
    until = clock.now + 60
    assert [await store.claim("t", 2, until) for _ in range(3)] == [True, True, False]
    await store.refund("t")
    assert await store.claim("t", 2, until)
    assert not await store.claim("t", 2, until)
    await store.revoke("s:1", until)
    assert await store.revoked("s:1")
    assert not await store.revoked("s:2")
    clock.now = until + 31
    assert not await store.revoked("s:1")
    assert await store.claim("u", 1, clock.now + 60)  # a claim prunes what lapsed
    assert store.entries() == 1


async def test_redis_gives_a_tokens_last_create_to_one_replica(redis_server: RedisServer) -> None:
    replicas = [RedisTokenStore(redis_server.url, prefix="test:tokens:") for _ in range(4)]
    try:
        until = 4_000_000_000.0
        claims = await asyncio.gather(*(replica.claim("t", 3, until) for replica in replicas for _ in range(5)))
        assert claims.count(True) == 3
        await replicas[0].refund("t")
        assert await replicas[1].claim("t", 3, until)
        assert not await replicas[2].claim("t", 3, until)
        await replicas[3].refund("never-claimed")
        assert not await replicas[3].claim("never-claimed", 0, until)
        await replicas[0].revoke("sess:share", until)
        assert await replicas[3].revoked("sess:share")
        assert not await replicas[3].revoked("sess:other")
    finally:
        for replica in replicas:
            await replica.aclose()
