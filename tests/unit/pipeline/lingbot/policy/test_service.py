"""The LingBot session policy and service over the real orchestrator and the reference world model."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import torch

from admission import ExecutionLease
from pipeline.bidirectional import CloseMode, ControlState, ResetPose, Stop
from pipeline.core import OutputItem
from pipeline.errors import SessionFailedError, UnknownSessionError
from pipeline.lingbot.camera import CameraChunk
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.graph.stages import CONDITION_REQUEST, CONTROL, FramesArtifact
from pipeline.lingbot.policy.service import LingBotService
from pipeline.lingbot.policy.session import LOOKAHEAD, LingBotSession
from pipeline.lingbot.reference.model import ReferenceDiT, ReferenceWorldModel
from tests.support.fakes.clock import FakeClock

SMALL = {"width": 64, "height": 48, "chunk_size": 2, "hud": False}


async def start(model: Any = None, **kwargs: Any) -> LingBotService:
    service = LingBotService(model or ReferenceWorldModel("cpu"), realtime=False, **kwargs)
    await service.start()
    return service


async def take(stream: AsyncIterator[Any], n: int) -> list[Any]:
    return [await anext(stream) for _ in range(n)]


async def test_an_empty_config_just_works_on_the_default_scene() -> None:
    service = await start()
    try:
        prepared = service.prepare({}, None)
        assert (prepared.width, prepared.height, prepared.fps) == (416, 240, 16.0)
        await service.create_session("s", prepared)
        outputs = service.outputs("s")
        first = await anext(outputs)  # chunk 0 comes without any control: the viewer sees the world at once
        assert first.applied_seq == -1
        assert not service._sessions["s"].wants_chunk()  # no keys held: nothing more to generate
        service.push_control("s", ControlState(0, frozenset({"l"})))
        second = await anext(outputs)
        assert [c.frames.shape for c in (first, second)] == [(9, 240, 416, 3), (12, 240, 416, 3)]
        assert [c.first_frame_index for c in (first, second)] == [0, 9]
        assert second.applied_seq == 0
        summary = await service.close_session("s")
        assert summary.failure is None
        assert summary.slot_leaks == 0
    finally:
        await service.aclose()


async def test_each_chunk_reports_the_exact_snapshot_it_was_generated_from() -> None:
    service = await start()
    try:
        await service.create_session("s", service.prepare(SMALL, None))
        outputs = service.outputs("s")
        first = await anext(outputs)
        assert first.index == 0
        service.push_control("s", ControlState(5, frozenset({"l", "ArrowUp"})))
        chunk = await anext(outputs)
        while chunk.applied_seq != 5:
            chunk = await anext(outputs)
        assert chunk.keys == frozenset({"l", "w"})
        service.push_control("s", ControlState(3, frozenset({"a"})))  # stale: dropped and counted
        service.push_control("s", ControlState(5, frozenset({"a"})))  # duplicate seq: dropped
        service.push_control("s", ControlState(6, frozenset()))
        chunk = await anext(outputs)
        while chunk.applied_seq != 6:
            assert chunk.applied_seq == 5
            assert chunk.keys == frozenset({"l", "w"})
            chunk = await anext(outputs)
        assert chunk.keys == frozenset()
        assert service.statistics().stale_controls == 2
        # idle and applied: the session does not ask for more chunks
        produced = service._sessions["s"].chunks_emitted
        await asyncio.sleep(0.05)
        assert service._sessions["s"].chunks_emitted == produced
        assert not service._sessions["s"].wants_chunk()
        assert not chunk.reset_pose
        service.push_control("s", ResetPose())
        reset = await anext(outputs)
        assert reset.index == chunk.index + 1
        assert reset.reset_pose  # the chunk says it started from the start pose (a recording replays it)
    finally:
        await service.aclose()


async def test_the_session_ends_after_its_frame_limit_with_the_chunk_contract() -> None:
    service = await start()
    try:
        config = dict(SMALL, frame_num=4 * 6 + 1)  # 7 latent frames ... not a multiple of 2
        with pytest.raises(ValueError, match="frame_num"):
            service.prepare(config, None)
        config = dict(SMALL, frame_num=4 * 5 + 1)  # 6 latent frames = 3 chunks of 2
        await service.create_session("s", service.prepare(config, None))
        service.push_control("s", ControlState(1, frozenset({"w"})))
        chunks = [c async for c in service.outputs("s")]
        assert [c.frames.shape[0] for c in chunks] == [5, 8, 8]
        assert sum(c.frames.shape[0] for c in chunks) == 21
        summary = await service.close_session("s")
        assert summary.chunks == 3
        assert summary.failure is None
    finally:
        await service.aclose()


async def test_closing_releases_every_stage_cache() -> None:
    model = ReferenceWorldModel("cpu")
    service = await start(model)
    try:
        await service.create_session("s", service.prepare(SMALL, None))
        await anext(service.outputs("s"))
        assert model.denoiser.statistics().open_sessions == 1
        await service.close_session("s", CloseMode.CANCEL)
        for part in (model.encoder, model.denoiser, model.decoder):
            assert part.statistics().open_sessions == 0
        assert (await service.close_session("s", CloseMode.CANCEL)).chunks >= 1  # idempotent
    finally:
        await service.aclose()


async def test_history_bounds_the_summaries_and_close_reports_of_finished_sessions() -> None:
    service = await start(history=2)
    try:
        summaries = {}
        for sid in ("a", "b", "c"):
            await service.create_session(sid, service.prepare(SMALL, None))
            await anext(service.outputs(sid))
            summaries[sid] = await service.close_session(sid, CloseMode.CANCEL)
        for sid in ("b", "c"):  # the newest two still answer a repeated close with the same summary
            assert await service.close_session(sid, CloseMode.CANCEL) is summaries[sid]
        with pytest.raises(UnknownSessionError):  # the oldest is forgotten, worker and orchestrator alike
            await service.close_session("a", CloseMode.CANCEL)
    finally:
        await service.aclose()
    with pytest.raises(ValueError, match="history"):
        LingBotService(ReferenceWorldModel("cpu"), history=0)


class FailingDenoiser:
    def __init__(self, inner: ReferenceDiT, fail_at: int) -> None:
        self._inner = inner
        self._fail_at = fail_at

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def denoise_chunk(
        self, session_id: str, chunk_index: int, chunk_size: int, control: CameraChunk, *, prompt: str
    ) -> torch.Tensor:
        if chunk_index == self._fail_at:
            raise RuntimeError("cuda error: illegal memory access")
        return self._inner.denoise_chunk(session_id, chunk_index, chunk_size, control, prompt=prompt)


class PartsModel:
    def __init__(self, fail_at: int) -> None:
        base = ReferenceWorldModel("cpu")
        self.encoder = base.encoder
        self.denoiser = FailingDenoiser(base.denoiser, fail_at)
        self.decoder = base.decoder


async def test_a_stage_failure_fails_the_session_after_its_chunks_and_releases_the_caches() -> None:
    model = PartsModel(fail_at=2)
    service = await start(model)
    try:
        await service.create_session("s", service.prepare(SMALL, None))
        service.push_control("s", ControlState(1, frozenset({"d"})))
        outputs = service.outputs("s")
        assert [c.index for c in await take(outputs, 2)] == [0, 1]
        with pytest.raises(SessionFailedError, match="illegal memory access"):
            await anext(outputs)
        summary = await service.close_session("s")
        assert summary.failure is not None
        assert model.encoder.statistics().open_sessions == 0
        assert model.decoder.statistics().open_sessions == 0
        assert model.denoiser._inner.statistics().open_sessions == 0
    finally:
        await service.aclose()


async def test_two_busy_sessions_share_one_lease_round_robin() -> None:
    lease = ExecutionLease()
    service = await start(lease=lease)
    try:
        for sid in ("a", "b"):
            await service.create_session(sid, service.prepare(SMALL, None))
            service.push_control(sid, ControlState(1, frozenset({"w"})))
        await asyncio.gather(take(service.outputs("a"), 8), take(service.outputs("b"), 8))
        grants = lease.statistics().grants_per_session
        assert abs(grants["a"] - grants["b"]) <= 2
        for sid in ("a", "b"):
            await service.close_session(sid, CloseMode.CANCEL)
    finally:
        await service.aclose()


async def test_stop_control_drains_the_chunk_in_progress_and_ends_the_stream() -> None:
    service = await start()
    try:
        await service.create_session("s", service.prepare(SMALL, None))
        service.push_control("s", ControlState(1, frozenset({"w"})))
        outputs = service.outputs("s")
        await anext(outputs)
        service.push_control("s", Stop())
        rest = [c async for c in outputs]
        assert len(rest) <= 2
        assert (await service.close_session("s")).failure is None
    finally:
        await service.aclose()


# -- the prefetch window, against a scripted orchestrator ------------------------------------------------------


class ScriptedOrchestrator:
    """Accepts what `room` allows and produces the frames of every submitted control at once."""

    def __init__(self) -> None:
        self.condition_room = True
        self.submissions: list[dict[str, int]] = []
        self._frames: list[OutputItem] = []
        self.denoised: Callable[[int], None] | None = None  # the service's stage listener: a control's DiT is done

    def open_session(self, session_id: str) -> AsyncIterator[OutputItem]:
        async def stream() -> AsyncIterator[OutputItem]:
            while True:
                yield self._frames.pop(0)

        return stream()

    def try_submit(self, session_id: str, items: dict[str, tuple[int, object]]) -> bool:
        if CONDITION_REQUEST in items and not self.condition_room:
            return False
        self.submissions.append({k: v[0] for k, v in items.items()})
        if CONTROL in items:
            index = items[CONTROL][0]
            snapshot = items[CONTROL][1].snapshot  # type: ignore[attr-defined]
            frames = FramesArtifact(index, torch.zeros(1, 2, 2, 3, dtype=torch.uint8).numpy(), snapshot)
            self._frames.append(OutputItem(session_id, index, "frames", frames))
            if self.denoised is not None:
                self.denoised(index)
        return True

    async def submit(self, session_id: str, items: dict[str, tuple[int, object]]) -> None:
        assert self.try_submit(session_id, items)


async def test_prefetch_submits_two_conditions_at_start_and_refills_to_the_window() -> None:
    orch = ScriptedOrchestrator()
    config = LingBotSessionConfig.from_mapping(SMALL)
    session = LingBotSession("s", config, None, orch, FakeClock())  # type: ignore[arg-type]
    orch.denoised = session.denoised
    session.open()
    assert orch.submissions == [{CONDITION_REQUEST: 0}, {CONDITION_REQUEST: 1}]
    assert (session.next_condition_index, session.next_control_index) == (LOOKAHEAD, 0)
    assert await session._start_chunk()  # control 0 alone: its condition was prefetched; then refill condition 2
    assert orch.submissions[2:] == [{CONTROL: 0}, {CONDITION_REQUEST: 2}]
    assert session.next_condition_index - session.next_control_index == LOOKAHEAD


async def test_a_starved_prefetch_is_admitted_atomically_with_its_control() -> None:
    orch = ScriptedOrchestrator()
    orch.condition_room = False
    config = LingBotSessionConfig.from_mapping(SMALL)
    session = LingBotSession("s", config, None, orch, FakeClock())  # type: ignore[arg-type]
    orch.denoised = session.denoised
    session.open()
    assert orch.submissions == []  # backpressure refused both prefetches
    orch.condition_room = True
    assert await session._start_chunk()
    chunk = await session._next_chunk()
    assert orch.submissions[0] == {CONTROL: 0, CONDITION_REQUEST: 0}  # one all-or-nothing submission
    assert chunk is not None
    assert chunk.index == 0
    assert 0 <= session.next_condition_index - session.next_control_index <= LOOKAHEAD
