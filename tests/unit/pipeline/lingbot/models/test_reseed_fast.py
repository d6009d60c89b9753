"""LingBot-World-Fast re-seeded after a failed chunk (docs/continuity.md): the tiny real model goes on from its
re-seeded cache with finite latents and the chunk contract kept (12 frames a chunk after the first 9), with the
positions of its KV cache continuing the session's; not yet the frames of an uninterrupted run (the history is not
rebuilt: that prefill is the next slice)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from admission import ExecutionLease
from pipeline.bidirectional import ChunkOutput, ControlState, RecoveryNotice
from pipeline.lingbot.camera import CameraChunk
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.continuity import ResumePoint
from pipeline.lingbot.errors import ModelSessionError
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
    """The tiny model's denoiser, raising once in chunk 2 (a `ReseedableDenoiser`)."""

    def __init__(self, inner: LingBotFastDenoiser) -> None:
        self.inner = inner
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
        if chunk_index == 2 and not self.failed:
            self.failed = True
            raise RuntimeError("injected fault in chunk 2")
        latent = self.inner.denoise_chunk(session_id, chunk_index, chunk_size, control, prompt=prompt)
        assert bool(torch.isfinite(latent).all()), f"chunk {chunk_index}: non-finite latent"
        if chunk_index == 2:
            stats = self.inner.cache_statistics(session_id)
            assert stats.stored_frames == 3  # the re-seeded cache holds its first chunk only
        return latent

    def release_cache(self, session_id: str) -> None:
        self.inner.release_cache(session_id)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("lingbot-fast-reseed"), seed=0)


async def test_the_tiny_model_goes_on_from_its_reseeded_cache_keeping_the_chunk_contract(model_dir: Path) -> None:
    world = LingBotFastWorldModel.load(LingBotFastOptions(str(model_dir)))
    faulty = FailingOnce(world.denoiser)
    parts = WorldModelParts(world.encoder, faulty, world.decoder)
    service = LingBotService(parts, lease=ExecutionLease(), realtime=False, recovery=RecoveryBudget(attempts=2))
    notices: list[RecoveryNotice] = []
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
    assert [c.index for c in chunks] == [0, 1, 2, 3, 4]
    assert [len(c.frames) for c in chunks] == [9, 12, 12, 12, 12]
    assert all(float(c.frames.astype("float32").std()) > 1.0 for c in chunks)  # pictures, not a flat fill
    assert [r.chunk_index for r in faulty.reseeds] == [2]
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
