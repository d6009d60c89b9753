"""3-D rotary position embedding: each head's channels split into frame, height and width parts.

A head of `head_dim` channels gives `head_dim - 2 * (head_dim // 3)` channels to the latent frame index and
`head_dim // 3` each to the patch row and column (44/42/42 for 128). Channels rotate in adjacent pairs
(2i, 2i + 1) by `position * theta ** (-2i / part_dim)`; angles are computed in float64 and the rotation in float32,
as the reference does. The frame position is the latent frame index. What the model was trained on is a table of
`DiTConfig.rope_frames` (1024) positions, so the *distances* a chunk sees must stay within it: the cache re-bases
(see `cache.py`). The angles themselves are computed for any frame, past the table too: the cache rotates every
chunk at its absolute frame and moves its sink on a re-base instead, so the distances are the re-based ones.

The inverse frequencies are made on the CPU (float64, as the reference) and copied to a device once per table and
device (`prepare`, which a `KVCache` calls when it is made); the cache makes each chunk's angles from them on the
device, once per chunk, into buffers of its own: a forward copies nothing from the host (no host sync, and nothing
that would keep a CUDA graph from capturing it) and computes no angles.

Because a rotation by `a` followed by one by `b` is one by `a + b`, keys already rotated and cached can be moved
to other frame positions exactly (`shift_frames`): the scores `q . k` depend only on position differences.
"""

from __future__ import annotations

import torch

from pipeline.lingbot.models.config import DiTConfig
from pipeline.lingbot.models.errors import ModelContextExhaustedError

__all__ = ["Rope3D", "RopeAngles", "rotate"]

RopeAngles = tuple[torch.Tensor, torch.Tensor]
"""(cos, sin), float32, `[tokens, 1, head_dim // 2]`: broadcast over heads."""


class Rope3D:
    """Rotation angles for a chunk's `(frames, rows, columns)` token grid, and the rotation itself."""

    def __init__(self, config: DiTConfig) -> None:
        self._frames = config.rope_frames
        self._split = config.rope_split
        self._inv_freq = tuple(_inverse_frequencies(part, config.rope_theta) for part in self._split)
        self._on_device: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    @property
    def frames(self) -> int:
        """Frame positions 0 .. frames - 1 exist."""
        return self._frames

    def prepare(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """The inverse frequencies on `device`, copied there on the first call for that device only (outside the
        forwards: `LingBotFastDiT.new_cache`). Two threads racing here copy twice, harmlessly: the tables are equal."""
        tables = self._on_device.get(device)
        if tables is None:
            tables = tuple(freq.to(device) for freq in self._inv_freq)
            self._on_device[device] = tables
        return tables

    def angles(self, first_frame: int, grid: tuple[int, int, int], device: torch.device) -> RopeAngles:
        """Angles for tokens laid out frame-major, then row, then column, starting at frame `first_frame` (which may
        lie past the table: the cache rotates at absolute frames and keeps every distance within it)."""
        frames, rows, cols = grid
        if first_frame < 0:
            raise ModelContextExhaustedError(f"latent frame position {first_frame} is negative")
        if max(rows, cols) > self._frames:
            raise ModelContextExhaustedError(f"a {rows}x{cols} patch grid exceeds the RoPE table of {self._frames}")
        f_freq, h_freq, w_freq = self.prepare(device)
        f_pos = torch.arange(first_frame, first_frame + frames, dtype=torch.float64, device=device)
        h_pos = torch.arange(rows, dtype=torch.float64, device=device)
        w_pos = torch.arange(cols, dtype=torch.float64, device=device)
        parts = (
            torch.outer(f_pos, f_freq)[:, None, None, :].expand(frames, rows, cols, -1),
            torch.outer(h_pos, h_freq)[None, :, None, :].expand(frames, rows, cols, -1),
            torch.outer(w_pos, w_freq)[None, None, :, :].expand(frames, rows, cols, -1),
        )
        theta = torch.cat(parts, dim=-1).reshape(frames * rows * cols, 1, -1)
        return torch.cos(theta).float(), torch.sin(theta).float()

    def shift_frames(self, x: torch.Tensor, frames: int) -> torch.Tensor:
        """`x` `[B, T, heads, head_dim]`, already rotated, moved by `frames` frame positions (may be negative)."""
        f_part = self._split[0]
        theta = frames * self.prepare(x.device)[0]
        ones = torch.ones_like(theta)
        cos = torch.cat([torch.cos(theta), ones.new_ones(x.shape[-1] // 2 - f_part // 2)]).float()
        sin = torch.cat([torch.sin(theta), ones.new_zeros(x.shape[-1] // 2 - f_part // 2)]).float()
        return rotate(x, (cos, sin))


def rotate(x: torch.Tensor, angles: RopeAngles) -> torch.Tensor:
    """Rotates adjacent channel pairs of `x` `[B, S, heads, head_dim]` by `angles`; returns `x`'s dtype."""
    cos, sin = angles
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    out = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return out.flatten(-2).to(x.dtype)


def _inverse_frequencies(part_dim: int, theta: float) -> torch.Tensor:
    # Explicitly on the CPU: a model may be built under `torch.device("meta")` and given weights later.
    exponents = torch.arange(0, part_dim, 2, dtype=torch.float64, device="cpu")[: part_dim // 2] / part_dim
    return 1.0 / (theta**exponents)
