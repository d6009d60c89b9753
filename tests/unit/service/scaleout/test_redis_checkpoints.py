"""Session checkpoints in a real redis-server (docs/continuity.md): what one replica writes at each chunk boundary
another reads back whole (the image written once), both keys expire together after the last write, a delete drops
them, an unreadable checkpoint reads as none, and an outage is a `CheckpointStoreError`; the background writer keeps
the newest per session, paces its rounds, deletes at the end and retries through an outage."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any

import pytest
import torch

from pipeline.lingbot.camera import CameraController, CameraPose
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.continuity import SessionCheckpoint
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.history import ChunkHistory, ChunkRecord, HistorySpec, SessionHistory
from service.scaleout.backend import RedisAdmissionBackend
from service.scaleout.checkpoints import CheckpointStoreError, CheckpointWriter, RedisCheckpointStore
from tests.support.fakes.redis_server import RedisServer
from tests.support.service_harness import running_service
from tests.support.waits import until

CONFIG = LingBotSessionConfig.from_mapping({"width": 64, "height": 48, "seed": 5})


def _checkpoint(chunk: int, image: torch.Tensor | None) -> SessionCheckpoint:
    return SessionCheckpoint(
        session_id="s1",
        config=CONFIG,
        image=image,
        next_chunk=chunk,
        pose=CameraPose(x=0.1 * chunk, z=-0.2, yaw=0.3),
        prompt="a snowy night",
        prompt_seq=2,
        applied_seq=40 + chunk,
        latest=ControlSnapshot.from_keys(41 + chunk, ["w", "l"]),
        frames_emitted=4 * chunk + 1,
        taken_at=12.5,
    )


async def test_another_replica_reads_the_newest_checkpoint_whole(redis_server: RedisServer) -> None:
    image = torch.rand(3, 48, 64)
    writer = RedisCheckpointStore(redis_server.url, ttl_s=30, prefix="test:cp:")
    reader = RedisCheckpointStore(redis_server.url, ttl_s=30, prefix="test:cp:")
    try:
        for chunk in (1, 2, 3):
            await writer.put(_checkpoint(chunk, image))
        got = await reader.get("s1")
        assert got is not None
        assert got.pose == _checkpoint(3, None).pose  # floats through JSON: exactly
        assert (got.next_chunk, got.applied_seq, got.frames_emitted) == (3, 43, 13)
        assert got.latest == ControlSnapshot.from_keys(44, ["w", "l"])
        assert (got.config, got.prompt, got.prompt_seq) == (CONFIG, "a snowy night", 2)
        assert got.image is not None
        assert torch.equal(got.image, image)
        assert await reader.get("other") is None
        await writer.delete("s1")
        assert await reader.get("s1") is None
    finally:
        await writer.aclose()
        await reader.aclose()


async def test_both_keys_expire_together_after_the_last_write(redis_server: RedisServer) -> None:
    store = RedisCheckpointStore(redis_server.url, ttl_s=0.4, prefix="test:ttl:")
    try:
        await store.put(_checkpoint(1, torch.rand(3, 48, 64)))
        await asyncio.sleep(0.25)
        await store.put(_checkpoint(2, torch.rand(3, 48, 64)))  # the image is not written again, but kept alive
        await asyncio.sleep(0.25)
        kept = await store.get("s1")
        assert kept is not None
        assert kept.next_chunk == 2
        assert kept.image is not None
        await asyncio.sleep(0.5)
        assert await store.get("s1") is None
    finally:
        await store.aclose()


async def test_a_touch_keeps_a_checkpoint_alive_without_writing_and_never_brings_one_back(
    redis_server: RedisServer,
) -> None:
    store = RedisCheckpointStore(redis_server.url, ttl_s=0.4, prefix="test:touch:")
    try:
        await store.put(_checkpoint(1, torch.rand(3, 48, 64)))
        for _ in range(5):  # 1 s, two and a half TTLs, with no write: a paused session's
            await asyncio.sleep(0.2)
            await store.touch(["s1", "never-written"])
        kept = await store.get("s1")
        assert kept is not None
        assert kept.next_chunk == 1
        assert await store._redis.exists("test:touch:h:never-written") == 0
        await asyncio.sleep(0.6)  # no touch: it lapses as before
        assert await store.get("s1") is None
        await store.put(_checkpoint(2, torch.rand(3, 48, 64)))
        await store.delete("s1")
        await store.touch(["s1"])  # a touch after the end is nothing: not this store's any more, and keys gone
        assert await store._redis.exists("test:touch:h:s1", "test:touch:i:s1", "test:touch:c:s1") == 0
    finally:
        await store.aclose()


async def test_a_header_without_its_image_reads_as_none(redis_server: RedisServer) -> None:
    store = RedisCheckpointStore(redis_server.url, ttl_s=30, prefix="test:lost:")
    try:
        await store.put(_checkpoint(1, torch.rand(3, 48, 64)))
        await store._redis.delete("test:lost:i:s1")  # lost (e.g. evicted): the header alone cannot rebuild it
        assert await store.get("s1") is None
    finally:
        await store.aclose()


async def test_an_outage_is_a_store_error(redis_server: RedisServer) -> None:
    store = RedisCheckpointStore(redis_server.url, ttl_s=30, prefix="test:down:")
    redis_server.stop()
    try:
        with pytest.raises(CheckpointStoreError, match="not written"):
            await store.put(_checkpoint(1, None))
        with pytest.raises(CheckpointStoreError, match="not read"):
            await store.get("s1")
    finally:
        redis_server.start()
        await store.aclose()


async def _writing(
    store: RedisCheckpointStore, *, min_interval_s: float, retry_s: float = 1.0
) -> tuple[CheckpointWriter, asyncio.Task[None]]:
    writer = CheckpointWriter(store, min_interval_s=min_interval_s, retry_s=retry_s)
    return writer, asyncio.create_task(writer.run())


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_the_writer_keeps_the_newest_checkpoint_and_drops_it_at_the_end(redis_server: RedisServer) -> None:
    image = torch.rand(3, 48, 64)
    store = RedisCheckpointStore(redis_server.url, ttl_s=30, prefix="test:w:")
    writer, task = await _writing(store, min_interval_s=0.05)
    try:
        for chunk in (1, 2, 3):  # offered before the writer runs: one write, the newest
            writer.offer(_checkpoint(chunk, image))
        await asyncio.wait_for(writer.flushed(), 5)
        got = await store.get("s1")
        assert got is not None
        assert got.next_chunk == 3
        stats = writer.statistics()
        assert (stats.writes, stats.coalesced, stats.pending, stats.failures) == (1, 2, 0, 0)
        assert stats.bytes_written == len(_checkpoint(3, image).header_bytes()) + 3 * 48 * 64 * 4
        writer.offer(_checkpoint(4, image))
        await asyncio.wait_for(writer.flushed(), 5)
        assert writer.statistics().bytes_written - stats.bytes_written == len(_checkpoint(4, image).header_bytes())
        writer.offer(_checkpoint(5, image))
        writer.discard("s1")
        writer.offer(_checkpoint(6, image))  # late: the session ended, its keys must not come back
        await asyncio.wait_for(writer.flushed(), 5)
        assert await store.get("s1") is None
        assert await store._redis.keys("test:w:*") == []
        assert writer.statistics().deletes == 1
    finally:
        await _stop(task)
        await store.aclose()


async def test_the_writer_paces_its_rounds(redis_server: RedisServer) -> None:
    """However often a session offers, it is written at most once per `min_interval_s`."""
    store = RedisCheckpointStore(redis_server.url, ttl_s=30, prefix="test:pace:")
    writer, task = await _writing(store, min_interval_s=0.2)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        for chunk in range(1, 41):  # one offer every 20 ms for 0.8 s
            writer.offer(_checkpoint(chunk, None))
            await asyncio.sleep(0.02)
        await asyncio.wait_for(writer.flushed(), 5)
        elapsed = loop.time() - started
        stats = writer.statistics()
        assert 2 <= stats.writes <= elapsed / 0.2 + 1, (stats, elapsed)
        assert stats.writes + stats.coalesced == 40
        got = await store.get("s1")
        assert got is not None
        assert got.next_chunk == 40
    finally:
        await _stop(task)
        await store.aclose()


async def test_a_write_lost_to_an_outage_is_made_once_redis_is_back(redis_server: RedisServer) -> None:
    store = RedisCheckpointStore(redis_server.url, ttl_s=30, prefix="test:out:")
    writer, task = await _writing(store, min_interval_s=0.01, retry_s=0.1)
    try:
        redis_server.stop()
        writer.offer(_checkpoint(1, None))
        await until(lambda: writer.statistics().failures >= 1, "the write failed in the outage")
        writer.offer(_checkpoint(2, None))  # newer than the one kept: it wins
        redis_server.start()
        await asyncio.wait_for(writer.flushed(), 10)
        got = await store.get("s1")
        assert got is not None
        assert got.next_chunk == 2
        assert writer.statistics().pending == 0
    finally:
        await _stop(task)
        await store.aclose()


async def test_a_replica_on_the_redis_backend_writes_its_sessions_checkpoints_and_drops_them_at_the_end(
    redis_server: RedisServer,
) -> None:
    """The wiring: each chunk the runtime takes from a worker that checkpoints is offered to the writer, so Redis holds
    the session at its last chunk boundary under the admission's prefix; the release deletes it."""
    async with running_service(
        admission_backend="redis", redis_url=redis_server.url, queue_heartbeat_timeout=None
    ) as svc:
        backend = svc.runtime.backend
        assert isinstance(backend, RedisAdmissionBackend)
        store = backend.checkpoints
        assert store.prefix == backend.admission.prefix + "ckpt:"
        sid = (await svc.create({"prompt": "a snowy night"})).json()["id"]
        header_key = f"{store.prefix}h:{sid}".encode()

        async def header() -> dict[str, object] | None:
            raw = await store._redis.get(header_key)
            return None if raw is None else json.loads(raw)

        svc.world.emit(sid, 3)
        await until(lambda: _next_chunk(header(), 3), "the checkpoint after chunk 2 in Redis")
        ttl_ms = await store._redis.pttl(header_key)
        assert 0 < ttl_ms <= 3 * 10_000  # three replica TTLs (the default replica TTL is 10 s)
        # The writer counts a write once its MULTI returned, a turn or more after Redis holds it (a full run read the
        # key and then `writes` 0)
        await until(lambda: backend.checkpoint_statistics().writes >= 1, "the writer counted its write")
        assert (await svc.client.delete(f"/v1/sessions/{sid}")).json()["status"] == "closed"
        await until(lambda: _gone(header()), "the checkpoint deleted after the release")


