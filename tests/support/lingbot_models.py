"""Shared helpers for the model-core tests: a tiny checkpoint, seeded chunk inputs and a session driver."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.lingbot.models import CacheConfig, DiTConfig, KVCache, LingBotFastDiT, TextKV, denoise_chunk

LATENT_H, LATENT_W = 4, 6
"""A 32x48-pixel video: 2x3 patches, 6 tokens per latent frame."""


@dataclass(frozen=True, slots=True)
class ChunkInputs:
    noise: torch.Tensor
    condition: torch.Tensor
    control: torch.Tensor


def chunk_inputs(config: DiTConfig, chunks: int, frames: int = 3, seed: int = 11) -> list[ChunkInputs]:
    generator = torch.Generator().manual_seed(seed)

    def draw(channels: int) -> torch.Tensor:
        return torch.randn(1, channels, frames, LATENT_H, LATENT_W, generator=generator)

    return [ChunkInputs(draw(16), draw(config.in_dim - 16), draw(config.control_map_channels)) for _ in range(chunks)]


def text_context(config: DiTConfig, seed: int = 5) -> torch.Tensor:
    """umt5-like states: a few real tokens, then zero padding up to text_len."""
    context = torch.randn(1, config.text_len, config.text_dim, generator=torch.Generator().manual_seed(seed))
    context[:, config.text_len // 2 :] = 0
    return context


def run_session(
    model: LingBotFastDiT, cache_config: CacheConfig, inputs: list[ChunkInputs], seed: int = 3
) -> tuple[list[torch.Tensor], KVCache]:
    """Denoises every chunk in order with one seeded generator; returns the chunks' x0 and the cache."""
    cache = model.new_cache(cache_config, LATENT_H, LATENT_W)
    text: TextKV = model.encode_text(text_context(model.config))
    generator = torch.Generator().manual_seed(seed)
    outputs = [
        denoise_chunk(model, cache, text, chunk.condition, chunk.noise, generator, chunk.control) for chunk in inputs
    ]
    return outputs, cache


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected|."""
    return float((actual.double() - expected.double()).abs().max() / expected.double().abs().max())


def checkpoint_file(directory: Path) -> Path:
    return directory / "diffusion_pytorch_model.safetensors"
