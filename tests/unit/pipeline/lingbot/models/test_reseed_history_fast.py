"""LingBot-World-Fast re-seeded with its history (docs/continuity.md): the tiny real model's KV cache rebuilt by a
prefill of the session's clean latents, the generator restored and the streamed VAE primed with the same latents,
against an uninterrupted run of the same session on the CPU.

A small cache makes every case cheap: a window of 9 latent frames with a sink of 3 (one chunk of sink, two in the
ring) and a lookback of one chunk, so the history keeps chunk 0 and the 3 newest others. Re-seeded at chunk 2 (the
window not yet full) and at chunk 4 (the ring turned, the history still every chunk since 0) the next chunks'
latents and frames equal the uninterrupted run's to the bit. At chunk 6 the history lacks chunk 1, so the window's
oldest chunk is rebuilt against the sink and the lookback only: close, within the bound stated below. Without
history (the first slice) the latents differ as much as they are large: the jump this slice removes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.lingbot.camera import CameraChunk, CameraController
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.continuity import ResumePoint
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.history import ChunkHistory, HistorySpec, SessionHistory
from pipeline.lingbot.models.bundle import LingBotFastOptions, write_tiny_model
from pipeline.lingbot.models.world import LingBotFastWorldModel

pytest.importorskip("diffusers", reason="the lingbot extra (diffusers) is not installed")
pytest.importorskip("transformers", reason="the lingbot extra (transformers) is not installed")
pytest.importorskip("safetensors.torch", reason="the lingbot extra (safetensors) is not installed")

CHUNKS = 8
CONFIG = LingBotSessionConfig.from_mapping(
    {"width": 64, "height": 32, "frame_num": 4 * 3 * CHUNKS - 3, "seed": 7, "hud": False}
)
KEYS = (frozenset({"w"}), frozenset({"w", "l"}), frozenset({"d"}), frozenset({"s", "j"}))
PROMPTS = ("a road", "a road", "a road at dusk", "a road at dusk")
LATENT_BOUND = 1e-5
"""Largest |difference| of a latent value after a re-seed whose history lacks chunks (measured: 0.0 here, 1e-6 at
the default window with values of magnitude about 4; the tiny model's random weights make its cross-frame attention
weak, so this says little of the real model's gap)."""
FRAME_MEAN_BOUND = 4.0
"""Largest mean |difference| of the uint8 frames there: the VAE's causal feature cache primed with the 9 latent frames
the history holds, not all 18 since frame 0 (measured: 2.94 then 0.50, maxima 45 and 10; without history 68 and 56).
At the default window the prime is 24 latent frames and the difference at most 1 level."""


class Run:
    """The uninterrupted session: every chunk's camera, latent, frames, and the history after it."""

    def __init__(self, world: LingBotFastWorldModel) -> None:
        self.world = world
        world.encoder.create_cache("u", CONFIG)
        self.base = world.encoder.encode_reference("u", None)
        camera = CameraController(CONFIG.pose_steps(), CONFIG.camera_intrinsics())
        self.cameras: list[CameraChunk] = [
            camera.chunk_control(ControlSnapshot.from_keys(i, KEYS[i % 4]), i, 3).camera for i in range(CHUNKS)
        ]
        world.denoiser.create_cache("u", CONFIG, self.base)
        world.decoder.create_cache("u", CONFIG)
        self.latents: list[torch.Tensor] = []
        self.frames: list[torch.Tensor] = []
        self.histories = [SessionHistory()]
        for index in range(CHUNKS):
            latent = world.denoiser.denoise_chunk("u", index, 3, self.cameras[index], prompt=PROMPTS[index % 4])
            self.latents.append(latent.clone())
            self.frames.append(world.decoder.decode_chunk("u", index, latent))
            record = world.denoiser.chunk_record("u")
            assert record is not None
            self.histories.append(self.histories[-1].append(ChunkHistory(record, latent.clone())))

    def resume(self, sid: str, start: int, history: SessionHistory | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Re-seed `sid` at `start` with `history` and run it to the end: each chunk's (latent, frames)."""
        world = self.world
        world.denoiser.reseed_cache(sid, CONFIG, self.base, ResumePoint(start, None, history))  # type: ignore[arg-type]
        world.decoder.reseed_cache(sid, CONFIG, start, None if history is None else history.prime(start))
        out = []
        for index in range(start, CHUNKS):
            latent = world.denoiser.denoise_chunk(sid, index, 3, self.cameras[index], prompt=PROMPTS[index % 4])
            out.append((latent, world.decoder.decode_chunk(sid, index, latent)))
        return out


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    root: Path = write_tiny_model(tmp_path_factory.mktemp("lingbot-fast-history"), seed=0)
    options = LingBotFastOptions(str(root), window_frames=9, sink_frames=3, history_lookback_chunks=1)
    return Run(LingBotFastWorldModel.load(options))


def test_the_history_keeps_the_sink_and_the_newest_chunks(run: Run) -> None:
    assert run.world.denoiser.history_spec(CONFIG) == HistorySpec(sink_chunks=1, recent_chunks=3)
    assert run.histories[2].indices() == (0, 1)
    assert run.histories[4].indices() == (0, 1, 2, 3)
    assert run.histories[6].indices() == (0, 3, 4, 5)
    assert run.histories[8].indices() == (0, 5, 6, 7)
    assert [run.histories[k].complete for k in (2, 4, 6)] == [True, True, False]
    stats = run.world.denoiser.cache_statistics("u")
    assert stats.evicted_frames > 0  # the ring turned in the uninterrupted run


@pytest.mark.parametrize("start", [2, 4], ids=["before-the-window-fills", "after-the-ring-turned"])
def test_a_reseed_with_every_chunk_since_the_first_makes_the_uninterrupted_runs_chunks(run: Run, start: int) -> None:
    history = run.histories[start]
    assert history.complete
    for offset, (latent, frames) in enumerate(run.resume(f"exact{start}", start, history)):
        index = start + offset
        assert torch.equal(latent, run.latents[index]), f"chunk {index}: latent"
        assert torch.equal(frames, run.frames[index]), f"chunk {index}: frames"


def test_a_reseed_whose_history_lacks_evicted_chunks_stays_within_the_bound(run: Run) -> None:
    history = run.histories[6]
    assert not history.complete
    for offset, (latent, frames) in enumerate(run.resume("close", 6, history)):
        index = 6 + offset
        assert float((latent - run.latents[index]).abs().max()) <= LATENT_BOUND, f"chunk {index}"
        assert _mean_difference(frames, run.frames[index]) <= FRAME_MEAN_BOUND, f"chunk {index}"
    latent, frames = run.resume("jump", 6, None)[0]  # the first slice's re-seed: the size of the jump it had
    assert float((latent - run.latents[6]).abs().max()) > 1000 * LATENT_BOUND
    assert _mean_difference(frames, run.frames[6]) > 10 * FRAME_MEAN_BOUND


def _mean_difference(frames: torch.Tensor, expected: torch.Tensor) -> float:
    return float((frames.int() - expected.int()).abs().float().mean())