async def test_a_replica_keeps_the_checkpoint_of_a_session_that_makes_no_chunk(redis_server: RedisServer) -> None:
    """A paused session writes no checkpoint; its replica keeps the last one alive while it holds the session, so a
    drain can still hand it off and another replica adopt it (it lapsed after three replica TTLs: a rolling restart's
    paused session could not be handed off)."""
    async with running_service(
        admission_backend="redis", redis_url=redis_server.url, queue_heartbeat_timeout=None, replica_ttl=0.6
    ) as svc:
        backend = svc.runtime.backend
        assert isinstance(backend, RedisAdmissionBackend)
        store = backend.checkpoints
        svc.world.resumable_checkpoints = True  # as a real model's: the service keeps them for an adopter
        sid = (await svc.create({"prompt": "a snowy night"})).json()["id"]
        header_key = f"{store.prefix}h:{sid}"
        svc.world.emit(sid, 2)
        await until(lambda: store._redis.exists(header_key), "the first checkpoint in Redis")
        assert 0 < await store._redis.pttl(header_key) <= 3 * 600  # three replica TTLs
        await asyncio.sleep(4 * 3 * 0.6)  # four checkpoint TTLs without a chunk
        assert await store._redis.exists(header_key) == 1
        assert (await svc.client.delete(f"/v1/sessions/{sid}")).json()["status"] == "closed"


