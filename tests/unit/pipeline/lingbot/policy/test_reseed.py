"""Re-seeding a LingBot session from its checkpoint after its pipeline failed (docs/continuity.md), on threads: a
denoiser that raises in one chunk makes the session rebuild itself and go on with the same frames an uninterrupted
session makes; one that raises every time ends it with its failure after the budget's attempts."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
import torch

from admission import ExecutionLease
from pipeline.bidirectional import (
    ChunkOutput,
    CloseMode,
    ControlState,
    RecoveryNotice,
    Resume,
    SessionSummary,
    Stop,
)
from pipeline.errors import SessionFailedError
from pipeline.lingbot.camera import CameraChunk, CameraPose
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.continuity import ResumePoint, SessionCheckpoint
from pipeline.lingbot.policy.recovery import RecoveryBudget
from pipeline.lingbot.policy.service import LingBotService
from pipeline.lingbot.reference.model import ReferenceDiT, ReferenceWorldModel
from pipeline.lingbot.seam import WorldModelParts

SMALL = {"width": 64, "height": 48, "chunk_size": 1, "hud": False, "seed": 11}
HELD = frozenset({"w", "l"})
CHUNKS = 6


class FailingDiT:
    """The reference DiT, raising in chunk `chunk` (`times` times; -1: always). A `ReseedableDenoiser`."""

    def __init__(self, chunk: int, times: int) -> None:
        self.inner = ReferenceDiT("cpu")
        self.chunk = chunk
        self.times = times
        self.reseeds: list[ResumePoint] = []

    def create_cache(self, session_id: str, config: LingBotSessionConfig, base_latent: torch.Tensor) -> None:
        self.inner.create_cache(session_id, config, base_latent)

    def reseed_cache(
        self, session_id: str, config: LingBotSessionConfig, base_latent: torch.Tensor, resume: ResumePoint
    ) -> None:
        self.reseeds.append(resume)
        self.inner.reseed_cache(session_id, config, base_latent, resume)

    def denoise_chunk(
        self, session_id: str, chunk_index: int, chunk_size: int, control: CameraChunk, *, prompt: str
    ) -> torch.Tensor:
        if chunk_index == self.chunk and self.times != 0:
            self.times -= 1
            raise RuntimeError(f"injected fault in chunk {chunk_index}")
        return self.inner.denoise_chunk(session_id, chunk_index, chunk_size, control, prompt=prompt)

    def release_cache(self, session_id: str) -> None:
        self.inner.release_cache(session_id)


def _service(denoiser: object | None, budget: RecoveryBudget | None) -> LingBotService:
    world = ReferenceWorldModel("cpu")
    model = world if denoiser is None else WorldModelParts(world.encoder, denoiser, world.decoder)  # type: ignore[arg-type]
    return LingBotService(model, lease=ExecutionLease(), realtime=False, recovery=budget)


async def _run(service: LingBotService, notices: list[RecoveryNotice] | None = None) -> list[ChunkOutput]:
    if notices is not None:
        service.add_recovery_listener(notices.append)
    await service.start()
    try:
        await service.create_session("s", service.prepare(SMALL, None))
        service.push_control("s", ControlState(1, HELD))
        chunks: list[ChunkOutput] = []
        async with asyncio.timeout(30):
            async for chunk in service.outputs("s"):
                chunks.append(chunk)
                if len(chunks) == CHUNKS:
                    break
        await service.close_session("s")
        return chunks
    finally:
        await service.aclose()


async def _read_all(service: LingBotService, chunks: list[ChunkOutput]) -> None:
    async with asyncio.timeout(30):
        async for chunk in service.outputs("s"):
            chunks.append(chunk)


async def test_a_session_whose_stage_fails_once_is_rebuilt_and_its_frames_equal_an_uninterrupted_run() -> None:
    clean = await _run(_service(None, None))
    faulty = FailingDiT(chunk=3, times=1)
    notices: list[RecoveryNotice] = []
    rebuilt = await _run(_service(faulty, RecoveryBudget(attempts=2, timeout_s=10)), notices)

    assert [c.index for c in rebuilt] == list(range(CHUNKS))
    for before, after in zip(clean, rebuilt, strict=True):
        assert np.array_equal(before.frames, after.frames), f"chunk {before.index} differs"
        assert after.first_frame_index == before.first_frame_index
        assert after.applied_seq == 1
    assert [r.chunk_index for r in faulty.reseeds] == [3]
    assert faulty.reseeds[0].pose != CameraPose()  # it went on from where the camera was, not from the start
    assert [(n.recovering, n.cause, n.attempt) for n in notices] == [
        (True, "stage_failed", 1),
        (False, "stage_failed", 1),
    ]
    assert notices[1].recovery_s is not None
    assert notices[1].recovery_s >= 0


async def test_a_stage_that_fails_every_time_ends_the_session_after_the_budget() -> None:
    faulty = FailingDiT(chunk=2, times=-1)
    notices: list[RecoveryNotice] = []
    service = _service(faulty, RecoveryBudget(attempts=2, timeout_s=10))
    service.add_recovery_listener(notices.append)
    await service.start()
    try:
        await service.create_session("s", service.prepare(SMALL, None))
        service.push_control("s", ControlState(1, HELD))
        chunks: list[ChunkOutput] = []
        with pytest.raises(SessionFailedError) as failed:
            await _read_all(service, chunks)
        assert [c.index for c in chunks] == [0, 1]
        assert "injected fault in chunk 2" in failed.value.reason
        assert "not rebuilt: 2 re-seed(s) in a row failed" in failed.value.reason
        assert [n.attempt for n in notices if n.recovering] == [1, 2]
        assert not any(not n.recovering for n in notices)
        summary = await service.close_session("s")
        assert summary.failure is not None
        assert summary.slot_leaks == 0
        assert service.recovery_statistics() == ({}, 1)
    finally:
        await service.aclose()


async def test_without_a_budget_a_failing_stage_fails_its_session_as_before() -> None:
    service = _service(FailingDiT(chunk=1, times=1), None)
    await service.start()
    try:
        await service.create_session("s", service.prepare(SMALL, None))
        service.push_control("s", ControlState(1, HELD))
        with pytest.raises(SessionFailedError, match="injected fault in chunk 1"):
            await _read_all(service, [])
    finally:
        await service.aclose()


async def test_every_chunk_leaves_a_checkpoint_that_round_trips_through_bytes() -> None:
    service = _service(None, RecoveryBudget())
    await service.start()
    try:
        await service.create_session("s", service.prepare(SMALL, None))
        session = service._sessions["s"]
        first = session.checkpoint
        assert first is not None
        assert first.next_chunk == 0
        assert first.pose == CameraPose()
        service.push_control("s", ControlState(4, HELD))
        chunks: list[ChunkOutput] = []
        async with asyncio.timeout(30):
            async for chunk in service.outputs("s"):
                chunks.append(chunk)
                if len(chunks) == 3:
                    break
        checkpoint = session.checkpoint
        assert checkpoint is not None
        assert checkpoint.next_chunk >= 3
        assert checkpoint.frames_emitted == sum(len(c.frames) for c in chunks) or checkpoint.next_chunk > 3
        assert checkpoint.applied_seq == 4
        assert checkpoint.latest is not None
        assert checkpoint.latest.keys == HELD
        assert checkpoint.pose != CameraPose()
        again = SessionCheckpoint.from_bytes(checkpoint.to_bytes())
        assert (again.next_chunk, again.pose, again.config, again.latest) == (
            checkpoint.next_chunk,
            checkpoint.pose,
            checkpoint.config,
            checkpoint.latest,
        )
        assert again.image is None
        assert checkpoint.image is None
    finally:
        await service.aclose()


async def test_a_stop_while_recovering_ends_the_session_closed_not_failed() -> None:
    faulty = FailingDiT(chunk=2, times=1)
    service = _service(faulty, RecoveryBudget(attempts=2, timeout_s=10))

    def on_notice(notice: RecoveryNotice) -> None:
        """The stop lands while the session is being rebuilt: told of the recovery, the test asks for a stop."""
        if notice.recovering:
            service.push_control("s", Stop())

    service.add_recovery_listener(on_notice)
    await service.start()
    try:
        await service.create_session("s", service.prepare(SMALL, None))
        service.push_control("s", ControlState(1, HELD))
        chunks: list[ChunkOutput] = []
        await _read_all(service, chunks)  # ends without a failure
        summary = await service.close_session("s")
        assert summary.failure is None
        assert summary.slot_leaks == 0
        assert [c.index for c in chunks] == [0, 1]
        assert faulty.reseeds == []  # never re-seeded: the stop came first
        assert service.recovery_statistics() == ({}, 0)
    finally:
        await service.aclose()


async def test_a_cancel_close_while_recovering_ends_the_session_without_its_failure() -> None:
    faulty = FailingDiT(chunk=2, times=1)
    service = _service(faulty, RecoveryBudget(attempts=2, timeout_s=10))
    closing: list[asyncio.Task[object]] = []

    def on_notice(notice: RecoveryNotice) -> None:
        if notice.recovering:
            closing.append(asyncio.get_running_loop().create_task(service.close_session("s", CloseMode.CANCEL)))

    service.add_recovery_listener(on_notice)
    await service.start()
    try:
        await service.create_session("s", service.prepare(SMALL, None))
        service.push_control("s", ControlState(1, HELD))
        await _read_all(service, [])
        async with asyncio.timeout(30):
            summary = await closing[0]
        assert isinstance(summary, SessionSummary)
        assert summary.failure is None
        assert summary.slot_leaks == 0
        assert service.statistics().sessions == 0
    finally:
        await service.aclose()


async def _chunks(service: LingBotService, until_index: int) -> list[ChunkOutput]:
    chunks: list[ChunkOutput] = []
    async with asyncio.timeout(30):
        async for chunk in service.outputs("s"):
            chunks.append(chunk)
            if chunk.index == until_index:
                break
    return chunks


async def test_a_session_adopted_by_another_worker_from_its_checkpoint_bytes_makes_the_frames_of_an_unbroken_run() -> (
    None
):
    """Adoption at the worker (docs/continuity.md): the checkpoint crosses bytes (as through Redis) to a fresh
    service, which opens the session with it (`PreparedSession.resume`) and goes on from its next chunk, with the
    controls and pose it had: the reference model's frames equal an uninterrupted session's, bit for bit."""
    last = 9
    clean_service = _service(None, None)
    await clean_service.start()
    try:
        await clean_service.create_session("s", clean_service.prepare(SMALL, None))
        clean_service.push_control("s", ControlState(1, HELD))
        clean = await _chunks(clean_service, last)
    finally:
        await clean_service.aclose()

    lost = _service(None, None)
    await lost.start()
    try:
        await lost.create_session("s", lost.prepare(SMALL, None))
        lost.push_control("s", ControlState(1, HELD))
        await _chunks(lost, 2)
        taken = lost.checkpoint("s")
        assert taken is not None
        assert lost.checkpoint("other") is None
    finally:
        await lost.aclose()  # the replica is gone; only the bytes remain
    carried = SessionCheckpoint.from_parts(taken.header_bytes(), taken.image_data())
    start = carried.next_chunk
    assert 3 <= start <= last

    adopter = _service(None, None)
    notices: list[RecoveryNotice] = []
    adopter.add_recovery_listener(notices.append)
    await adopter.start()
    try:
        other = dataclasses.replace(adopter.prepare(SMALL, None), resume=carried)
        with pytest.raises(ValueError, match="checkpoint of session 's'"):
            await adopter.create_session("t", other)
        # Its replica was last heard of 12.5 s before: the recovery counts from there, not from the restore.
        adopted = dataclasses.replace(adopter.prepare(SMALL, None), resume=carried, down_s=12.5)
        await adopter.create_session("s", adopted)
        resumed = await _chunks(adopter, last)  # no control sent again: the held keys came with the checkpoint
        assert [c.index for c in resumed] == list(range(start, last + 1))
        for before, after in zip(clean[start:], resumed, strict=True):
            assert np.array_equal(before.frames, after.frames), f"chunk {before.index} differs"
            assert after.first_frame_index == before.first_frame_index
        assert [(n.session_id, n.recovering, n.cause) for n in notices] == [("s", False, "replica_lost")]
        assert notices[0].recovery_s is not None
        assert 12.5 <= notices[0].recovery_s < 12.5 + 60
        assert adopter.recovery_statistics() == ({"replica_lost": 1}, 0)
        after_all = adopter.checkpoint("s")
        assert after_all is not None
        assert after_all.next_chunk == last + 1
        await adopter.close_session("s", CloseMode.CANCEL)
        # Handed off on drain rather than lost: counted under its own cause, from its hand-off 2 s before.
        handed = dataclasses.replace(
            adopter.prepare(SMALL, None), resume=carried, down_s=2.0, resume_cause="replica_draining"
        )
        await adopter.create_session("s", handed)
        assert [c.index for c in await _chunks(adopter, start)] == [start]
        assert [(n.recovering, n.cause) for n in notices[1:]] == [(False, "replica_draining")]
        assert notices[1].recovery_s is not None
        assert 2.0 <= notices[1].recovery_s < 2.0 + 60
        assert adopter.recovery_statistics() == ({"replica_lost": 1, "replica_draining": 1}, 0)
        await adopter.close_session("s", CloseMode.CANCEL)
        # Handed off paused: restored paused, its recovery complete at once (the resume is its client's, no part
        # of it); no chunk until a Resume, then the chunk an unbroken run made there.
        paused = dataclasses.replace(handed, paused=True)
        chunks_before = adopter.statistics().chunks
        await adopter.create_session("s", paused)
        assert [(n.recovering, n.cause) for n in notices[2:]] == [(False, "replica_draining")]
        first = asyncio.ensure_future(anext(adopter.outputs("s")))
        done, _ = await asyncio.wait({first}, timeout=0.5)
        assert not done  # the held keys came with the checkpoint, yet nothing comes
        assert adopter.statistics().chunks == chunks_before
        adopter.push_control("s", Resume())
        after_resume = await asyncio.wait_for(first, 30)
        assert isinstance(after_resume, ChunkOutput)
        assert after_resume.index == start
        assert np.array_equal(after_resume.frames, clean[start].frames)
        await adopter.close_session("s", CloseMode.CANCEL)
    finally:
        await adopter.aclose()
