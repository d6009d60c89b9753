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
from pipeline.lingbot.continuity import ResumePoint
from pipeline.lingbot.errors import ModelInputError
from pipeline.lingbot.policy.prompts import PromptCache, PromptCacheStatistics
from pipeline.lingbot.reference.geometry import (
    band_layout,
    from_band_layout,
    grid_rays,
    look_up,
    project,
    render,
    rotate,
    rows_of,
)
from pipeline.lingbot.reference.looks import PromptLook, look_of
from pipeline.lingbot.reference.picture import (
    LUMA_COLS,
    LUMA_ROWS,
    default_scene,
    pack_luma,
    rgb_to_ycbcr,
    unpack_luma,
    ycbcr_to_rgb,
)
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

_LUMA = slice(0, LUMA_ROWS * LUMA_COLS)
_CHROMA = slice(12, 14)
_FLOW = slice(14, 16)
_CONTENT = slice(0, 14)
_SIGMAS = (1.0, 0.3, 0.09, 0.03, 0.01)
_WORK_WIDTH = 64
_WORK_UNITS_PER_SCALE = 3
_SCENE_CACHE_SIZE = 4


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
            luma, chroma = rgb_to_ycbcr(rgb)
            h, w = config.latent_height, config.latent_width
            luma_fine = F.adaptive_avg_pool2d(luma, (h * LUMA_ROWS, w * LUMA_COLS))
            latent = torch.zeros(LATENT_CHANNELS, 1, h, w, device=self._device)
            latent[_LUMA, 0] = pack_luma(luma_fine * 2 - 1)[0]
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
        luma = unpack_luma(reference[:, _LUMA])
        chroma = reference[:, _CHROMA]
        top_rows = max(1, luma.shape[2] // 8)
        start, stop = rows_of(h, self._rank, self._world_size)
        fine_rays, _ = grid_rays(h * LUMA_ROWS, w * LUMA_COLS, aspect, self._device)
        coarse_rays, coarse_points = grid_rays(h, w, aspect, self._device)
        state = _DenoiserSession(
            config=config,
            plan=config.chunk_plan,
            base_latent=base,
            rows=(start, stop),
            luma_texture=luma,
            chroma_texture=chroma,
            luma_sky=luma[:, :, :top_rows].mean(dim=(2, 3), keepdim=True),
            chroma_sky=chroma[:, :, : max(1, h // 8)].mean(dim=(2, 3), keepdim=True),
            fine_rays=band_layout(fine_rays, h, start, stop),
            coarse_rays=band_layout(coarse_rays, h, start, stop),
            coarse_points=band_layout(coarse_points, h, start, stop),
        )
        self._sessions.add(session_id, state)

    def reseed_cache(
        self, session_id: str, config: LingBotSessionConfig, base_latent: torch.Tensor, resume: ResumePoint
    ) -> None:
        """`ReseedableDenoiser`: the session goes on at `resume.chunk_index`. Nothing else to rebuild: a chunk's latent
        depends only on its camera, prompt, the seed and its index (`_chunk_seed`), so the frames after a re-seed are
        those an uninterrupted session would have made."""
        self.create_cache(session_id, config, base_latent)
        state = self._sessions.get(session_id)
        check_chunk_order("denoise", state.plan, resume.chunk_index, state.plan.chunk_size, resume.chunk_index)
        state.next_chunk = resume.chunk_index

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

        fine = look_up(rotate(key_r, state.fine_rays), key_o, aspect)
        luma = render(state.luma_texture, state.luma_sky, fine)
        luma = from_band_layout(luma, h, LUMA_ROWS * w * LUMA_COLS).reshape(cs, 1, h * LUMA_ROWS, w * LUMA_COLS)
        coarse = look_up(rotate(key_r, state.coarse_rays), key_o, aspect)
        chroma = from_band_layout(render(state.chroma_texture, state.chroma_sky, coarse), h, w).reshape(cs, 2, h, w)

        # Motion: where each coarse pixel of slot 0 lands in the key frame (sky at infinity, ground at its point).
        first = rotate(rotations[:, 0], state.coarse_rays)
        first_look = look_up(first, centres[:, 0], aspect)
        to_key = key_r.transpose(1, 2)
        sky_at_key = project(rotate(to_key, first), aspect)
        ground_at_key = project(rotate(to_key, first_look.ground_points - key_o[:, :, None]), aspect)
        weight = first_look.ground_weight[:, None]
        landed = sky_at_key * (1 - weight) + ground_at_key * weight
        flow = from_band_layout((landed - state.coarse_points[None]).clamp(-1, 1), h, w).reshape(cs, 2, h, w)

        latent = torch.cat([pack_luma(luma), chroma, flow], dim=1)  # [cs, 16, h, w]
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

    def reseed_cache(
        self, session_id: str, config: LingBotSessionConfig, chunk_index: int, prime: torch.Tensor | None = None
    ) -> None:
        """`ReseedableDecoder`: the next chunk is `chunk_index` (each latent frame decodes on its own: no history, so
        `prime` is not needed)."""
        self.create_cache(session_id, config)
        state = self._sessions.get(session_id)
        check_chunk_order("decode", state.plan, chunk_index, state.plan.chunk_size, chunk_index)
        state.next_chunk = chunk_index

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
            luma = F.interpolate(unpack_luma(frames[:, _LUMA]), size=size, mode="bicubic", align_corners=False)
            chroma = F.interpolate(frames[:, _CHROMA] / 2, size=size, mode="bilinear", align_corners=False)
            keys = ycbcr_to_rgb((luma + 1) / 2, chroma)  # [n, 3, H, W]
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
