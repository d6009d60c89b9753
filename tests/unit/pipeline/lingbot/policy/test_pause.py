"""Pause and resume in the LingBot session policy: a paused session takes no lease turn, keeps its state, and
applies what arrived meanwhile from its first chunk after the resume."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from admission import ExecutionLease
from pipeline.bidirectional import ChunkOutput, CloseMode, ControlState, Pause, Resume, SetPrompt
from pipeline.lingbot.policy.service import LingBotService
from pipeline.lingbot.reference.model import ReferenceWorldModel

SMALL = {"width": 64, "height": 48, "chunk_size": 2, "hud": False}


class Reader:
    """Reads one session's chunks in the background, so its generation never waits for the test."""

    def __init__(self, outputs: AsyncIterator[ChunkOutput]) -> None:
        self.chunks: list[ChunkOutput] = []
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._read(outputs))

    async def _read(self, outputs: AsyncIterator[ChunkOutput]) -> None:
        async for chunk in outputs:
            self.chunks.append(chunk)
            self._changed.set()

    async def wait_for(self, count: int) -> None:
        async with asyncio.timeout(30):
            while len(self.chunks) < count:
                self._changed.clear()
                await self._changed.wait()

    async def finished(self) -> None:
        """Wait until the session's outputs ended (it closed) and every chunk was read."""
        async with asyncio.timeout(30):
            await self._task

    async def aclose(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def test_a_paused_session_takes_no_lease_turn_and_the_other_session_gets_its_share() -> None:
    lease = ExecutionLease()
    service = LingBotService(ReferenceWorldModel("cpu"), lease=lease, realtime=False)
    await service.start()
    readers: list[Reader] = []
    try:
        for sid in ("a", "b"):
            await service.create_session(sid, service.prepare(SMALL, None))
            service.push_control(sid, ControlState(0, frozenset({"w"})))
        a, b = Reader(service.outputs("a")), Reader(service.outputs("b"))
        readers = [a, b]
        await a.wait_for(2)
        await b.wait_for(2)

        service.push_control("a", Pause())
        service.push_control("a", SetPrompt(0, "night"))  # kept for after the resume
        service.push_control("a", ControlState(1, frozenset({"l"})))
        # At most the chunks it had in flight (two: one decoding, one denoising) or was waiting for still come; then a
        # has no place in the lease. b's chunks are the clock: each one is a lease turn, and b keeps two chunks in
        # flight too, so four of them mean a's turn (if it had one) and a's decodes are over.
        await b.wait_for(len(b.chunks) + 4)
        assert "a" not in lease.statistics().waiters
        assert lease.statistics().holder != "a"
        a_grants = lease.statistics().grants_per_session["a"]
        a_chunks = len(a.chunks)
        b_grants = lease.statistics().grants_per_session["b"]
        await b.wait_for(len(b.chunks) + 4)  # b goes on, alone
        stats = lease.statistics()
        assert stats.grants_per_session["a"] == a_grants
        # four more chunks of b: at least two more grants (two of them may have been granted before: in flight)
        assert stats.grants_per_session["b"] >= b_grants + 2
        assert len(a.chunks) == a_chunks
        assert not service._sessions["a"].wants_chunk()

        service.push_control("a", Resume())
        await a.wait_for(a_chunks + 1)
        resumed = a.chunks[a_chunks]
        assert resumed.index == a.chunks[a_chunks - 1].index + 1  # the same session carries on
        assert (resumed.applied_seq, resumed.keys, resumed.prompt) == (1, frozenset({"l"}), "night")
    finally:
        for reader in readers:
            await reader.aclose()
        await service.aclose()


async def test_resume_without_pause_and_a_second_pause_change_nothing() -> None:
    service = LingBotService(ReferenceWorldModel("cpu"), realtime=False)
    await service.start()
    try:
        await service.create_session("s", service.prepare(SMALL, None))
        outputs = service.outputs("s")
        await anext(outputs)
        session = service._sessions["s"]
        service.push_control("s", Resume())
        assert not session.paused
        service.push_control("s", Pause())
        service.push_control("s", Pause())
        assert session.paused
        service.push_control("s", SetPrompt(0, "fog"))  # a new prompt wakes an idle session, not a paused one
        assert not session.wants_chunk()
        service.push_control("s", Resume())
        assert session.wants_chunk()
        assert (await anext(outputs)).prompt == "fog"
    finally:
        await service.aclose()


async def test_a_paused_session_closes_with_drain_at_once() -> None:
    service = LingBotService(ReferenceWorldModel("cpu"), lease=ExecutionLease(), realtime=False)
    await service.start()
    try:
        await service.create_session("s", service.prepare(SMALL, None))
        service.push_control("s", ControlState(0, frozenset({"w"})))
        reader = Reader(service.outputs("s"))
        await reader.wait_for(2)
        service.push_control("s", Pause())
        async with asyncio.timeout(30):  # nothing to deliver but the chunk in flight: the drain does not wait on
            summary = await service.close_session("s", CloseMode.DRAIN)  # a pause that nobody lifts
        assert summary.failure is None
        assert summary.slot_leaks == 0
        await reader.finished()
        assert summary.chunks == len(reader.chunks)
    finally:
        await service.aclose()
