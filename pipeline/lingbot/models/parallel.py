"""Ulysses context parallelism for the DiT: how one chunk's tokens and heads are laid out over a DiT group of P ranks.

    patch embedding      every rank embeds the whole chunk, keeps its tokens   [B, S/P, dim]  (a contiguous range)
    camera, text, FFN    token-sharded: each rank runs them on its own tokens   (cross-attention: all heads, text K/V
                                                                                 replicated, a few MB per session)
    self-attention       q, k, v (normed, rotated) on the rank's tokens, all heads; an all-to-all turns them into
                         all tokens, the rank's heads [B, S, H/P, d]; the rank's KV cache holds its heads for every
                         token (the 1-rank cache's head slice); SDPA; an all-to-all back to [B, S/P, H, d]; `o`
    output head          on the rank's tokens; the velocity is all-gathered, so every rank holds the whole chunk and
                         runs the (cheap, seeded, identical) sampler: every rank owns the sampler state, rank 0's
                         result is the one the group returns
    umt5 text encoder    rank 0 only; its states are broadcast (`broadcast`), never a copy of the encoder per rank

The rule: P divides the heads (so every rank holds whole heads) and the tokens of one latent frame (so every chunk's
tokens split evenly, whatever its frames). At the published 832x480 (1 560 tokens per frame, 40 heads) that is P in
{1, 2, 4, 5, 8}. A group that breaks it is refused at start (`check_parallel`, naming `LINGSTREAM_DENOISE_RANKS`).

Exactness: every rank computes the same float operations on its rows or heads as one rank does on all of them (row
shards of a Linear, head shards of SDPA, per-token norms and rotations), and the collectives only move bytes, so on
the CPU a P-rank session equals the 1-rank session bit for bit (tested with gloo at P = 2 and 4). With P = 1 nothing
is communicated and no code path changes.

Collectives run on torch.distributed's default group (the worker joins the DiT group's ranks into it before building
the denoiser: gloo on CPU, nccl on CUDA). Every rank must reach every collective of a call in the same order: the
denoise calls are the same on every rank ("every rank gets every call"), so they do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipeline.lingbot.models.config import DiTConfig
from pipeline.lingbot.models.errors import ModelConfigError

__all__ = ["DENOISE_RANKS_VARIABLE", "SINGLE_RANK", "Ulysses", "check_parallel"]

DENOISE_RANKS_VARIABLE = "LINGSTREAM_DENOISE_RANKS"
"""The setting that chooses P (named in refusals; the library never reads the environment)."""


def check_parallel(config: DiTConfig, ranks: int, frame_tokens: int | None = None) -> None:
    """Refuses a DiT group of `ranks` that does not divide the heads (or `frame_tokens`, a latent frame's tokens),
    naming the rule and the variable."""
    if ranks < 1:
        raise ModelConfigError(f"{DENOISE_RANKS_VARIABLE}={ranks}: a DiT group has at least one rank")
    if config.num_heads % ranks:
        raise ModelConfigError(
            f"{DENOISE_RANKS_VARIABLE}={ranks} does not divide the DiT's {config.num_heads} attention heads: Ulysses "
            f"context parallelism gives every rank whole heads, so the DiT group size must divide {config.num_heads} "
            f"(valid: {_divisors(config.num_heads)})"
        )
    if frame_tokens is not None and frame_tokens % ranks:
        raise ModelConfigError(
            f"{DENOISE_RANKS_VARIABLE}={ranks} does not divide the {frame_tokens} tokens of a latent frame: Ulysses "
            "context parallelism splits every chunk's tokens evenly, so the DiT group size must divide them "
            f"(valid here: {[p for p in _divisors(config.num_heads) if frame_tokens % p == 0]})"
        )


def _divisors(n: int) -> list[int]:
    return [p for p in range(1, n + 1) if n % p == 0]


@dataclass(frozen=True, slots=True)
class Ulysses:
    """This rank's place in the DiT group and the layout's collectives (module docstring): the two all-to-alls around
    self-attention, the velocity's all-gather, and rank 0's flag and broadcast for the prompt's states. Stateless;
    every collective is a no-op at `world_size` 1. Every rank must call each one in the same order (a rank that
    skips one leaves the others waiting until the worker's call timeout ends the group)."""

    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ModelConfigError(f"rank {self.rank} is outside a DiT group of {self.world_size}")

    @property
    def parallel(self) -> bool:
        return self.world_size > 1

    def local_heads(self, heads: int) -> int:
        """Heads this rank attends with (and caches)."""
        return heads // self.world_size

    def token_range(self, tokens: int) -> tuple[int, int]:
        """This rank's contiguous `[start, stop)` of a chunk's `tokens`."""
        if tokens % self.world_size:
            raise ModelConfigError(f"{tokens} tokens do not split over a DiT group of {self.world_size}")
        share = tokens // self.world_size
        return self.rank * share, (self.rank + 1) * share

    def shard_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """`x` `[B, S, ...]` -> this rank's tokens `[B, S/P, ...]`."""
        if not self.parallel:
            return x
        start, stop = self.token_range(x.shape[1])
        return x[:, start:stop]

    def to_heads(self, x: torch.Tensor) -> torch.Tensor:
        """All-to-all: this rank's tokens with every head `[B, S/P, H, d]` -> every token with this rank's heads
        `[B, S, H/P, d]` (tokens in the chunk's order)."""
        if not self.parallel:
            return x
        b, s, h, d = x.shape
        p = self.world_size
        # [P (destination rank: its heads), B, S/P, H/P, d]
        send = x.reshape(b, s, p, h // p, d).permute(2, 0, 1, 3, 4).contiguous()
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send)
        # received[i] holds source rank i's tokens for this rank's heads
        return received.permute(1, 0, 2, 3, 4).reshape(b, p * s, h // p, d)

    def to_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """All-to-all back: every token with this rank's heads `[B, S, H/P, d]` -> this rank's tokens with every head
        `[B, S/P, H, d]`."""
        if not self.parallel:
            return x
        b, s, h, d = x.shape
        p = self.world_size
        # [P (destination rank: its tokens), B, S/P, H/P, d]
        send = x.reshape(b, p, s // p, h, d).permute(1, 0, 2, 3, 4).contiguous()
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send)
        # received[i] holds source rank i's heads for this rank's tokens
        return received.permute(1, 2, 0, 3, 4).reshape(b, s // p, p * h, d)

    def gather_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """All-gather: this rank's tokens `[B, S/P, C]` -> the whole chunk `[B, S, C]` on every rank."""
        if not self.parallel:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=1)

    def rank0_succeeded(self, ok: bool, device: torch.device) -> bool:
        """Rank 0's `ok` on every rank: before a broadcast, so a failure on rank 0 fails the call on every rank
        instead of leaving the others waiting in the broadcast."""
        if not self.parallel:
            return ok
        flag = torch.tensor([1.0 if ok else 0.0], device=device)
        dist.broadcast(flag, src=0)
        return bool(flag.item() == 1.0)

    def broadcast(
        self, tensor: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """Rank 0's `tensor` (`shape`, `dtype`; None on the other ranks) on every rank, on `device`."""
        if not self.parallel:
            assert tensor is not None
            return tensor
        if self.rank == 0:
            assert tensor is not None
            out = tensor.to(device).contiguous()
        else:
            out = torch.empty(shape, dtype=dtype, device=device)
        dist.broadcast(out, src=0)
        return out


SINGLE_RANK = Ulysses()
"""The layout of an unsharded DiT."""
