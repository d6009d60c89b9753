"""Model workers with injected faults, for the fault tests.

- `faulty_lingbot_workers`: the real `LingBotService` over the reference world model, whose denoiser raises in the
  middle of chunk `FAIL_AT_CHUNK` of every session created with seed `FAIL_SEED` (after that chunk's encode), and
  whose decoder's `release_cache` fails once for every session created with seed `POISON_SEED`.

`process_world.py` has the model worker whose stage runs in a worker process.
"""

from __future__ import annotations

import torch

from admission import ExecutionLease
from pipeline.lingbot.camera import CameraChunk
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.policy.service import LingBotService
from pipeline.lingbot.reference.model import ReferenceWorldModel
from pipeline.lingbot.seam import ChunkDecoder, ChunkDenoiser, WorldModelParts
from service.settings import Settings

FAIL_SEED = 666
FAIL_AT_CHUNK = 2
POISON_SEED = 777
RETRY_S = 1.0
"""How long the service waits before it retries a failed release (the first back-off step)."""
TINY = {"width": 32, "height": 32, "fps": 16, "chunk_size": 1, "hud": False}


class FaultyDenoiser:
    """The reference denoiser, except that chunk FAIL_AT_CHUNK of a FAIL_SEED session raises."""

    def __init__(self, inner: ChunkDenoiser) -> None:
        self._inner = inner
        self._doomed: set[str] = set()
        self.raised: list[tuple[str, int]] = []

    def create_cache(self, session_id: str, config: LingBotSessionConfig, base_latent: torch.Tensor) -> None:
        if config.seed == FAIL_SEED:
            self._doomed.add(session_id)
        self._inner.create_cache(session_id, config, base_latent)

    def denoise_chunk(
        self, session_id: str, chunk_index: int, chunk_size: int, control: CameraChunk, *, prompt: str
    ) -> torch.Tensor:
        if session_id in self._doomed and chunk_index == FAIL_AT_CHUNK:
            self.raised.append((session_id, chunk_index))
            raise RuntimeError(f"injected denoise failure in chunk {chunk_index}")
        return self._inner.denoise_chunk(session_id, chunk_index, chunk_size, control, prompt=prompt)

    def release_cache(self, session_id: str) -> None:
        self._doomed.discard(session_id)
        self._inner.release_cache(session_id)


class FlakyReleaseDecoder:
    """The reference decoder, except that releasing a POISON_SEED session's cache fails the first time."""

    def __init__(self, inner: ChunkDecoder) -> None:
        self._inner = inner
        self._flaky: set[str] = set()
        self.release_attempts: dict[str, int] = {}

    def create_cache(self, session_id: str, config: LingBotSessionConfig) -> None:
        if config.seed == POISON_SEED:
            self._flaky.add(session_id)
        self._inner.create_cache(session_id, config)

    def decode_chunk(self, session_id: str, chunk_index: int, latent: torch.Tensor) -> torch.Tensor:
        return self._inner.decode_chunk(session_id, chunk_index, latent)

    def release_cache(self, session_id: str) -> None:
        self.release_attempts[session_id] = self.release_attempts.get(session_id, 0) + 1
        if session_id in self._flaky:
            self._flaky.discard(session_id)
            raise RuntimeError("injected release failure")
        self._inner.release_cache(session_id)


class FaultyLingBot(LingBotService):
    """`LingBotService` over the faulty reference model; `denoiser` and `decoder` are its faulty stages."""

    def __init__(self) -> None:
        reference = ReferenceWorldModel("cpu")
        self.denoiser = FaultyDenoiser(reference.denoiser)
        self.decoder = FlakyReleaseDecoder(reference.decoder)
        model = WorldModelParts(encoder=reference.encoder, denoiser=self.denoiser, decoder=self.decoder)
        super().__init__(model, lease=ExecutionLease(), release_retry_s=RETRY_S)


def faulty_lingbot_workers(settings: Settings) -> list[FaultyLingBot]:
    return [FaultyLingBot() for _ in range(settings.num_workers)]
