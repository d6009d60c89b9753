"""The reference model on worker processes, with faults injected into rank 1 of its DiT group.

Spawned ranks import this module by name: it stays light (no service, no test harness). A session created with
`KILL_SEED` makes rank 1 set `started` in the middle of chunk `FAULT_CHUNK` and then sleep, so a test can SIGKILL
it there; one created with `STUCK_SEED` makes rank 1 never answer that chunk (rank 0 waits for it in the
all-gather), which only the worker's call timeout can end. `KILL_ONCE_SEED` is `KILL_SEED` while `started` is not
set: the group that comes back after the kill runs the chunk (a session re-seeded there goes on, docs/continuity.md).
The denoiser re-seeds (`ReseedableDenoiser`) when the model it wraps does, and passes on its history
(`HistoricDenoiser`: LingBot-World-Fast's chunk records) when it keeps one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from pipeline.lingbot.camera import CameraChunk
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.continuity import ResumePoint
from pipeline.lingbot.errors import ModelSessionError
from pipeline.lingbot.history import ChunkRecord, HistorySpec
from pipeline.lingbot.reference.model import ReferenceModelFactory
from pipeline.lingbot.seam import (
    ChunkDecoder,
    ChunkDenoiser,
    HistoricDenoiser,
    ModelShard,
    ReferenceEncoder,
    ReseedableDenoiser,
    WorldModelFactory,
)

KILL_SEED = 4242
STUCK_SEED = 4343
KILL_ONCE_SEED = 4444
FAULT_CHUNK = 1
_HANG_S = 600.0  # far past any test: the rank is killed long before


class FaultyShardedDiT:
    """One rank of the reference DiT; rank 1 hangs in chunk FAULT_CHUNK of KILL_SEED and STUCK_SEED sessions."""

    def __init__(self, inner: ChunkDenoiser, rank: int, started: Any) -> None:
        self._inner = inner
        self._rank = rank
        self._started = started
        self._seeds: dict[str, int] = {}

    def create_cache(self, session_id: str, config: LingBotSessionConfig, base_latent: torch.Tensor) -> None:
        self._seeds[session_id] = config.seed
        self._inner.create_cache(session_id, config, base_latent)

    def denoise_chunk(
        self, session_id: str, chunk_index: int, chunk_size: int, control: CameraChunk, *, prompt: str
    ) -> torch.Tensor:
        seed = self._seeds.get(session_id)
        if seed == KILL_ONCE_SEED and self._started.is_set():
            seed = None
        if self._rank == 1 and chunk_index == FAULT_CHUNK and seed in (KILL_SEED, STUCK_SEED, KILL_ONCE_SEED):
            if seed != STUCK_SEED:
                self._started.set()
            time.sleep(_HANG_S)
        return self._inner.denoise_chunk(session_id, chunk_index, chunk_size, control, prompt=prompt)

    def reseed_cache(
        self, session_id: str, config: LingBotSessionConfig, base_latent: torch.Tensor, resume: ResumePoint
    ) -> None:
        if not isinstance(self._inner, ReseedableDenoiser):
            raise ModelSessionError(f"{type(self._inner).__name__} cannot re-seed")
        self._seeds[session_id] = config.seed
        self._inner.reseed_cache(session_id, config, base_latent, resume)

    def history_spec(self, config: LingBotSessionConfig) -> HistorySpec:
        if not isinstance(self._inner, HistoricDenoiser):
            raise ModelSessionError(f"{type(self._inner).__name__} keeps no history")
        return self._inner.history_spec(config)

    def chunk_record(self, session_id: str) -> ChunkRecord | None:
        """The wrapped model's record of the newest chunk (None: it keeps no history, e.g. the reference model)."""
        return self._inner.chunk_record(session_id) if isinstance(self._inner, HistoricDenoiser) else None

    def release_cache(self, session_id: str) -> None:
        self._seeds.pop(session_id, None)
        self._inner.release_cache(session_id)


@dataclass(frozen=True, slots=True)
class FaultyShardedFactory:
    """A model factory (`inner`) whose denoisers are `FaultyShardedDiT`s; `started` is a spawn-context Event."""

    started: Any
    inner: WorldModelFactory = field(default_factory=ReferenceModelFactory)
    """The model whose ranks get the fault (the reference model's, or LingBot-World-Fast's)."""

    def encoder(self, shard: ModelShard) -> ReferenceEncoder:
        return self.inner.encoder(shard)

    def denoiser(self, shard: ModelShard) -> ChunkDenoiser:
        return FaultyShardedDiT(self.inner.denoiser(shard), shard.rank, self.started)

    def decoder(self, shard: ModelShard) -> ChunkDecoder:
        return self.inner.decoder(shard)
