"""Every service test starts from an environment without LINGSTREAM_* / LIVEKIT_* variables; `redis_server` is a
real redis-server of the test's own (the scale-out tests), skipped where none is installed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.redis_server import REDIS_SERVER, RedisServer


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
