"""LingBot-World-Fast re-seeded after a failed chunk (docs/continuity.md), through the service on threads: without
history (a denoiser that keeps none) the tiny real model goes on from its re-seeded cache with finite latents and the
chunk contract kept (12 frames a chunk after the first 9), with the positions of its KV cache continuing the
session's; with history (the chunks' latents carried back to the session's checkpoint and replayed into the cache)
its frames after the re-seed are the uninterrupted run's, to the bit. The prefill's own cases (the ring turned, a
history that lacks chunks) are `test_reseed_history_fast.py`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from admission import ExecutionLease
from pipeline.bidirectional import ChunkOutput, ControlState, RecoveryNotice
from pipeline.lingbot.camera import CameraChunk
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.continuity import ResumePoint
from pipeline.lingbot.errors import ModelSessionError
from pipeline.lingbot.history import ChunkRecord, HistorySpec
from pipeline.lingbot.models import TINY_DIT, CacheConfig, KVCache
from pipeline.lingbot.models.bundle import LingBotFastOptions, write_tiny_model
from pipeline.lingbot.models.errors import ModelContextExhaustedError
from pipeline.lingbot.models.world import LingBotFastDenoiser, LingBotFastWorldModel
from pipeline.lingbot.policy.recovery import RecoveryBudget
from pipeline.lingbot.policy.service import LingBotService
from pipeline.lingbot.seam import WorldModelParts

pytest.importorskip("diffusers", reason="the lingbot extra (diffusers) is not installed")
pytest.importorskip("transformers", reason="the lingbot extra (transformers) is not installed")
pytest.importorskip("safetensors.torch", reason="the lingbot extra (safetensors) is not installed")

CONFIG = {"width": 64, "height": 32, "frame_num": 4 * 15 - 3, "seed": 7, "hud": False}
"""15 latent frames: 5 chunks of 3."""


class FailingOnce:
    """The tiny model's denoiser, raising once in chunk `fail_at` (a `ReseedableDenoiser`, without history)."""

    stored_after_reseed = 3  # the re-seeded cache holds its first chunk only

    def __init__(self, inner: LingBotFastDenoiser, fail_at: int = 2) -> None:
        self.inner = inner
        self.fail_at = fail_at
        self.failed = False
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
        if chunk_index == self.fail_at and not self.failed:
            self.failed = True
            raise RuntimeError(f"injected fault in chunk {chunk_index}")
        latent = self.inner.denoise_chunk(session_id, chunk_index, chunk_size, control, prompt=prompt)
        assert bool(torch.isfinite(latent).all()), f"chunk {chunk_index}: non-finite latent"
        if chunk_index == self.fail_at:
            stats = self.inner.cache_statistics(session_id)
            assert stats.stored_frames == self.stored_after_reseed
        return latent

    def release_cache(self, session_id: str) -> None:
        self.inner.release_cache(session_id)


class FailingOnceWithHistory(FailingOnce):
    """The same, keeping the model's history (a `HistoricDenoiser`): the re-seeded cache holds every chunk before."""

    @property
    def stored_after_reseed(self) -> int:  # type: ignore[override]
        return 3 * (self.fail_at + 1)

    def history_spec(self, config: LingBotSessionConfig) -> HistorySpec:
        return self.inner.history_spec(config)

    def chunk_record(self, session_id: str) -> ChunkRecord | None:
        return self.inner.chunk_record(session_id)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("lingbot-fast-reseed"), seed=0)


async def _run(world: LingBotFastWorldModel, denoiser: object, notices: list[RecoveryNotice]) -> list[ChunkOutput]:
    parts = WorldModelParts(world.encoder, denoiser, world.decoder)  # type: ignore[arg-type]
    service = LingBotService(parts, lease=ExecutionLease(), realtime=False, recovery=RecoveryBudget(attempts=2))
    service.add_recovery_listener(notices.append)
    await service.start()
    try:
        await service.create_session("s", service.prepare(CONFIG, None))
        service.push_control("s", ControlState(1, frozenset({"w", "l"})))
        chunks: list[ChunkOutput] = []
        async with asyncio.timeout(120):
            async for chunk in service.outputs("s"):
                chunks.append(chunk)
        summary = await service.close_session("s")
    finally:
        await service.aclose()
    assert summary.failure is None
    return chunks


@pytest.fixture(scope="module")
def world(model_dir: Path) -> LingBotFastWorldModel:
    return LingBotFastWorldModel.load(LingBotFastOptions(str(model_dir)))


async def test_the_tiny_model_goes_on_from_its_reseeded_cache_keeping_the_chunk_contract(
    world: LingBotFastWorldModel,
) -> None:
    faulty = FailingOnce(world.denoiser)
    notices: list[RecoveryNotice] = []
    chunks = await _run(world, faulty, notices)
    assert [c.index for c in chunks] == [0, 1, 2, 3, 4]
    assert [len(c.frames) for c in chunks] == [9, 12, 12, 12, 12]
    assert all(float(c.frames.astype("float32").std()) > 1.0 for c in chunks)  # pictures, not a flat fill
    assert [r.chunk_index for r in faulty.reseeds] == [2]
    assert [(n.recovering, n.cause) for n in notices] == [(True, "stage_failed"), (False, "stage_failed")]
    assert faulty.reseeds[0].history is None  # no history came back: the denoiser keeps none


async def test_with_history_the_frames_after_the_reseed_are_the_uninterrupted_runs(
    world: LingBotFastWorldModel,
) -> None:
    clean = await _run(world, world.denoiser, [])
    faulty = FailingOnceWithHistory(world.denoiser, fail_at=3)
    notices: list[RecoveryNotice] = []
    rebuilt = await _run(world, faulty, notices)
    assert [c.index for c in rebuilt] == [c.index for c in clean] == [0, 1, 2, 3, 4]
    for before, after in zip(clean, rebuilt, strict=True):
        assert np.array_equal(before.frames, after.frames), f"chunk {before.index} differs"
    history = faulty.reseeds[0].history
    assert history is not None
    assert history.indices() == (0, 1, 2)  # the latents came back with the frames into the checkpoint
    assert [(n.recovering, n.cause) for n in notices] == [(True, "stage_failed"), (False, "stage_failed")]


def test_a_fresh_cache_continues_at_a_later_chunk_with_its_positions_rebased() -> None:
    dit = TINY_DIT
    windowed = KVCache(dit, CacheConfig(window_frames=6, sink_frames=3), frame_tokens=2)
    windowed.continue_at(500, 1500)  # past the RoPE table (positions 0..1023): re-based, as the session was
    slot = windowed.begin_chunk()
    assert (slot.chunk_index, slot.first_frame) == (500, 1500)
    assert 0 <= slot.position <= dit.rope_frames - 3
    with pytest.raises(ModelSessionError, match="only a fresh cache"):
        windowed.continue_at(1, 3)
    unwindowed = KVCache(dit, CacheConfig(window_frames=None, max_frames=9), frame_tokens=2)
    with pytest.raises(ModelContextExhaustedError):
        unwindowed.continue_at(3, 9)
