"""The reference world model: real torch encode / denoise / decode stages with LingBot's shapes, no weights needed.

It exists so the whole product runs, streams and is tested end to end on a CPU. It has the real model's interfaces
and tensor shapes (16 latent channels, 8x spatial and 4x temporal compression, a 4-step sampler with seeded noise,
Plücker camera control), is deterministic for a seed, and its frames follow the camera geometrically:

- The world is the reference image (or a built-in procedural landscape) seen from a camera standing 1 unit above
  a ground plane, with a 90 degree horizontal field of view. Rays above the horizon, and rays that meet the ground
  far away, look up a panorama at infinity: the reference image mirror-tiled around the full circle (so turning
  never runs out of picture). Rays that meet the ground nearby look up the reference's ground, back-projected onto
  the plane and mirror-tiled so one can walk forever. At the start pose both lookups reproduce the reference exactly.
- So yaw pans the view, pitch tilts it, w/s move the ground towards/away from the viewer (content streams out of,
  or into, the vanishing point: a zoom-like effect below the horizon), a/d strafe with parallax (near ground shifts
  more than far ground, the sky does not shift).

Latent layout (`[16, T, h, w]` float32, `h, w = H/8, W/8`), one latent frame per 4 video frames:

    channels 0..11   luma on a 3x4 sub-grid of each 8x8 block (row-major; luma at (3h, 4w)), scaled to [-1, 1]
    channels 12, 13  chroma Cb, Cr (BT.601) per block, scaled by 2
    channels 14, 15  motion: where a pixel of the latent frame's first video frame is in its key frame (slot 2),
                     as a displacement in normalised image units (x, y); the decoder interpolates it linearly
                     over the 4 video frames (a video codec's motion vectors, in place of a learned temporal decoder)

Stages. Encode: colour transform and area downsampling (plus the procedural scene for `None`). Denoise: reads the
cameras of each latent frame's first and key video frames out of the chunk's `CameraChunk` (the camera contract it
shares with LingBot-World-Fast: per-latent-frame relative poses chained from the chunk's start pose, the video frames
in between interpolated, `CameraChunk.video_frame_cameras`), renders the world into the key frame of every
latent frame, then runs 4 flow-matching Euler steps from seeded noise towards that render; the first-frame mask pins
frame 0 of chunk 0 to the resident reference latent. The chunk's text prompt grades the render before sampling
(`looks.py`: time of day, weather or palette from its words; "" changes nothing), each distinct prompt read once
(`PromptCache`), so a new prompt shows from the chunk it arrives with on. Decode: upsample luma and chroma, then warp
each key frame by its motion channels into its 4 video frames (1 for the first latent frame of chunk 0).

`compute_scale > 1` adds matrix work to every denoising step (the result is discarded, so frames do not change)
to emulate a heavier model: roughly `compute_scale` times the denoise cost. No stage touches torch's thread count.

Sharded denoise (`world_size > 1`, the worked example of the seam's sharding contract in `model.py`): every rank
renders and samples only its own band of latent rows (`rows_of`), the per-pixel work (rendering, sampling, the
emulated network's tokens) splits across the ranks, and an all-gather on the default process group joins the bands
on every rank. The seeded noise is drawn for the whole chunk on every rank and sliced, so the result does not depend
on the world size: 2-rank frames equal 1-rank frames bit for bit (tests/unit/pipeline/lingbot/graph/test_processes.py).
`ReferenceModelFactory` builds the three stages inside worker processes.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pipeline.lingbot.camera import CameraChunk
from pipeline.lingbot.chunks import TEMPORAL_COMPRESSION, ChunkPlan
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.errors import ModelInputError
from pipeline.lingbot.policy.prompts import PromptCache, PromptCacheStatistics
from pipeline.lingbot.reference.looks import PromptLook, look_of
from pipeline.lingbot.seam import (
    LATENT_CHANNELS,
    ModelShard,
    first_frame_mask,
    slice_condition,
    validate_base_latent,
    validate_control,
    validate_latent_chunk,
)
from pipeline.lingbot.stage_sessions import SessionTable, StageStatistics, check_chunk_order

__all__ = [
    "DENOISING_STEPS",
    "KEY_SLOT",
    "ReferenceDiT",
    "ReferenceModelFactory",
    "ReferenceVAEDecoder",
    "ReferenceVAEEncoder",
    "ReferenceWorldModel",
    "default_scene",
    "rows_of",
]

DENOISING_STEPS = 4
KEY_SLOT = 2
"""The video frame (0..3) of each latent frame that the denoiser renders; the others are warped from it."""
_RENDERED_SLOTS = (0, KEY_SLOT)
"""The video frames whose cameras the denoiser reads: the first (the start of the motion channels) and the key."""

_LUMA_ROWS, _LUMA_COLS = 3, 4
_LUMA = slice(0, _LUMA_ROWS * _LUMA_COLS)
_CHROMA = slice(12, 14)
_FLOW = slice(14, 16)
_CONTENT = slice(0, 14)
_SIGMAS = (1.0, 0.3, 0.09, 0.03, 0.01)
_CAMERA_HEIGHT = 1.0
_GROUND_NEAR = 3.0
_GROUND_FAR = 6.0
_WORK_WIDTH = 64
_WORK_UNITS_PER_SCALE = 3
_SCENE_CACHE_SIZE = 4
_HALF_FOV = math.pi / 4  # the 90 degree field of view every stage assumes (tan = 1)


# --- colour and latent packing ---------------------------------------------------------------------------------------


def _rgb_to_ycbcr(rgb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`[..., 3, H, W]` in [0, 1] -> luma `[..., 1, H, W]` in [0, 1], chroma `[..., 2, H, W]` in about [-0.5, 0.5]."""
    r, g, b = rgb.unbind(-3)
    y = 0.299 * r + 0.587 * g + 0.114 * b
    return y.unsqueeze(-3), torch.stack([0.564 * (b - y), 0.713 * (r - y)], dim=-3)


