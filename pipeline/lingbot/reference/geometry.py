"""The reference camera's geometry: rays, where they meet the world (the panorama and the ground), sampling and
the band layout that lets a sharded denoiser compute every pixel exactly as the unsharded one.

The world model is drawn in `pipeline.lingbot.reference.model`'s docstring: rays above the horizon (and rays that
meet the ground far away) look up a panorama at infinity, rays that meet the ground nearby look up the reference's
ground back-projected onto the plane; both mirror-tiled (`fold`). `rows_of` is how the denoiser's ranks share the
latent rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pipeline.lingbot.reference.picture import CAMERA_HEIGHT

__all__ = [
    "HALF_FOV",
    "Lookup",
    "band_layout",
    "fold",
    "from_band_layout",
    "grid_rays",
    "look_up",
    "project",
    "render",
    "rotate",
    "rows_of",
    "sample_texture",
]

HALF_FOV = math.pi / 4  # the 90 degree field of view every stage assumes (tan = 1)
GROUND_NEAR = 3.0
GROUND_FAR = 6.0


def grid_rays(grid_h: int, grid_w: int, aspect: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit camera rays `[3, P]` and normalised image coordinates `[2, P]` of a grid's pixel centres."""
    xn = (torch.arange(grid_w, dtype=torch.float32, device=device) + 0.5) / grid_w * 2 - 1
    yn = (torch.arange(grid_h, dtype=torch.float32, device=device) + 0.5) / grid_h * 2 - 1
    yy, xx = torch.meshgrid(yn, xn, indexing="ij")
    tan_half = math.tan(HALF_FOV)
    rays = torch.stack([xx * tan_half, yy * tan_half * aspect, torch.ones_like(xx)]).reshape(3, -1)
    return rays / torch.linalg.vector_norm(rays, dim=0, keepdim=True), torch.stack([xx, yy]).reshape(2, -1)


