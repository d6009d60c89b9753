"""The recordings catalog, in process and in a real redis-server (one contract): entries by session, an owner's list
by start time in pages, removed entries readable but not listed; and the JSON form the Redis catalog stores."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from service.runtime.recording_catalog import (
    MemoryRecordingCatalog,
    RecordingCatalog,
    RecordingEntry,
    RecordingState,
    cursor_of,
    decode_entry,
    encode_entry,
    parse_cursor,
)
from service.scaleout.recording_catalog import RedisRecordingCatalog
from tests.support.fakes.redis_server import RedisServer


@pytest.fixture(params=["memory", "redis"])
async def catalog(request: pytest.FixtureRequest) -> AsyncIterator[RecordingCatalog]:
    if request.param == "memory":
        yield MemoryRecordingCatalog()
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    shared = RedisRecordingCatalog(server.url, prefix="test:recordings:")
    yield shared
    await shared.aclose()


def _entry(
    session_id: str, owner: str, started_at: float, state: RecordingState = RecordingState.READY
) -> RecordingEntry:
    return RecordingEntry(session_id, owner, state, started_at, started_at, video_key=f"k/{session_id}.mp4")


async def test_an_owners_list_is_paged_oldest_first_without_removed_or_others(catalog: RecordingCatalog) -> None:
    for number, session_id in enumerate(("c", "a", "b", "d")):
        await catalog.put(_entry(session_id, "alice", 100.0 + number % 2))  # c,b at 100; a,d at 101
    await catalog.put(_entry("x", "bob", 100.0))
    await catalog.put(_entry("gone", "alice", 99.0, RecordingState.REMOVED))
    first = await catalog.of_owner("alice", 0.0, None, 2)
    assert [entry.session_id for entry in first] == ["b", "c"]
    second = await catalog.of_owner("alice", 0.0, cursor_of(first[-1]), 2)
    assert [entry.session_id for entry in second] == ["a", "d"]
    assert await catalog.of_owner("alice", 0.0, cursor_of(second[-1]), 2) == []
    assert [entry.session_id for entry in await catalog.of_owner("alice", 100.5, None, 10)] == ["a", "d"]
    removed = await catalog.get("gone")
    assert removed is not None
    assert removed.state is RecordingState.REMOVED
    await catalog.put(removed.moved(RecordingState.REMOVED, 200.0))
    await catalog.put(_entry("c", "alice", 100.0, RecordingState.REMOVED))  # removed by retention: no longer listed
    assert [entry.session_id for entry in await catalog.of_owner("alice", 0.0, None, 10)] == ["b", "a", "d"]
    assert await catalog.get("nobody") is None


async def test_a_bounded_catalog_forgets_its_oldest_entries() -> None:
    catalog = MemoryRecordingCatalog(capacity=2)
    for session_id in ("one", "two", "three"):
        await catalog.put(_entry(session_id, "alice", 1.0))
    assert await catalog.get("one") is None
    assert await catalog.get("three") is not None


def test_an_entry_survives_its_json_form_and_a_cursor_its_text() -> None:
    entry = _entry("s1", "alice", 12.5).moved(RecordingState.FAILED, 13.0, code="recording_failed", reason="refused")
    assert decode_entry(encode_entry(entry)) == entry
    assert parse_cursor(cursor_of(entry)) == (12.5, "s1")
    with pytest.raises(ValueError, match="not a recording entry"):
        decode_entry('{"session_id": "s1"}')
    with pytest.raises(ValueError, match="cursor"):
        parse_cursor("nonsense")