def _ycbcr_to_rgb(luma: torch.Tensor, chroma: torch.Tensor) -> torch.Tensor:
    y = luma.squeeze(-3)
    cb, cr = chroma.unbind(-3)
    return torch.stack([y + 1.403 * cr, y - 0.344 * cb - 0.714 * cr, y + 1.773 * cb], dim=-3)


def _pack_luma(luma: torch.Tensor) -> torch.Tensor:
    """`[N, 1, 3h, 4w]` -> `[N, 12, h, w]` (sub-grid position row-major on channels)."""
    n, _, fine_h, fine_w = luma.shape
    h, w = fine_h // _LUMA_ROWS, fine_w // _LUMA_COLS
    blocks = luma.reshape(n, h, _LUMA_ROWS, w, _LUMA_COLS).permute(0, 2, 4, 1, 3)
    return blocks.reshape(n, _LUMA_ROWS * _LUMA_COLS, h, w)


def _unpack_luma(packed: torch.Tensor) -> torch.Tensor:
    """`[N, 12, h, w]` -> `[N, 1, 3h, 4w]`."""
    n, _, h, w = packed.shape
    blocks = packed.reshape(n, _LUMA_ROWS, _LUMA_COLS, h, w).permute(0, 3, 1, 4, 2)
    return blocks.reshape(n, 1, h * _LUMA_ROWS, w * _LUMA_COLS)


# --- the built-in scene ----------------------------------------------------------------------------------------------


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
    depth = _CAMERA_HEIGHT / y.clamp_min(1e-4)
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


# --- encode ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _EncoderSession:
    config: LingBotSessionConfig