def fold(values: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Mirror-tile the real line onto [low, high] (a triangle wave), so tiled textures have no seams."""
    period = 2 * (high - low)
    phase = torch.remainder(values - low, period)
    return low + (period / 2 - (phase - period / 2).abs())


@dataclass(frozen=True, slots=True)
class Lookup:
    """Where a batch of rays looks in the reference texture: two layers and the ground layer's weight."""

    sky_grid: torch.Tensor  # [N, P, 2] normalised (x, y) into the texture, at infinity
    sky_beyond: torch.Tensor  # [N, P] 0..1: how far above the top of the picture (1 = half a picture or more)
    ground_grid: torch.Tensor  # [N, P, 2]
    ground_weight: torch.Tensor  # [N, P] 0..1
    ground_points: torch.Tensor  # [N, 3, P] world points on the ground


def look_up(directions: torch.Tensor, centres: torch.Tensor, aspect: float) -> Lookup:
    """World ray directions `[N, 3, P]` from camera centres `[N, 3]` -> texture coordinates (see module docstring)."""
    tan_half = math.tan(HALF_FOV)
    dx, dy, dz = directions.unbind(1)
    lon = fold(torch.atan2(dx, dz), -HALF_FOV, HALF_FOV)
    horizontal = torch.sqrt(dx * dx + dz * dz).clamp_min(1e-6)
    sky_x = torch.tan(lon) / tan_half
    sky_y = (dy / horizontal / torch.cos(lon) / (tan_half * aspect)).clamp(-50, 50)
    sky_beyond = (-sky_y - 1).clamp(0, 1)

    # Ground plane y = camera height (y points down); the reference camera sees it from z_near on.
    height_above = (CAMERA_HEIGHT - centres[:, 1]).clamp_min(1e-3)[:, None]
    down = dy > 1e-4
    distance = torch.where(down, height_above / dy.clamp_min(1e-4), torch.full_like(dy, 1e6))
    points = centres[:, :, None] + directions * distance[:, None, :]
    fade = ((distance - GROUND_NEAR) / (GROUND_FAR - GROUND_NEAR)).clamp(0, 1)
    weight = torch.where(down, 1 - fade * fade * (3 - 2 * fade), torch.zeros_like(dy))
    z_near = CAMERA_HEIGHT / (tan_half * aspect)
    ground_x = fold(points[:, 0], -GROUND_FAR, GROUND_FAR)
    ground_z = fold(points[:, 2], z_near, z_near + GROUND_FAR)
    ground_grid = torch.stack([ground_x / ground_z / tan_half, CAMERA_HEIGHT / ground_z / (tan_half * aspect)], -1)
    return Lookup(
        sky_grid=torch.stack([sky_x, sky_y.clamp(-3, 3)], dim=-1),
        sky_beyond=sky_beyond,
        ground_grid=ground_grid,
        ground_weight=weight,
        ground_points=points,
    )


def sample_texture(texture: torch.Tensor, grid: torch.Tensor, padding: str) -> torch.Tensor:
    """`texture [1, C, th, tw]`, `grid [N, P, 2]` -> `[N, C, P]`."""
    n = grid.shape[0]
    out = F.grid_sample(
        texture.expand(n, -1, -1, -1), grid[:, None], mode="bilinear", padding_mode=padding, align_corners=False
    )
    return out[:, :, 0]


def render(texture: torch.Tensor, sky: torch.Tensor, lookup: Lookup) -> torch.Tensor:
    """Blend the sky and ground layers of one texture: `[N, C, P]`."""
    # Above the picture: its top mirrored, fading into the sky colour before the mirror could reach the ground.
    far = sample_texture(texture, lookup.sky_grid, "reflection")
    beyond = lookup.sky_beyond[:, None]
    far = far * (1 - beyond) + sky[:, :, 0] * beyond
    near = sample_texture(texture, lookup.ground_grid, "reflection")
    weight = lookup.ground_weight[:, None]
    return far * (1 - weight) + near * weight


LANES = 64
"""Elements per latent row in the band layout are padded to a multiple of this (more than any CPU vector width)."""


def band_layout(grid: torch.Tensor, height: int, start: int, stop: int) -> torch.Tensor:
    """`[C, height * R]` (R elements per latent row, row-major) -> rows `[start, stop)` as `[C, (stop-start) * L]`,
    each row padded (by repeating its last element) to L, the next multiple of `LANES`.

    Why: torch computes transcendental functions (atan2, tan, cos) with vector instructions over whole vectors and
    with the scalar C library over the tail of a loop, and the two can differ in the last bit. In this layout every
    element of every band sits in a whole vector at the same offset as in the unsharded run, so the sharded
    denoiser computes each pixel exactly as the unsharded one does.
    """
    channels, per_row = grid.shape[0], grid.shape[1] // height
    padded = -(-per_row // LANES) * LANES
    rows = grid.reshape(channels, height, per_row)[:, start:stop]
    rows = torch.cat([rows, rows[:, :, -1:].expand(-1, -1, padded - per_row)], dim=2)
    return rows.reshape(channels, -1).contiguous()


def from_band_layout(values: torch.Tensor, rows: int, per_row: int) -> torch.Tensor:
    """`[N, C, rows * L]` in the band layout -> `[N, C, rows * per_row]` without the padding."""
    n, channels = values.shape[0], values.shape[1]
    return values.reshape(n, channels, rows, -1)[:, :, :, :per_row].reshape(n, channels, rows * per_row)


def rotate(rotations: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
    """`rotations [N, 3, 3]` applied to `vectors [3, P]` or `[N, 3, P]` -> `[N, 3, P]`.

    Written out element by element rather than as a matmul: a BLAS kernel may sum differently for a different number
    of columns, and the sharded denoiser must compute each column exactly as the unsharded one does.
    """
    vectors = vectors if vectors.ndim == 3 else vectors[None]
    r = rotations[:, :, :, None]
    return r[:, :, 0] * vectors[:, 0:1] + r[:, :, 1] * vectors[:, 1:2] + r[:, :, 2] * vectors[:, 2:3]


def project(points_cam: torch.Tensor, aspect: float) -> torch.Tensor:
    """Camera-frame points `[N, 3, P]` -> normalised image coordinates `[N, 2, P]`."""
    tan_half = math.tan(HALF_FOV)
    depth = points_cam[:, 2].clamp_min(1e-3)
    return torch.stack([points_cam[:, 0] / depth / tan_half, points_cam[:, 1] / depth / (tan_half * aspect)], 1)


def rows_of(height: int, rank: int, world_size: int) -> tuple[int, int]:
    """The band `[start, stop)` of `height` latent rows that `rank` of `world_size` computes (the last may be short,
    or empty when there are more ranks than rows)."""
    per_rank = -(-height // world_size)
    return min(height, rank * per_rank), min(height, (rank + 1) * per_rank)