async def _next_chunk(header: Coroutine[Any, Any, dict[str, object] | None], chunk: int) -> bool:
    got = await header
    return got is not None and got["next_chunk"] == chunk


async def _gone(header: Coroutine[Any, Any, dict[str, object] | None]) -> bool:
    return await header is None


async def test_a_models_history_is_written_once_per_chunk_and_read_back_whole(redis_server: RedisServer) -> None:
    """LingBot-World-Fast's history (docs/continuity.md): each write adds the chunk that is new and drops what the
    ring let go, never the whole ring again; another replica reads header, image and history whole."""
    image = torch.rand(3, 48, 64)
    camera = CameraController(CONFIG.pose_steps(), CONFIG.camera_intrinsics())
    spec = HistorySpec(sink_chunks=1, recent_chunks=2)
    writer = RedisCheckpointStore(redis_server.url, ttl_s=30, prefix="test:hist:")
    reader = RedisCheckpointStore(redis_server.url, ttl_s=30, prefix="test:hist:")
    history = SessionHistory()
    written: list[int] = []
    expected: list[int] = []
    try:
        for chunk in range(5):
            control = camera.chunk_control(ControlSnapshot.from_keys(chunk, ["w"]), chunk, 3).camera
            record = ChunkRecord(chunk, control, "a snowy night", bytes(range(16)), spec)
            history = history.append(ChunkHistory(record, torch.randn(16, 3, 6, 8)))
            checkpoint = replace(_checkpoint(chunk + 1, image), history=history)
            expected.append(len(checkpoint.header_bytes()) + len(checkpoint.history_part(chunk)))
            written.append(await writer.put(checkpoint))
        expected[0] += 3 * 48 * 64 * 4  # the image, once
        assert written == expected  # the header and the new chunk of history, never the ring again
        fields = await writer._redis.hkeys("test:hist:c:s1")
        assert sorted(int(field) for field in fields) == [0, 3, 4]  # chunks 1 and 2 dropped as the ring let go
        got = await reader.get("s1")
        assert got is not None
        assert got.history.indices() == (0, 3, 4)
        for mine, theirs in zip(history.chunks, got.history.chunks, strict=True):
            assert torch.equal(mine.latent, theirs.latent)
            assert torch.equal(mine.record.camera.relative, theirs.record.camera.relative)
            assert theirs.record.generator_state == bytes(range(16))
        await writer.delete("s1")
        assert await writer._redis.keys("test:hist:*") == []
    finally:
        await writer.aclose()
        await reader.aclose()
