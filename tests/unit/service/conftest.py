"""Every service test starts from an environment without LINGSTREAM_* / LIVEKIT_* variables; `redis_server` is a
real redis-server of the test's own (the scale-out tests), skipped where none is installed, and `cluster` the
replicas harness on it (redis_cluster.py: one worker with one slot, a queue of 8)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from admission import AdmissionConfig
from tests.support.fakes.redis_server import REDIS_SERVER, RedisServer
from tests.support.redis_cluster import Cluster, open_cluster


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith(("LINGSTREAM_", "LIVEKIT_")):
            monkeypatch.delenv(name)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not on PATH")
    with RedisServer(tmp_path) as server:
        yield server


@pytest.fixture
async def cluster(redis_server: RedisServer) -> AsyncIterator[Cluster]:
    config = AdmissionConfig(
        num_workers=1, max_sessions_per_worker=1, queue_size=8, queue_timeout=30.0, queue_heartbeat_timeout=None
    )
    async with open_cluster(redis_server, config) as cluster:
        yield cluster
