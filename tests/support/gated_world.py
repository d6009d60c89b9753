"""A reference world model whose decoder a test can hold mid-chunk inside a worker process.

Spawned ranks import this module by name, so everything here is module level and picklable by reference; the
test synchronises with the decoder through spawn-context `multiprocessing.Event`s carried by the factory. The
session id says what happens at the gate (part 1 of chunk 1): "gate-..." waits for the gate, "fail-..." waits and
then raises, "kill-..." waits and then ends the process; any other session decodes straight through.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.reference.model import (
    ReferenceDiT,
    ReferenceModelFactory,
    ReferenceVAEDecoder,
    ReferenceVAEEncoder,
)
from pipeline.lingbot.seam import ModelShard

GATE_CHUNK = 1
GATE_PART = 1
GATE_TIMEOUT_S = 30.0


class PartsDecoder:
    """The reference decoder's caches, and its whole chunk as the concatenation of `decode_parts` (which a test's
    subclass holds or fails mid-chunk), so the whole chunk goes through the same gate."""

    def __init__(self, inner: ReferenceVAEDecoder) -> None:
        self._inner = inner

    def create_cache(self, session_id: str, config: LingBotSessionConfig) -> None:
        self._inner.create_cache(session_id, config)

    def release_cache(self, session_id: str) -> None:
        self._inner.release_cache(session_id)

    def decode_chunk(self, session_id: str, chunk_index: int, latent: torch.Tensor) -> torch.Tensor:
        return torch.cat(list(self.decode_parts(session_id, chunk_index, latent)))

    def decode_parts(self, session_id: str, chunk_index: int, latent: torch.Tensor) -> Iterator[torch.Tensor]:
        return self._inner.decode_parts(session_id, chunk_index, latent)


class GatedProcessDecoder(PartsDecoder):
    """The reference decoder, held at part `GATE_PART` of chunk `GATE_CHUNK` for the sessions named above."""

    def __init__(self, inner: ReferenceVAEDecoder, started: Any, gate: Any) -> None:
        super().__init__(inner)
        self._started = started
        self._gate = gate

    def decode_parts(self, session_id: str, chunk_index: int, latent: torch.Tensor) -> Iterator[torch.Tensor]:
        held = session_id.split("-")[0] in ("gate", "fail", "kill")
        for number, part in enumerate(self._inner.decode_parts(session_id, chunk_index, latent)):
            if held and chunk_index == GATE_CHUNK and number == GATE_PART:
                self._started.set()
                if not self._gate.wait(GATE_TIMEOUT_S):
                    raise RuntimeError("the test never opened the gate")
                if session_id.startswith("fail-"):
                    raise RuntimeError("VAE ran out of memory mid-chunk")
                if session_id.startswith("kill-"):
                    os._exit(9)
            yield part


@dataclass(frozen=True, slots=True)
class GatedReferenceFactory:
    """`ReferenceModelFactory` with a `GatedProcessDecoder`; `started` and `gate` are spawn-context events."""

    started: Any
    gate: Any

    def encoder(self, shard: ModelShard) -> ReferenceVAEEncoder:
        return ReferenceModelFactory().encoder(shard)

    def denoiser(self, shard: ModelShard) -> ReferenceDiT:
        return ReferenceModelFactory().denoiser(shard)

    def decoder(self, shard: ModelShard) -> GatedProcessDecoder:
        return GatedProcessDecoder(ReferenceModelFactory().decoder(shard), self.started, self.gate)
