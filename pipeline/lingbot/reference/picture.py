"""The picture side of the reference model: colour, the packing of luma into latent channels, the built-in scene.

BT.601 colour transforms, the 3x4 luma sub-grid of each 8x8 block packed onto 12 latent channels (the latent layout
is drawn in `pipeline.lingbot.reference.model`'s docstring), and the procedural landscape used when a session has no
reference image, seen from the reference camera (`CAMERA_HEIGHT` above the ground, a 90 degree field of view).
"""

from __future__ import annotations

import math

import torch

from pipeline.lingbot.errors import ModelInputError

__all__ = [
    "CAMERA_HEIGHT",
    "LUMA_COLS",
    "LUMA_ROWS",
    "default_scene",
    "pack_luma",
    "rgb_to_ycbcr",
    "unpack_luma",
    "ycbcr_to_rgb",
]

LUMA_ROWS, LUMA_COLS = 3, 4
"""The luma sub-grid of each 8x8 block that the latent keeps (rows, columns)."""
CAMERA_HEIGHT = 1.0
"""How far above the ground plane the reference camera stands."""


def rgb_to_ycbcr(rgb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`[..., 3, H, W]` in [0, 1] -> luma `[..., 1, H, W]` in [0, 1], chroma `[..., 2, H, W]` in about [-0.5, 0.5]."""
    r, g, b = rgb.unbind(-3)
    y = 0.299 * r + 0.587 * g + 0.114 * b
    return y.unsqueeze(-3), torch.stack([0.564 * (b - y), 0.713 * (r - y)], dim=-3)


def ycbcr_to_rgb(luma: torch.Tensor, chroma: torch.Tensor) -> torch.Tensor:
    y = luma.squeeze(-3)
    cb, cr = chroma.unbind(-3)
    return torch.stack([y + 1.403 * cr, y - 0.344 * cb - 0.714 * cr, y + 1.773 * cb], dim=-3)


def pack_luma(luma: torch.Tensor) -> torch.Tensor:
    """`[N, 1, 3h, 4w]` -> `[N, 12, h, w]` (sub-grid position row-major on channels)."""
    n, _, fine_h, fine_w = luma.shape
    h, w = fine_h // LUMA_ROWS, fine_w // LUMA_COLS
    blocks = luma.reshape(n, h, LUMA_ROWS, w, LUMA_COLS).permute(0, 2, 4, 1, 3)
    return blocks.reshape(n, LUMA_ROWS * LUMA_COLS, h, w)


def unpack_luma(packed: torch.Tensor) -> torch.Tensor:
    """`[N, 12, h, w]` -> `[N, 1, 3h, 4w]`."""
    n, _, h, w = packed.shape
    blocks = packed.reshape(n, LUMA_ROWS, LUMA_COLS, h, w).permute(0, 3, 1, 4, 2)
    return blocks.reshape(n, 1, h * LUMA_ROWS, w * LUMA_COLS)


def default_scene(width: int, height: int) -> torch.Tensor:
    """The built-in reference image: a procedural landscape, float32 `[3, height, width]` in [0, 1].

    Sky with clouds, a mountain range on the horizon and a checkered meadow in perspective, all seen from the
    reference camera (1 unit above the ground, 90 degree horizontal field of view), so its ground is real ground.
    """
    if width < 2 or height < 2:
        raise ModelInputError(f"scene size must be at least 2x2, got {width}x{height}")
    half_w = width / 2
    xs = (torch.arange(width, dtype=torch.float32) + 0.5 - half_w) / half_w  # x / f
    ys = (torch.arange(height, dtype=torch.float32) + 0.5 - height / 2) / half_w  # y / f (down positive)
    y, x = torch.meshgrid(ys, xs, indexing="ij")
    lon = torch.atan(x)
    elevation = -y / torch.sqrt(1 + x * x)  # tan of the angle above the horizon

    # Sky: a vertical gradient with soft, deterministic clouds.
    t = (elevation * 2.2).clamp(0, 1)
    horizon_blue = torch.tensor([0.78, 0.87, 0.96]).view(3, 1, 1)
    zenith_blue = torch.tensor([0.22, 0.42, 0.82]).view(3, 1, 1)
    sky = horizon_blue * (1 - t) + zenith_blue * t
    cloud_field = (
        torch.sin(7.0 * lon + 3.1 * elevation * 6 + 0.4)
        + 0.7 * torch.sin(13.0 * lon - 2.3 * elevation * 9 + 1.7)
        + 0.5 * torch.sin(23.0 * lon + 17.0 * elevation + 4.2)
    )
    clouds = ((cloud_field - 0.6) / 1.2).clamp(0, 1) * (elevation * 6).clamp(0, 1)
    sky = sky * (1 - 0.8 * clouds) + 0.97 * 0.8 * clouds

    # Mountains: a ridge line in elevation, shaded by slope, with snow on the high parts.
    ridge = (
        0.1
        + 0.05 * torch.sin(5.0 * lon + 1.0)
        + 0.03 * torch.sin(11.0 * lon + 2.5)
        + 0.012 * torch.sin(27.0 * lon + 0.3)
    )
    slope = 0.25 * torch.cos(5.0 * lon + 1.0) + 0.33 * torch.cos(11.0 * lon + 2.5) + 0.324 * torch.cos(27.0 * lon + 0.3)
    rock = torch.tensor([0.42, 0.40, 0.50]).view(3, 1, 1) * (1 + 0.3 * torch.tanh(2 * slope))
    snow = ((elevation - 0.12) * 40).clamp(0, 1)
    mountain = rock * (1 - snow) + 0.94 * snow
    is_mountain = ((elevation > 0) & (elevation < ridge)).to(torch.float32)
    upper = sky * (1 - is_mountain) + mountain * is_mountain

    # Ground: a checkered meadow on the plane 1 unit below the camera, fading into haze with distance.
    below = y > 0
    depth = CAMERA_HEIGHT / y.clamp_min(1e-4)
    ground_x, ground_z = x * depth, depth
    pattern = torch.sin(math.pi * ground_x) * torch.sin(math.pi * ground_z)
    check = 0.5 + 0.5 * torch.tanh(4.0 * pattern) * torch.exp(-depth / 14.0)
    dark = torch.tensor([0.20, 0.42, 0.16]).view(3, 1, 1)
    light = torch.tensor([0.52, 0.72, 0.30]).view(3, 1, 1)
    meadow = dark * (1 - check) + light * check
    haze = 1 - torch.exp(-depth / 30.0)
    ground = meadow * (1 - haze) + horizon_blue * 0.9 * haze
    scene = torch.where(below, ground, upper)
    return scene.clamp(0, 1).contiguous()
