"""Session checkpoints in a real redis-server (docs/continuity.md): what one replica writes at each chunk boundary
another reads back whole (the image written once), both keys expire together after the last write, a delete drops
them, an unreadable checkpoint reads as none, and an outage is a `CheckpointStoreError`."""

from __future__ import annotations

import asyncio

import pytest
import torch

from pipeline.lingbot.camera import CameraPose
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.continuity import SessionCheckpoint
from pipeline.lingbot.controls import ControlSnapshot
from service.scaleout.checkpoints import CheckpointStoreError, RedisCheckpointStore
from tests.support.fakes.redis_server import RedisServer

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