class ReferenceVAEEncoder:
    """Reference `ReferenceEncoder`: colour transform + area downsampling to the 16-channel latent."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self._device = torch.device(device)
        self._sessions: SessionTable[_EncoderSession] = SessionTable("encode")
        self._scenes: dict[tuple[int, int], torch.Tensor] = {}  # default scene per size; bounded, oldest dropped
        self._scenes_lock = threading.Lock()

    def create_cache(self, session_id: str, config: LingBotSessionConfig) -> None:
        self._sessions.add(session_id, _EncoderSession(config))

    def release_cache(self, session_id: str) -> None:
        self._sessions.remove(session_id)

    def statistics(self) -> StageStatistics:
        return self._sessions.statistics()

    def encode_reference(self, session_id: str, image: torch.Tensor | None) -> torch.Tensor:
        """Image float `[3, H, W]` in [0, 1] (or None: `default_scene`) -> base latent `[16, 1, H/8, W/8]` float32."""
        config = self._sessions.get(session_id).config
        started = time.perf_counter()
        if image is None:
            image = self._default_scene(config.width, config.height)
        expected = (3, config.height, config.width)
        if tuple(image.shape) != expected:
            raise ModelInputError(f"reference image must be {list(expected)}, got {list(image.shape)}")
        if not image.is_floating_point() or not bool(torch.isfinite(image).all()):
            raise ModelInputError("reference image must be a finite floating-point tensor in [0, 1]")
        with torch.inference_mode():
            rgb = image.to(self._device, torch.float32).clamp(0, 1).unsqueeze(0)
            luma, chroma = _rgb_to_ycbcr(rgb)
            h, w = config.latent_height, config.latent_width
            luma_fine = F.adaptive_avg_pool2d(luma, (h * _LUMA_ROWS, w * _LUMA_COLS))
            latent = torch.zeros(LATENT_CHANNELS, 1, h, w, device=self._device)
            latent[_LUMA, 0] = _pack_luma(luma_fine * 2 - 1)[0]
            latent[_CHROMA, 0] = F.adaptive_avg_pool2d(chroma, (h, w))[0] * 2
        self._sessions.record(time.perf_counter() - started)
        return latent

    def _default_scene(self, width: int, height: int) -> torch.Tensor:
        with self._scenes_lock:
            scene = self._scenes.get((width, height))
            if scene is None:
                scene = default_scene(width, height)
                self._scenes[(width, height)] = scene
                while len(self._scenes) > _SCENE_CACHE_SIZE:
                    del self._scenes[next(iter(self._scenes))]
            return scene


# --- denoise ---------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _DenoiserSession:
    config: LingBotSessionConfig
    plan: ChunkPlan
    base_latent: torch.Tensor
    rows: tuple[int, int]  # this rank's band of latent rows [start, stop)
    luma_texture: torch.Tensor  # [1, 1, 3h, 4w]
    chroma_texture: torch.Tensor  # [1, 2, h, w]
    luma_sky: torch.Tensor  # [1, 1, 1, 1] colour above the picture
    chroma_sky: torch.Tensor  # [1, 2, 1, 1]
    fine_rays: torch.Tensor  # [3, 3b*4w] camera rays of the fine grid of this rank's band of b rows
    coarse_rays: torch.Tensor  # [3, b*w]
    coarse_points: torch.Tensor  # [2, b*w] normalised image coordinates of the band's coarse grid
    next_chunk: int = 0


def _grid_rays(grid_h: int, grid_w: int, aspect: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit camera rays `[3, P]` and normalised image coordinates `[2, P]` of a grid's pixel centres."""
    xn = (torch.arange(grid_w, dtype=torch.float32, device=device) + 0.5) / grid_w * 2 - 1
    yn = (torch.arange(grid_h, dtype=torch.float32, device=device) + 0.5) / grid_h * 2 - 1
    yy, xx = torch.meshgrid(yn, xn, indexing="ij")
    tan_half = math.tan(_HALF_FOV)
    rays = torch.stack([xx * tan_half, yy * tan_half * aspect, torch.ones_like(xx)]).reshape(3, -1)
    return rays / torch.linalg.vector_norm(rays, dim=0, keepdim=True), torch.stack([xx, yy]).reshape(2, -1)


