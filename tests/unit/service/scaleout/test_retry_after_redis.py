"""Retry-After through the Redis Lua path is capped by its configured maximum: in the shared admission's answer,
and in the 429's `Retry-After` header and error body of a service on the redis backend (a real redis-server)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from admission import AdmissionConfig, TicketReason, TicketState
from service.scaleout.admission import RedisAdmission
from tests.support.fakes.redis_server import RedisServer
from tests.support.service_harness import running_service

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def raw(redis_server: RedisServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.url)
    try:
        yield client
    finally:
        await client.aclose()


async def _seed_lengths(raw: Redis, prefix: bytes, seconds: float, count: int = 4) -> None:
    """Recent session lengths as the release script records them (ms, newest first)."""
    await raw.delete(prefix + b"lengths")
    await raw.lpush(prefix + b"lengths", *[str(round(seconds * 1000))] * count)


async def test_the_lua_estimate_is_capped_by_the_configured_maximum(redis_server: RedisServer, raw: Redis) -> None:
    config = AdmissionConfig(
        num_workers=1, queue_size=0, default_session_seconds=600.0, max_retry_after_s=7, queue_heartbeat_timeout=None
    )
    replica = RedisAdmission(redis_server.url, "a", config, prefix="cap:", replica_ttl_s=5.0)
    await replica.start()
    try:
        await replica.create("k", ticket_id="busy")
        rejected = await replica.create("k", ticket_id="late")
        assert (rejected.state, rejected.reason) == (TicketState.REJECTED, TicketReason.QUEUE_FULL)
        assert rejected.retry_after_s == 7  # the default 600 s over one slot, capped
        await _seed_lengths(raw, b"cap:", 3.0)
        assert (await replica.create("k", ticket_id="later")).retry_after_s == 3  # under the cap: the estimate
        await _seed_lengths(raw, b"cap:", 90.0)
        assert (await replica.create("k", ticket_id="latest")).retry_after_s == 7  # from history, capped
    finally:
        await replica.aclose()


async def test_a_429_from_the_redis_backend_caps_retry_after_in_the_header_and_the_body(
    redis_server: RedisServer, raw: Redis
) -> None:
    maximum = AdmissionConfig().max_retry_after_s  # the service runs with the default maximum
    async with running_service(
        admission_backend="redis", redis_url=redis_server.url, queue_size=0, queue_heartbeat_timeout=None
    ) as svc:
        assert (await svc.create()).status_code == 201
        (replicas_key,) = await raw.keys("*replicas")
        assert isinstance(replicas_key, bytes)
        prefix = replicas_key[: -len(b"replicas")]
        await _seed_lengths(raw, prefix, maximum * 10.0)  # sessions ten times longer than the cap
        rejected = await svc.create()
        assert rejected.status_code == 429
        assert rejected.headers["retry-after"] == str(maximum)
        error = rejected.json()["error"]
        assert error["code"] == "queue_full"
        assert error["message"] == f"the admission queue is full; retry in about {maximum} s"
