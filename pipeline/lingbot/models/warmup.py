"""Warm-up chunks before a worker reports ready (`LINGSTREAM_WARMUP_CHUNKS`).

With `LINGSTREAM_COMPILE` on, code is compiled at the first forward of each new shape, and a session's shapes change
while its attention window fills (`slot.visible` grows) and then never again: the cache's offsets reach the blocks as
a device tensor, so every ring position and re-base runs the same graph (`compiled.py`, static offsets). Compiled
there, the first real session would wait seconds to minutes per new shape. So the denoiser runs `chunks` chunks of a
throwaway session (`LingBotFastDenoiser.warm_up`) inside `load_denoiser`, which is before the stage reports ready on
either placement, within `LINGSTREAM_WORKER_START_TIMEOUT`.

    chunks (auto)   compile off: 0; on: the chunks that fill the window plus the first steady-state chunk,
                    ceil(window / chunk) + 1 = 6 + 1 = 7 at window 18, chunk 3 (10 before the offsets were static:
                    the ring's turn, for `max`'s CUDA graphs per ring position)
    session         the planning resolution (832x480, `memory_plan.py`: the largest a session may ask), chunk 3,
                    the walking-and-turning camera, the empty prompt, seed 0

Sessions at other sizes compile at their first chunks. `max`'s CUDA graphs are recorded per layer for the addresses
of the cache's buffers (`KVCache.mark_static_addresses`): a session whose cache lands at other addresses than the
warm-up's records its own graphs at its first chunks (compiling nothing); where the caching allocator hands it the
blocks a finished session freed, the recorded graphs replay — which of the two a GPU shows is not yet measured. The
warm-up leaves no state behind (`warm_up`'s contract; tested: a session after it makes frames `torch.equal` to a
worker that did not warm up).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.models.cache import CacheConfig
from pipeline.lingbot.seam import LATENT_CHANNELS

__all__ = [
    "WARM_UP_CHUNK_SIZE",
    "WarmUp",
    "auto_warm_up_chunks",
    "warm_up_config",
    "warm_up_controls",
    "warm_up_latent",
]

WARM_UP_CHUNK_SIZE = 3
"""The published chunk (and the session default)."""
_WARM_UP_KEYS = ("w", "l")


@dataclass(frozen=True, slots=True)
class WarmUp:
    """What a worker's warm-up did (shown by `/readyz`)."""

    chunks: int
    seconds: float
    resolution: str
    """WIDTHxHEIGHT of the throwaway session."""

    def to_mapping(self) -> dict[str, object]:
        return {"chunks": self.chunks, "seconds": round(self.seconds, 3), "resolution": self.resolution}


def auto_warm_up_chunks(cache: CacheConfig, compile_mode: str) -> int:
    """The default number of warm-up chunks (module docstring): 0 without compile."""
    if compile_mode == "off":
        return 0
    chunk = cache.chunk_frames
    if cache.window_frames is None:  # no ring: the cache grows, a new shape every chunk; warm up one window's worth
        return math.ceil((cache.max_frames or chunk) / chunk)
    return math.ceil(cache.window_frames / chunk) + 1


def warm_up_config(width: int, height: int, chunks: int) -> LingBotSessionConfig:
    """The throwaway session: `chunks` chunks of `WARM_UP_CHUNK_SIZE` at `width` x `height`, seed 0, no prompt."""
    frames = 4 * max(1, chunks) * WARM_UP_CHUNK_SIZE - 3
    return LingBotSessionConfig(width=width, height=height, chunk_size=WARM_UP_CHUNK_SIZE, frame_num=frames)


def warm_up_latent(config: LingBotSessionConfig, device: torch.device) -> torch.Tensor:
    """A base latent of one zero frame (what the shapes need; the values do not matter to what is compiled)."""
    return torch.zeros(LATENT_CHANNELS, 1, config.latent_height, config.latent_width, device=device)


def warm_up_controls(chunk_index: int) -> ControlSnapshot:
    """Walking and turning: the camera map changes every chunk, as in a session."""
    return ControlSnapshot.from_keys(chunk_index, list(_WARM_UP_KEYS))