def _fold(values: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Mirror-tile the real line onto [low, high] (a triangle wave), so tiled textures have no seams."""
    period = 2 * (high - low)
    phase = torch.remainder(values - low, period)
    return low + (period / 2 - (phase - period / 2).abs())


@dataclass(frozen=True, slots=True)
class _Lookup:
    """Where a batch of rays looks in the reference texture: two layers and the ground layer's weight."""

    sky_grid: torch.Tensor  # [N, P, 2] normalised (x, y) into the texture, at infinity
    sky_beyond: torch.Tensor  # [N, P] 0..1: how far above the top of the picture (1 = half a picture or more)
    ground_grid: torch.Tensor  # [N, P, 2]
    ground_weight: torch.Tensor  # [N, P] 0..1
    ground_points: torch.Tensor  # [N, 3, P] world points on the ground


def _look_up(directions: torch.Tensor, centres: torch.Tensor, aspect: float) -> _Lookup:
    """World ray directions `[N, 3, P]` from camera centres `[N, 3]` -> texture coordinates (see module docstring)."""
    tan_half = math.tan(_HALF_FOV)
    dx, dy, dz = directions.unbind(1)
    lon = _fold(torch.atan2(dx, dz), -_HALF_FOV, _HALF_FOV)
    horizontal = torch.sqrt(dx * dx + dz * dz).clamp_min(1e-6)
    sky_x = torch.tan(lon) / tan_half
    sky_y = (dy / horizontal / torch.cos(lon) / (tan_half * aspect)).clamp(-50, 50)
    sky_beyond = (-sky_y - 1).clamp(0, 1)

    # Ground plane y = camera height (y points down); the reference camera sees it from z_near on.
    height_above = (_CAMERA_HEIGHT - centres[:, 1]).clamp_min(1e-3)[:, None]
    down = dy > 1e-4
    distance = torch.where(down, height_above / dy.clamp_min(1e-4), torch.full_like(dy, 1e6))
    points = centres[:, :, None] + directions * distance[:, None, :]
    fade = ((distance - _GROUND_NEAR) / (_GROUND_FAR - _GROUND_NEAR)).clamp(0, 1)
    weight = torch.where(down, 1 - fade * fade * (3 - 2 * fade), torch.zeros_like(dy))
    z_near = _CAMERA_HEIGHT / (tan_half * aspect)
    ground_x = _fold(points[:, 0], -_GROUND_FAR, _GROUND_FAR)
    ground_z = _fold(points[:, 2], z_near, z_near + _GROUND_FAR)
    ground_grid = torch.stack([ground_x / ground_z / tan_half, _CAMERA_HEIGHT / ground_z / (tan_half * aspect)], -1)
    return _Lookup(
        sky_grid=torch.stack([sky_x, sky_y.clamp(-3, 3)], dim=-1),
        sky_beyond=sky_beyond,
        ground_grid=ground_grid,
        ground_weight=weight,
        ground_points=points,
    )


def _sample(texture: torch.Tensor, grid: torch.Tensor, padding: str) -> torch.Tensor:
    """`texture [1, C, th, tw]`, `grid [N, P, 2]` -> `[N, C, P]`."""
    n = grid.shape[0]
    out = F.grid_sample(
        texture.expand(n, -1, -1, -1), grid[:, None], mode="bilinear", padding_mode=padding, align_corners=False
    )
    return out[:, :, 0]


def _render(texture: torch.Tensor, sky: torch.Tensor, lookup: _Lookup) -> torch.Tensor:
    """Blend the sky and ground layers of one texture: `[N, C, P]`."""
    # Above the picture: its top mirrored, fading into the sky colour before the mirror could reach the ground.
    far = _sample(texture, lookup.sky_grid, "reflection")
    beyond = lookup.sky_beyond[:, None]
    far = far * (1 - beyond) + sky[:, :, 0] * beyond
    near = _sample(texture, lookup.ground_grid, "reflection")
    weight = lookup.ground_weight[:, None]
    return far * (1 - weight) + near * weight


_LANES = 64
"""Elements per latent row in the band layout are padded to a multiple of this (more than any CPU vector width)."""


def _band_layout(grid: torch.Tensor, height: int, start: int, stop: int) -> torch.Tensor:
    """`[C, height * R]` (R elements per latent row, row-major) -> rows `[start, stop)` as `[C, (stop-start) * L]`,
    each row padded (by repeating its last element) to L, the next multiple of `_LANES`.

    Why: torch computes transcendental functions (atan2, tan, cos) with vector instructions over whole vectors and
    with the scalar C library over the tail of a loop, and the two can differ in the last bit. In this layout every
    element of every band sits in a whole vector at the same offset as in the unsharded run, so the sharded
    denoiser computes each pixel exactly as the unsharded one does.
    """
    channels, per_row = grid.shape[0], grid.shape[1] // height
    padded = -(-per_row // _LANES) * _LANES
    rows = grid.reshape(channels, height, per_row)[:, start:stop]
    rows = torch.cat([rows, rows[:, :, -1:].expand(-1, -1, padded - per_row)], dim=2)
    return rows.reshape(channels, -1).contiguous()


def _from_band_layout(values: torch.Tensor, rows: int, per_row: int) -> torch.Tensor:
    """`[N, C, rows * L]` in the band layout -> `[N, C, rows * per_row]` without the padding."""
    n, channels = values.shape[0], values.shape[1]
    return values.reshape(n, channels, rows, -1)[:, :, :, :per_row].reshape(n, channels, rows * per_row)


def _rotate(rotations: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
    """`rotations [N, 3, 3]` applied to `vectors [3, P]` or `[N, 3, P]` -> `[N, 3, P]`.

    Written out element by element rather than as a matmul: a BLAS kernel may sum differently for a different number
    of columns, and the sharded denoiser must compute each column exactly as the unsharded one does.
    """
    vectors = vectors if vectors.ndim == 3 else vectors[None]
    r = rotations[:, :, :, None]
    return r[:, :, 0] * vectors[:, 0:1] + r[:, :, 1] * vectors[:, 1:2] + r[:, :, 2] * vectors[:, 2:3]


def _project(points_cam: torch.Tensor, aspect: float) -> torch.Tensor:
    """Camera-frame points `[N, 3, P]` -> normalised image coordinates `[N, 2, P]`."""
    tan_half = math.tan(_HALF_FOV)
    depth = points_cam[:, 2].clamp_min(1e-3)
    return torch.stack([points_cam[:, 0] / depth / tan_half, points_cam[:, 1] / depth / (tan_half * aspect)], 1)


def rows_of(height: int, rank: int, world_size: int) -> tuple[int, int]:
    """The band `[start, stop)` of `height` latent rows that `rank` of `world_size` computes (the last may be short,
    or empty when there are more ranks than rows)."""
    per_rank = -(-height // world_size)
    return min(height, rank * per_rank), min(height, (rank + 1) * per_rank)


class ReferenceDiT:
    """Reference `ChunkDenoiser`: camera-driven rendering of the resident reference, refined in 4 seeded steps.

    With `world_size > 1` it is one rank of a sharded denoiser (module docstring): it computes its band of rows and
    all-gathers the chunk over torch.distributed's default process group, which must be initialised.
    """

    def __init__(self, device: torch.device | str = "cpu", *, rank: int = 0, world_size: int = 1) -> None:
        if not 0 <= rank < world_size:
            raise ModelInputError(f"rank {rank} is outside 0..{world_size - 1}")
        self._rank = rank
        self._world_size = world_size
        self._device = torch.device(device)
        self._sessions: SessionTable[_DenoiserSession] = SessionTable("denoise")
        weights = torch.Generator().manual_seed(0x5EED)
        self._work_in = torch.randn(LATENT_CHANNELS, _WORK_WIDTH, generator=weights).to(self._device) / 4
        self._work = torch.randn(_WORK_WIDTH, _WORK_WIDTH, generator=weights).to(self._device) / _WORK_WIDTH**0.5
        self._looks: PromptCache[PromptLook] = PromptCache()

    @property
    def device(self) -> torch.device:
        return self._device

    def create_cache(self, session_id: str, config: LingBotSessionConfig, base_latent: torch.Tensor) -> None:
        """Keep `base_latent` `[16, T, h, w]` resident for the session and prepare its world textures."""
        validate_base_latent(base_latent, config)
        h, w = config.latent_height, config.latent_width
        aspect = config.height / config.width
        base = base_latent.detach().to(self._device, torch.float32).clone()
        reference = base[:, 0][None]  # the reference frame [1, 16, h, w]
        luma = _unpack_luma(reference[:, _LUMA])
        chroma = reference[:, _CHROMA]
        top_rows = max(1, luma.shape[2] // 8)
        start, stop = rows_of(h, self._rank, self._world_size)
        fine_rays, _ = _grid_rays(h * _LUMA_ROWS, w * _LUMA_COLS, aspect, self._device)
        coarse_rays, coarse_points = _grid_rays(h, w, aspect, self._device)
        state = _DenoiserSession(
            config=config,
            plan=config.chunk_plan,
            base_latent=base,
            rows=(start, stop),
            luma_texture=luma,
            chroma_texture=chroma,
            luma_sky=luma[:, :, :top_rows].mean(dim=(2, 3), keepdim=True),
            chroma_sky=chroma[:, :, : max(1, h // 8)].mean(dim=(2, 3), keepdim=True),
            fine_rays=_band_layout(fine_rays, h, start, stop),
            coarse_rays=_band_layout(coarse_rays, h, start, stop),
            coarse_points=_band_layout(coarse_points, h, start, stop),
        )
        self._sessions.add(session_id, state)

    def release_cache(self, session_id: str) -> None:
        self._sessions.remove(session_id)

    def statistics(self) -> StageStatistics:
        return self._sessions.statistics()

    def prompt_statistics(self) -> PromptCacheStatistics:
        """How often a prompt was read into a look, and how often the cached look was reused."""
        return self._looks.statistics()

    def denoise_chunk(
        self, session_id: str, chunk_index: int, chunk_size: int, control: CameraChunk, *, prompt: str
    ) -> torch.Tensor:
        """The chunk's camera and prompt -> latent chunk `[16, cs, h, w]` float32 on this stage's device."""
        state = self._sessions.get(session_id)
        check_chunk_order("denoise", state.plan, chunk_index, chunk_size, state.next_chunk)
        validate_control(control, state.config, chunk_size)
        look = self._looks.get(prompt, lambda: look_of(prompt))
        started = time.perf_counter()
        start, stop = state.rows
        with torch.inference_mode():
            rotations, centres = control.video_frame_cameras(_RENDERED_SLOTS)
            condition = slice_condition(state.base_latent, chunk_index, chunk_size)[:, :, start:stop]
            if stop > start:
                target = self._render_chunk(
                    state, rotations.to(self._device, torch.float32), centres.to(self._device, torch.float32)
                )
            else:  # more ranks than rows: this rank has no band, but still joins the gather
                target = torch.zeros_like(condition)
            target = look.apply(target)
            mask = first_frame_mask(chunk_index, chunk_size, self._device)
            target = torch.where(mask[None, :, None, None], condition, target)
            latent = self._sample(state, chunk_index, target, mask, condition)
            if self._world_size > 1:
                latent = self._gather(latent, state.config.latent_height)
        state.next_chunk += 1
        self._sessions.record(time.perf_counter() - started)
        return latent

    def _render_chunk(self, state: _DenoiserSession, rotations: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
        """The clean latent of each latent frame: its key frame rendered, plus motion from slot 0 to the key.

        `rotations [cs, 2, 3, 3]`, `centres [cs, 2, 3]`: the cameras of `_RENDERED_SLOTS` (slot 0, the key)."""
        config = state.config
        aspect = config.height / config.width
        h, w = state.rows[1] - state.rows[0], config.latent_width
        cs = rotations.shape[0]
        key_r, key_o = rotations[:, 1], centres[:, 1]

        fine = _look_up(_rotate(key_r, state.fine_rays), key_o, aspect)
        luma = _render(state.luma_texture, state.luma_sky, fine)
        luma = _from_band_layout(luma, h, _LUMA_ROWS * w * _LUMA_COLS).reshape(cs, 1, h * _LUMA_ROWS, w * _LUMA_COLS)
        coarse = _look_up(_rotate(key_r, state.coarse_rays), key_o, aspect)
        chroma = _from_band_layout(_render(state.chroma_texture, state.chroma_sky, coarse), h, w).reshape(cs, 2, h, w)

        # Motion: where each coarse pixel of slot 0 lands in the key frame (sky at infinity, ground at its point).
        first = _rotate(rotations[:, 0], state.coarse_rays)
        first_look = _look_up(first, centres[:, 0], aspect)
        to_key = key_r.transpose(1, 2)
        sky_at_key = _project(_rotate(to_key, first), aspect)
        ground_at_key = _project(_rotate(to_key, first_look.ground_points - key_o[:, :, None]), aspect)
        weight = first_look.ground_weight[:, None]
        landed = sky_at_key * (1 - weight) + ground_at_key * weight
        flow = _from_band_layout((landed - state.coarse_points[None]).clamp(-1, 1), h, w).reshape(cs, 2, h, w)

        latent = torch.cat([_pack_luma(luma), chroma, flow], dim=1)  # [cs, 16, h, w]
        return latent.permute(1, 0, 2, 3).contiguous()

    def _sample(
        self,
        state: _DenoiserSession,
        chunk_index: int,
        target: torch.Tensor,
        mask: torch.Tensor,
        condition: torch.Tensor,
    ) -> torch.Tensor:
        """4 Euler steps of a flow-matching sampler from seeded noise towards the render.

        The reference "network" predicts the clean latent to be the render itself, so after the last step the latent
        is the render plus `_SIGMAS[-1]` of the seeded noise: a faint, seed-dependent grain.
        """
        generator = torch.Generator().manual_seed(_chunk_seed(state.config.seed, chunk_index))
        whole = (target.shape[0], target.shape[1], state.config.latent_height, target.shape[3])
        noise = torch.randn(whole, generator=generator)[:, :, state.rows[0] : state.rows[1]].to(self._device)
        x = noise
        extra_units = round((state.config.compute_scale - 1.0) * _WORK_UNITS_PER_SCALE)
        for sigma, next_sigma in itertools.pairwise(_SIGMAS):
            self._emulated_work(x, extra_units)
            x = x + (next_sigma / sigma - 1.0) * (x - target)
        x[_FLOW] = target[_FLOW]
        return torch.where(mask[None, :, None, None], condition, x).contiguous()

    def _gather(self, band: torch.Tensor, height: int) -> torch.Tensor:
        """All-gather every rank's band of rows `[C, cs, b, w]` into the whole chunk `[C, cs, height, w]`."""
        per_rank = -(-height // self._world_size)
        padded = band.new_zeros(band.shape[0], band.shape[1], per_rank, band.shape[3])
        padded[:, :, : band.shape[2]] = band
        bands = [torch.empty_like(padded) for _ in range(self._world_size)]
        dist.all_gather(bands, padded)
        rows = [rows_of(height, rank, self._world_size) for rank in range(self._world_size)]
        return torch.cat([part[:, :, : stop - start] for part, (start, stop) in zip(bands, rows, strict=True)], 2)

    def _emulated_work(self, x: torch.Tensor, units: int) -> None:
        """Matrix work standing in for a heavier network; its result is deliberately unused."""
        if units <= 0:
            return
        tokens = torch.tanh(x.permute(1, 2, 3, 0).reshape(-1, LATENT_CHANNELS) @ self._work_in)
        for _ in range(units):
            tokens = torch.tanh(tokens @ self._work)


def _chunk_seed(seed: int, chunk_index: int) -> int:
    """A per-chunk seed that depends only on (session seed, chunk index), never on scheduling."""
    return (seed * 0x9E3779B97F4A7C15 + chunk_index * 0xBF58476D1CE4E5B9 + 1) % (2**63)


# --- decode ----------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _DecoderSession:
    config: LingBotSessionConfig
    plan: ChunkPlan
    base_grid: torch.Tensor  # [1, H, W, 2] identity sampling grid
    next_chunk: int = 0


class ReferenceVAEDecoder:
    """Reference `ChunkDecoder`: upsample each latent frame's key frame, then warp it into its video frames."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self._device = torch.device(device)
        self._sessions: SessionTable[_DecoderSession] = SessionTable("decode")

    @property
    def device(self) -> torch.device:
        return self._device

    def create_cache(self, session_id: str, config: LingBotSessionConfig) -> None:
        xs = (torch.arange(config.width, dtype=torch.float32, device=self._device) + 0.5) / config.width * 2 - 1
        ys = (torch.arange(config.height, dtype=torch.float32, device=self._device) + 0.5) / config.height * 2 - 1
        yy, xx = torch.meshgrid(ys, xs, indexing="ij")
        grid = torch.stack([xx, yy], dim=-1)[None]
        self._sessions.add(session_id, _DecoderSession(config=config, plan=config.chunk_plan, base_grid=grid))

    def release_cache(self, session_id: str) -> None:
        self._sessions.remove(session_id)

    def statistics(self) -> StageStatistics:
        return self._sessions.statistics()

    def decode_chunk(self, session_id: str, chunk_index: int, latent: torch.Tensor) -> torch.Tensor:
        """Latent `[16, cs, h, w]` -> uint8 RGB frames `[T, H, W, 3]` on the CPU (T from the chunk contract)."""
        state = self._begin(session_id, chunk_index, latent)
        started = time.perf_counter()
        out = self._decode(state, latent, reference_first=chunk_index == 0)
        state.next_chunk += 1
        self._sessions.record(time.perf_counter() - started)
        return out

    def decode_parts(self, session_id: str, chunk_index: int, latent: torch.Tensor) -> Iterator[torch.Tensor]:
        """`decode_chunk` one latent frame at a time (`ProgressiveDecoder`): the same frames, bit for bit."""
        state = self._begin(session_id, chunk_index, latent)
        busy = 0.0
        for index in range(latent.shape[1]):
            started = time.perf_counter()
            part = self._decode(state, latent[:, index : index + 1], reference_first=chunk_index == 0 and index == 0)
            busy += time.perf_counter() - started
            yield part
        state.next_chunk += 1
        self._sessions.record(busy)

    def _begin(self, session_id: str, chunk_index: int, latent: torch.Tensor) -> _DecoderSession:
        state = self._sessions.get(session_id)
        validate_latent_chunk(latent, state.config, state.plan.chunk_size)
        check_chunk_order("decode", state.plan, chunk_index, state.plan.chunk_size, state.next_chunk)
        return state

    def _decode(self, state: _DecoderSession, latent: torch.Tensor, *, reference_first: bool) -> torch.Tensor:
        """Latent frames `[16, n, h, w]` -> their video frames, each latent frame on its own (so any split of a
        chunk decodes to the same frames); `reference_first`: the first is the session's single reference frame."""
        config = state.config
        with torch.inference_mode():
            frames = latent.to(self._device, torch.float32).permute(1, 0, 2, 3)  # [n, 16, h, w]
            size = (config.height, config.width)
            luma = F.interpolate(_unpack_luma(frames[:, _LUMA]), size=size, mode="bicubic", align_corners=False)
            chroma = F.interpolate(frames[:, _CHROMA] / 2, size=size, mode="bilinear", align_corners=False)
            keys = _ycbcr_to_rgb((luma + 1) / 2, chroma)  # [n, 3, H, W]
            flow = F.interpolate(frames[:, _FLOW], size=size, mode="bilinear", align_corners=False)
            # Slot k of a latent frame shows the key frame displaced by flow * (KEY_SLOT - k) / KEY_SLOT.
            slots = torch.arange(TEMPORAL_COMPRESSION, dtype=torch.float32, device=self._device)
            scale = (KEY_SLOT - slots) / KEY_SLOT  # [4]
            displacement = flow[:, None] * scale[None, :, None, None, None]  # [n, 4, 2, H, W]
            grid = state.base_grid + displacement.reshape(-1, 2, *size).permute(0, 2, 3, 1)
            video = F.grid_sample(
                keys.repeat_interleave(TEMPORAL_COMPRESSION, dim=0),
                grid,
                mode="bilinear",
                padding_mode="border",
                align_corners=False,
            )  # [n*4, 3, H, W]
            if reference_first:  # the first latent frame is the single reference frame
                video = torch.cat([keys[:1], video[TEMPORAL_COMPRESSION:]])
            return (video.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().cpu()


@dataclass(frozen=True, slots=True)
class ReferenceModelFactory:
    """The reference world model as a `WorldModelFactory`: builds each stage inside the worker process that runs it
    (the denoiser as one rank of a sharded DiT when its group has more than one rank)."""

    def encoder(self, shard: ModelShard) -> ReferenceVAEEncoder:
        return ReferenceVAEEncoder(shard.device)

    def denoiser(self, shard: ModelShard) -> ReferenceDiT:
        return ReferenceDiT(shard.device, rank=shard.rank, world_size=shard.world_size)

    def decoder(self, shard: ModelShard) -> ReferenceVAEDecoder:
        return ReferenceVAEDecoder(shard.device)


class ReferenceWorldModel:
    """The three reference stages as one `WorldModel` (each stage can still be handed to its own actor)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self._encoder = ReferenceVAEEncoder(device)
        self._denoiser = ReferenceDiT(device)
        self._decoder = ReferenceVAEDecoder(device)

    @property
    def encoder(self) -> ReferenceVAEEncoder:
        return self._encoder

    @property
    def denoiser(self) -> ReferenceDiT:
        return self._denoiser

    @property
    def decoder(self) -> ReferenceVAEDecoder:
        return self._decoder
