"""The recordings catalog, in process and in a real redis-server (one contract): entries by session, an owner's list
by start time in pages, removed entries readable but not listed; and the JSON form the Redis catalog stores; a lost
replica's unfinished recordings failed once by racing reapers."""

from __future__ import annotations

import asyncio
import dataclasses
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


async def test_racing_reapers_fail_a_lost_replicas_unfinished_recordings_once_and_leave_its_finished_ones(
    redis_server: RedisServer,
) -> None:
    """r1 makes four recordings and dies with three unfinished (one uploading: the case that stayed `uploading`
    for good); three replicas reap it at once."""
    prefix = "test:recordings:"
    r1 = RedisRecordingCatalog(redis_server.url, prefix=prefix, replica_id="r1")
    r2 = RedisRecordingCatalog(redis_server.url, prefix=prefix, replica_id="r2")
    reapers = [RedisRecordingCatalog(redis_server.url, prefix=prefix, replica_id=name) for name in ("a", "b", "c")]
    try:
        await r1.put(_entry("rec", "alice", 1.0, RecordingState.RECORDING))
        await r1.put(_entry("fin", "alice", 2.0, RecordingState.FINISHING))
        uploading = _entry("up", "alice", 3.0, RecordingState.UPLOADING)
        await r1.put(dataclasses.replace(uploading, frames=40, bytes=4096, webhook_url="https://hooks.example/own"))
        await r1.put(_entry("done", "alice", 4.0, RecordingState.RECORDING))
        await r1.put(_entry("done", "alice", 4.0, RecordingState.READY))  # finished before r1 died
        await r2.put(_entry("other", "bob", 5.0, RecordingState.UPLOADING))  # another replica's, alive

        reason = "recording_failed: r1 was lost"
        told = await asyncio.gather(*(c.fail_replica("r1", "recording_failed", reason, 9.5) for c in reapers))
        moved = sorted((entry for batch in told for entry in batch), key=lambda entry: entry.session_id)
        assert [entry.session_id for entry in moved] == ["fin", "rec", "up"]  # each once, whoever got it
        assert all(len(batch) in (0, 3) for batch in told)  # one atomic step: one caller took all three
        for entry in moved:
            assert (entry.state, entry.code, entry.reason, entry.updated_at) == (
                RecordingState.FAILED,
                "recording_failed",
                reason,
                9.5,
            )
            assert await r2.get(entry.session_id) == entry
        assert moved[2].webhook_url == "https://hooks.example/own"
        assert (moved[2].frames, moved[2].bytes) == (40, 4096)
        for ready_or_alive in ("done", "other"):
            kept = await r2.get(ready_or_alive)
            assert kept is not None
            assert kept.state is not RecordingState.FAILED
        listed = {entry.session_id: entry.state for entry in await r2.of_owner("alice", 0.0, None, 10)}
        assert listed["up"] is RecordingState.FAILED
        assert await reapers[0].fail_replica("r1", "recording_failed", reason, 10.0) == []  # nothing left
    finally:
        for catalog in (r1, r2, *reapers):
            await catalog.aclose()
