"""The camera contract of the real model, built from our controls: one 6-channel Plücker map per latent frame at
pixel resolution, pixel-unshuffled 8x8 onto 384 channels.

Our seam carries the camera as `[24, cs, h, w]` (`camera.py`: the world-space Plücker map of each of the 4 video
frames a latent frame covers, at latent resolution). LingBot-World-Fast was trained on something else (the research
note; the reference serving code's `build_camera_control_chunk`):

- one camera-to-world pose per **latent** frame: the pose of its last video frame (the reference samples the video's
  poses at latent frame k = video frame 4k, which is the last frame latent frame k covers);
- made relative frame to frame ("framewise"): latent frame k gets `inverse(P[k-1]) @ P[k]`, the session's very first
  latent frame the identity. The previous pose is carried across chunks, so a chunk's first latent frame still sees
  the motion since the previous chunk (the offline contract the model was trained with; the reference's streaming
  path restarts at the identity every chunk and loses that step);
- translation normalised: the reference divides by the largest step of the clip, which a live session cannot know
  ahead; here it is divided by the largest step our controls can make in one latent frame (4 x `move_step`), so
  walking at full speed is 1, as in a clip of steady walking, and standing still is 0;
- the Plücker map at pixel resolution with the session's pinhole intrinsics (90 degree horizontal field of view,
  pixel centres at +0.5): ray origins (the relative translation) then unit ray directions (the relative rotation
  applied to the camera rays), OpenCV axes (x right, y down, z forward) like ours;
- pixel-unshuffled 8x8: channel-major, then the row, then the column inside the block (`F.pixel_unshuffle`), giving
  `[1, 384, cs, h, w]`, the DiT's `control` input.

The poses are read back from our tensor with `camera.recover_cameras` (exact to ~1e-12 for the poses our controls
make). One adapter per session: it keeps the previous latent frame's pose.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.lingbot.camera import DEFAULT_HFOV_DEG, PLUCKER_CHANNELS, PinholeIntrinsics, recover_cameras
from pipeline.lingbot.chunks import TEMPORAL_COMPRESSION
from pipeline.lingbot.config import SPATIAL_COMPRESSION, LingBotSessionConfig

__all__ = ["PluckerAdapter", "relative_poses"]


def relative_poses(previous: torch.Tensor, poses: torch.Tensor) -> torch.Tensor:
    """Framewise relative poses `[n, 4, 4]`: entry k is `inverse(P[k-1]) @ P[k]` with `P[-1] = previous` (all float64,
    camera-to-world 4x4)."""
    chain = torch.cat([previous[None], poses])
    rotations, translations = chain[:, :3, :3], chain[:, :3, 3]
    inverse_rotations = rotations[:-1].transpose(1, 2)
    relative = torch.zeros_like(poses)
    relative[:, :3, :3] = inverse_rotations @ rotations[1:]
    relative[:, :3, 3] = (inverse_rotations @ (translations[1:] - translations[:-1])[:, :, None])[:, :, 0]
    relative[:, 3, 3] = 1.0
    return relative


class PluckerAdapter:
    """Turns one session's `[24, cs, h, w]` controls into the DiT's `[1, 384, cs, h, w]` (module docstring)."""

    def __init__(self, config: LingBotSessionConfig) -> None:
        self._latent_intrinsics = config.latent_intrinsics()
        self._pixel_intrinsics = PinholeIntrinsics.from_fov(config.width, config.height, DEFAULT_HFOV_DEG)
        self._rays: torch.Tensor | None = None
        self._scale = TEMPORAL_COMPRESSION * config.move_step
        self._previous: torch.Tensor | None = None

    def __call__(self, control: torch.Tensor) -> torch.Tensor:
        rotations, centres = recover_cameras(control, self._latent_intrinsics)
        last = TEMPORAL_COMPRESSION - 1
        poses = torch.zeros(control.shape[1], 4, 4, dtype=torch.float64, device=control.device)
        poses[:, :3, :3] = rotations[:, last]
        poses[:, :3, 3] = centres[:, last]
        poses[:, 3, 3] = 1.0
        previous = poses[0] if self._previous is None else self._previous.to(control.device)
        relative = relative_poses(previous, poses)
        self._previous = poses[-1].clone()
        if self._scale > 0:
            relative[:, :3, 3] /= self._scale
        return self._unshuffled_map(relative)

    def _unshuffled_map(self, relative: torch.Tensor) -> torch.Tensor:
        intrinsics = self._pixel_intrinsics
        if self._rays is None or self._rays.device != relative.device:
            self._rays = intrinsics.camera_rays(torch.float64, relative.device).reshape(3, -1)
        directions = relative[:, :3, :3] @ self._rays  # [n, 3, H*W]
        origins = relative[:, :3, 3:4].expand_as(directions)
        maps = torch.cat([origins, directions], dim=1).to(torch.float32)
        maps = maps.reshape(relative.shape[0], PLUCKER_CHANNELS, intrinsics.height, intrinsics.width)
        unshuffled = F.pixel_unshuffle(maps, SPATIAL_COMPRESSION)  # [n, 384, h, w]
        return unshuffled.permute(1, 0, 2, 3)[None].contiguous()
