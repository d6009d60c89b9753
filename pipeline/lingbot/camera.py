"""Camera maths and the camera contract: poses, the per-frame pose integrator, pinhole rays, and what the model seam
carries per chunk (`CameraChunk`) with the one builder of the real model's Plücker map (`plucker_map`).

Conventions (OpenCV style, right-handed, used for both world and camera frames):

    x right    y down    z forward          "up" is -y

`CameraPose(x, y, z, yaw, pitch)` places a camera at `(x, y, z)`; positive `yaw` turns right (the forward axis
swings towards +x), positive `pitch` looks up. Camera-to-world rotation `R = R_yaw(yaw) @ R_pitch(pitch)`, so the
forward axis is `(sin(yaw) cos(pitch), -sin(pitch), cos(yaw) cos(pitch))`. Moving (w/s, a/d) happens in the ground
plane along the heading (pitch does not make you fly) and never changes `y`. The world frame is the session's
reference camera (the first frame of the stream).

One pose pipeline: controls -> poses -> per-latent-frame relative poses. `PoseIntegrator` steps the held keys one
video frame at a time; `CameraController` takes each chunk's poses and builds its `CameraChunk`, which is
LingBot-World-Fast's camera contract in its defining data (the research note; the reference serving code's
`build_camera_control_chunk`):

- one camera-to-world pose per **latent** frame: the pose of its last video frame (the reference samples the video's
  poses at latent frame k = video frame 4k, the last frame latent frame k covers);
- framewise relative: latent frame k gets `inverse(P[k-1]) @ P[k]`; `P[-1]` is the chunk's `start`, the pose the
  chunk moved from (the previous chunk's last latent frame, so a chunk's first latent frame sees the motion since the
  previous chunk, as in the offline contract the model was trained with; the start pose after `reset_pose`, so a
  reset is an ordinary step from there, not a jump; for chunk 0, its first latent frame, the reference frame: the
  identity);
- translation divided by `translation_scale`: the largest step our controls make in one latent frame (4 x
  `move_step`), so walking at full speed is 1 and standing still 0 (the reference divides by the clip's largest
  step, which a live session cannot know ahead);
- the pinhole intrinsics at pixel resolution (90 degree horizontal field of view, pixel centres at +0.5).

Both models read the same `CameraChunk`. LingBot-World-Fast builds its `[1, 384, cs, h, w]` input from it with
`plucker_map` (origins then unit directions per latent frame at pixel resolution, pixel-unshuffled 8x8); the
reference model chains `start` and the relative poses back into world cameras (`video_frame_cameras`) and renders
from those. The dense map is not the seam's type: the reference model does not need it and building it costs more
than the reference model's whole camera step (docs/lingbot-fast.md, "The camera contract").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pipeline.lingbot.chunks import SPATIAL_COMPRESSION, TEMPORAL_COMPRESSION
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.errors import ChunkContractError, ControlError, ModelInputError

__all__ = [
    "DEFAULT_HFOV_DEG",
    "PLUCKER_CHANNELS",
    "PLUCKER_MAP_CHANNELS",
    "CameraChunk",
    "CameraController",
    "CameraPose",
    "ChunkControl",
    "PinholeIntrinsics",
    "PoseIntegrator",
    "PoseSteps",
    "camera_chunk",
    "map_rays",
    "plucker_map",
    "pose_matrix",
    "relative_poses",
    "rotation_matrix",
    "translation_scale",
]

DEFAULT_HFOV_DEG = 90.0
PLUCKER_CHANNELS = 6
"""Channels of one latent frame's Plücker map at pixel resolution (ray origin, ray direction)."""
PLUCKER_MAP_CHANNELS = PLUCKER_CHANNELS * SPATIAL_COMPRESSION * SPATIAL_COMPRESSION
"""Channels of `plucker_map` per latent pixel: the 6 channels pixel-unshuffled 8x8 (384)."""


@dataclass(frozen=True, slots=True)
class CameraPose:
    """A camera centre in world units and its heading in radians (yaw right-positive, pitch up-positive)."""

    x: float = 0.0
    y: float = 0.0
    z: float = 0.0
    yaw: float = 0.0
    pitch: float = 0.0

    def __post_init__(self) -> None:
        for name in ("x", "y", "z", "yaw", "pitch"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise ControlError(f"camera pose {name} must be a finite number, got {value!r}")

    @property
    def position(self) -> tuple[float, float, float]:
        return (self.x, self.y, self.z)


def rotation_matrix(yaw: float, pitch: float) -> torch.Tensor:
    """Camera-to-world rotation `R_yaw(yaw) @ R_pitch(pitch)` as a float64 `[3, 3]` tensor (columns: x, y, z axes)."""
    cy, sy = math.cos(yaw), math.sin(yaw)
    cp, sp = math.cos(pitch), math.sin(pitch)
    r_yaw = torch.tensor([[cy, 0.0, sy], [0.0, 1.0, 0.0], [-sy, 0.0, cy]], dtype=torch.float64)
    r_pitch = torch.tensor([[1.0, 0.0, 0.0], [0.0, cp, -sp], [0.0, sp, cp]], dtype=torch.float64)
    return r_yaw @ r_pitch


@dataclass(frozen=True, slots=True)
class PoseSteps:
    """How far one video frame of a held key moves the camera."""

    move: float
    """World units per video frame for w/s/a/d."""
    yaw: float
    """Radians per video frame for j/l."""
    pitch: float
    """Radians per video frame for i/k."""
    pitch_limit: float
    """Pitch is clamped to [-pitch_limit, +pitch_limit] radians (< pi/2, so the camera never flips)."""

    def __post_init__(self) -> None:
        for name in ("move", "yaw", "pitch", "pitch_limit"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise ControlError(f"pose step {name} must be a finite number >= 0, got {value!r}")
        if self.pitch_limit >= math.pi / 2:
            raise ControlError(f"pitch_limit must be < pi/2 radians, got {self.pitch_limit}")


class PoseIntegrator:
    """Integrates held keys into a camera pose, one video frame at a time; the pose persists until `reset_pose()`.

    Per step, rotation is applied first (yaw, then pitch clamped to the limit), then the move along the new heading.
    Not thread-safe: one session's control path owns it.
    """

    def __init__(self, steps: PoseSteps, initial: CameraPose | None = None) -> None:
        start = initial if initial is not None else CameraPose()
        if abs(start.pitch) > steps.pitch_limit:
            raise ControlError(f"initial pitch {start.pitch} exceeds the pitch limit {steps.pitch_limit}")
        self._steps = steps
        self._initial = start
        self._pose = start

    @property
    def pose(self) -> CameraPose:
        return self._pose

    @property
    def steps(self) -> PoseSteps:
        return self._steps

    def reset_pose(self) -> None:
        """Return to the initial pose (the reference camera)."""
        self._pose = self._initial

    def place(self, pose: CameraPose) -> None:
        """Stand at `pose` (a re-seeded session's pose, `continuity.ResumePoint`); `reset_pose` still returns to the
        initial pose."""
        if abs(pose.pitch) > self._steps.pitch_limit:
            raise ControlError(f"pitch {pose.pitch} exceeds the pitch limit {self._steps.pitch_limit}")
        self._pose = pose

    def step(self, snapshot: ControlSnapshot) -> CameraPose:
        """Advance one video frame with the keys of `snapshot` held; returns the new pose."""
        axes = snapshot.axes
        s = self._steps
        p = self._pose
        yaw = _wrap_angle(p.yaw + axes.yaw * s.yaw)
        pitch = min(s.pitch_limit, max(-s.pitch_limit, p.pitch + axes.pitch * s.pitch))
        sin_yaw, cos_yaw = math.sin(yaw), math.cos(yaw)
        dx = s.move * (axes.forward * sin_yaw + axes.strafe * cos_yaw)
        dz = s.move * (axes.forward * cos_yaw - axes.strafe * sin_yaw)
        self._pose = CameraPose(x=p.x + dx, y=p.y, z=p.z + dz, yaw=yaw, pitch=pitch)
        return self._pose

    def advance(self, snapshot: ControlSnapshot, frames: int) -> tuple[CameraPose, ...]:
        """Advance `frames` video frames; returns the pose after each step."""
        if frames < 0:
            raise ControlError(f"frames must be >= 0, got {frames}")
        return tuple(self.step(snapshot) for _ in range(frames))

    def chunk_poses(
        self, snapshot: ControlSnapshot, *, first_chunk: bool, latent_frames: int
    ) -> tuple[CameraPose, ...]:
        """The `4 * latent_frames` per-slot poses of one chunk (see the module docstring for the layout).

        For the first chunk, the first latent frame is the reference frame: the current pose, unmoved, repeated 4
        times; every other latent frame integrates 4 steps.
        """
        if latent_frames < 1:
            raise ChunkContractError(f"a chunk has >= 1 latent frame, got {latent_frames}")
        poses: list[CameraPose] = []
        remaining = latent_frames
        if first_chunk:
            poses.extend([self._pose] * TEMPORAL_COMPRESSION)
            remaining -= 1
        poses.extend(self.advance(snapshot, TEMPORAL_COMPRESSION * remaining))
        return tuple(poses)


def _wrap_angle(angle: float) -> float:
    """Map to (-pi, pi] so a long session's yaw does not grow without bound."""
    wrapped = math.remainder(angle, 2 * math.pi)
    return math.pi if wrapped == -math.pi else wrapped


@dataclass(frozen=True, slots=True)
class PinholeIntrinsics:
    """A pinhole camera on a `width x height` pixel grid (pixel centres at +0.5, principal point at the centre)."""

    width: int
    height: int
    fx: float
    fy: float
    cx: float
    cy: float

    def __post_init__(self) -> None:
        if self.width < 1 or self.height < 1:
            raise ControlError(f"intrinsics grid must be at least 1x1, got {self.width}x{self.height}")
        if not (self.fx > 0 and self.fy > 0 and math.isfinite(self.fx) and math.isfinite(self.fy)):
            raise ControlError(f"focal lengths must be finite and > 0, got fx={self.fx}, fy={self.fy}")

    @classmethod
    def from_fov(cls, width: int, height: int, hfov_deg: float = DEFAULT_HFOV_DEG) -> PinholeIntrinsics:
        """Square pixels and a horizontal field of view of `hfov_deg` degrees across `width` pixels."""
        if not 1.0 <= hfov_deg <= 170.0:
            raise ControlError(f"hfov_deg must be in [1, 170], got {hfov_deg}")
        focal = (width / 2) / math.tan(math.radians(hfov_deg) / 2)
        return cls(width=width, height=height, fx=focal, fy=focal, cx=width / 2, cy=height / 2)

    def camera_rays(self, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> torch.Tensor:
        """Unit ray directions in the camera frame, `[3, height, width]`."""
        u = (torch.arange(self.width, dtype=dtype, device=device) + 0.5 - self.cx) / self.fx
        v = (torch.arange(self.height, dtype=dtype, device=device) + 0.5 - self.cy) / self.fy
        vv, uu = torch.meshgrid(v, u, indexing="ij")
        rays = torch.stack([uu, vv, torch.ones_like(uu)])
        norms: torch.Tensor = torch.linalg.vector_norm(rays, dim=0, keepdim=True)
        return rays / norms


def pose_matrix(pose: CameraPose) -> torch.Tensor:
    """The camera-to-world matrix of `pose`, float64 `[4, 4]`."""
    matrix = torch.eye(4, dtype=torch.float64)
    matrix[:3, :3] = rotation_matrix(pose.yaw, pose.pitch)
    matrix[:3, 3] = torch.tensor(pose.position, dtype=torch.float64)
    return matrix


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


def translation_scale(steps: PoseSteps) -> float:
    """The contract's translation unit: the longest step the controls make in one latent frame (4 x `move`), or 1.0
    for a session that cannot move (its translations are all 0)."""
    return TEMPORAL_COMPRESSION * steps.move if steps.move > 0 else 1.0


@dataclass(frozen=True, slots=True, eq=False)
class CameraChunk:
    """The camera of one chunk at the model seam: LingBot-World-Fast's camera contract (module docstring).

    Validated on construction (`ModelInputError`); `check()` re-validates (the seam calls it: tensors are mutable).
    """

    start: torch.Tensor
    """`[4, 4]` float64 camera-to-world, in the session's world frame: the pose the chunk's first latent frame moved
    from (the previous chunk's last latent frame; the start pose after `reset_pose`; chunk 0's reference frame)."""
    relative: torch.Tensor
    """`[cs, 4, 4]` float64: latent frame k relative to latent frame k-1 (`inverse(P[k-1]) @ P[k]`, `P[-1] = start`),
    translation divided by `translation_scale`. What the real model reads."""
    translation_scale: float
    """World units per unit of `relative` translation (`translation_scale(steps)`), > 0."""
    intrinsics: PinholeIntrinsics
    """The camera at pixel resolution (the session's width x height, `DEFAULT_HFOV_DEG`)."""

    def __post_init__(self) -> None:
        self.check()

    @property
    def chunk_size(self) -> int:
        return int(self.relative.shape[0])

    def check(self) -> None:
        """Raise `ModelInputError` unless the fields hold a chunk's camera (shapes, float64, finite, rigid poses)."""
        scale = self.translation_scale
        if not isinstance(scale, int | float) or isinstance(scale, bool) or not math.isfinite(scale) or scale <= 0:
            raise ModelInputError(f"camera translation_scale must be a finite number > 0, got {scale!r}")
        if tuple(self.start.shape) != (4, 4) or self.relative.ndim != 3 or tuple(self.relative.shape[1:]) != (4, 4):
            raise ModelInputError(
                f"camera start must be [4, 4] and relative [cs, 4, 4], got {list(self.start.shape)} and "
                f"{list(self.relative.shape)}"
            )
        if self.relative.shape[0] < 1:
            raise ModelInputError("camera relative poses need at least one latent frame")
        if self.start.dtype != torch.float64 or self.relative.dtype != torch.float64:
            raise ModelInputError(f"camera poses must be float64, got {self.start.dtype} and {self.relative.dtype}")
        poses = torch.cat([self.start[None], self.relative])
        if not bool(torch.isfinite(poses).all()):
            raise ModelInputError("camera control holds non-finite values")
        bottom = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64, device=poses.device)
        rotations = poses[:, :3, :3]
        eye = torch.eye(3, dtype=torch.float64, device=poses.device)
        if (
            not bool((poses[:, 3] == bottom).all())
            or bool(((rotations @ rotations.transpose(1, 2) - eye).abs() > 1e-6).any())
            or bool(((torch.linalg.det(rotations) - 1).abs() > 1e-6).any())
        ):
            raise ModelInputError("camera poses must be rigid: a rotation, a translation and a [0, 0, 0, 1] row")

    def world_poses(self) -> torch.Tensor:
        """Each latent frame's camera-to-world pose `[cs, 4, 4]` float64: `start` chained with the un-normalised
        relative poses."""
        steps = self.relative.clone()
        steps[:, :3, 3] *= self.translation_scale
        poses = []
        pose = self.start
        for step in steps:
            pose = pose @ step
            poses.append(pose)
        return torch.stack(poses)

    def video_frame_cameras(self, slots: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Cameras of video frames inside each latent frame: `(rotations [cs, n, 3, 3], centres [cs, n, 3])` float64.

        Slot s (0..3, oldest first) of latent frame k sits `(s + 1) / 4` of the way along its step from latent frame
        k-1 (`start` for the first): the relative rotation raised to that power (the geodesic) and the translation
        scaled by it. Slot 3 is the latent frame's own pose. Exact for one held key (a turn about one axis, a straight
        walk); a combined turn and walk follows the chord where the controls follow an arc.
        """
        if not slots or any(slot not in range(TEMPORAL_COMPRESSION) for slot in slots):
            raise ModelInputError(f"video frame slots must be in 0..{TEMPORAL_COMPRESSION - 1}, got {list(slots)}")
        world = self.world_poses()
        previous = torch.cat([self.start[None], world[:-1]])  # [cs, 4, 4]
        fractions = torch.tensor([(slot + 1) / TEMPORAL_COMPRESSION for slot in slots], dtype=torch.float64)
        fractions = fractions.to(world.device)
        partial = _rotation_power(self.relative[:, :3, :3], fractions)  # [cs, n, 3, 3]
        rotations = previous[:, None, :3, :3] @ partial
        steps = world[:, :3, 3] - previous[:, :3, 3]  # [cs, 3]
        centres = previous[:, None, :3, 3] + fractions[None, :, None] * steps[:, None]
        return rotations, centres


def camera_chunk(
    start: CameraPose, poses: Sequence[CameraPose], intrinsics: PinholeIntrinsics, scale: float
) -> CameraChunk:
    """The `CameraChunk` of latent frames ending at `poses` (one per latent frame: its last video frame's pose),
    moving from `start`."""
    if not poses:
        raise ChunkContractError("a chunk has >= 1 latent frame, got no poses")
    previous = pose_matrix(start)
    absolute = torch.stack([pose_matrix(pose) for pose in poses])
    relative = relative_poses(previous, absolute)
    relative[:, :3, 3] /= scale
    return CameraChunk(start=previous, relative=relative, translation_scale=scale, intrinsics=intrinsics)


def _rotation_power(rotations: torch.Tensor, fractions: torch.Tensor) -> torch.Tensor:
    """`rotations [n, 3, 3]` raised to each of `fractions [m]` (the same axis, the angle times the fraction):
    `[n, m, 3, 3]`. Through unit quaternions, robust for any angle up to 180 degrees."""
    quaternion = _quaternion(rotations)  # [n, 4] (w, x, y, z), w >= 0
    vector = quaternion[:, 1:]
    sine = torch.linalg.vector_norm(vector, dim=1, keepdim=True)  # sin(angle / 2)
    axis = torch.where(sine > 0, vector / sine.clamp_min(1e-300), torch.zeros_like(vector))
    half = torch.atan2(sine[:, 0], quaternion[:, 0])  # angle / 2 in [0, pi / 2]
    scaled = half[:, None] * fractions[None]  # [n, m]
    powered = torch.cat([torch.cos(scaled)[..., None], torch.sin(scaled)[..., None] * axis[:, None]], dim=2)
    return _quaternion_matrix(powered)


def _quaternion(rotations: torch.Tensor) -> torch.Tensor:
    """Rotation matrices `[n, 3, 3]` -> unit quaternions `[n, 4]` (w, x, y, z) with w >= 0 (Shepperd: each row from
    the largest of the four candidate denominators, so no division is ill-conditioned)."""
    r = rotations
    r00, r11, r22 = r[:, 0, 0], r[:, 1, 1], r[:, 2, 2]
    candidates = torch.stack(
        [
            torch.stack(
                [1 + r00 + r11 + r22, r[:, 2, 1] - r[:, 1, 2], r[:, 0, 2] - r[:, 2, 0], r[:, 1, 0] - r[:, 0, 1]], 1
            ),
            torch.stack(
                [r[:, 2, 1] - r[:, 1, 2], 1 + r00 - r11 - r22, r[:, 0, 1] + r[:, 1, 0], r[:, 0, 2] + r[:, 2, 0]], 1
            ),
            torch.stack(
                [r[:, 0, 2] - r[:, 2, 0], r[:, 0, 1] + r[:, 1, 0], 1 - r00 + r11 - r22, r[:, 1, 2] + r[:, 2, 1]], 1
            ),
            torch.stack(
                [r[:, 1, 0] - r[:, 0, 1], r[:, 0, 2] + r[:, 2, 0], r[:, 1, 2] + r[:, 2, 1], 1 - r00 - r11 + r22], 1
            ),
        ],
        dim=1,
    )  # [n, 4 candidates, 4]; candidate i is 4 q_i q, its own component i being 4 q_i^2
    best = torch.diagonal(candidates, dim1=1, dim2=2).argmax(dim=1)
    chosen = candidates[torch.arange(r.shape[0], device=r.device), best]
    quaternion = chosen / torch.linalg.vector_norm(chosen, dim=1, keepdim=True)
    return torch.where(quaternion[:, :1] < 0, -quaternion, quaternion)


def _quaternion_matrix(quaternion: torch.Tensor) -> torch.Tensor:
    """Unit quaternions `[..., 4]` (w, x, y, z) -> rotation matrices `[..., 3, 3]`."""
    w, x, y, z = quaternion.unbind(-1)
    rows = [
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ]
    return torch.stack([torch.stack(row, dim=-1) for row in rows], dim=-2)


def map_rays(intrinsics: PinholeIntrinsics, device: torch.device | str = "cpu") -> torch.Tensor:
    """The unit camera rays of `intrinsics`, pixel-unshuffled 8x8 as `plucker_map` lays them out: float32
    `[3, 64 * h * w]` (`h, w` = the grid / 8). A session computes them once and hands them to every `plucker_map`."""
    if intrinsics.width % SPATIAL_COMPRESSION or intrinsics.height % SPATIAL_COMPRESSION:
        raise ModelInputError(
            f"the Plücker map needs a grid divisible by {SPATIAL_COMPRESSION}, "
            f"got {intrinsics.width}x{intrinsics.height}"
        )
    rays = intrinsics.camera_rays(torch.float64, device)  # [3, H, W]
    return F.pixel_unshuffle(rays[None], SPATIAL_COMPRESSION)[0].reshape(3, -1).to(torch.float32)


def plucker_map(camera: CameraChunk, rays: torch.Tensor | None = None) -> torch.Tensor:
    """The real model's camera input `[1, 384, cs, h, w]` float32, on the device of `rays` (`map_rays` of
    `camera.intrinsics`; computed here when None, on the CPU).

    Per latent frame the 6-channel Plücker map at pixel resolution, ray origins (the relative translation, the same
    at every pixel) then unit ray directions (the relative rotation applied to the camera rays), pixel-unshuffled 8x8
    in `F.pixel_unshuffle`'s order (channel, then row, then column inside the block). Unshuffling commutes with the
    rotation, so the directions are one matmul per latent frame on the unshuffled rays, and the origins a broadcast.
    """
    intrinsics = camera.intrinsics
    if rays is None:
        rays = map_rays(intrinsics)
    h, w = intrinsics.height // SPATIAL_COMPRESSION, intrinsics.width // SPATIAL_COMPRESSION
    block = SPATIAL_COMPRESSION * SPATIAL_COMPRESSION
    if tuple(rays.shape) != (3, block * h * w):
        raise ModelInputError(f"Plücker map rays must be [3, {block * h * w}], got {list(rays.shape)}")
    relative = camera.relative.to(rays.device, torch.float32)
    size = relative.shape[0]
    half = 3 * block
    out = torch.empty(2 * half, size, h, w, dtype=torch.float32, device=rays.device)
    origins = relative[:, :3, 3].repeat_interleave(block, dim=1)  # [cs, 192]
    out[:half] = origins.T[:, :, None, None]
    directions = (relative[:, :3, :3] @ rays).reshape(size, half, h, w)  # [cs, 192, h, w]
    out[half:] = directions.transpose(0, 1)
    return out[None]


@dataclass(frozen=True, slots=True, eq=False)
class ChunkControl:
    """The control of one chunk: the snapshot it was built from, its per-slot poses and its camera contract."""

    chunk_index: int
    snapshot: ControlSnapshot
    poses: tuple[CameraPose, ...]
    """`4 * chunk_size` poses, slot order: the 4 video frames of each latent frame, oldest first (chunk 0's first latent
    frame is the reference frame, its pose repeated)."""
    camera: CameraChunk
    """What the model seam carries (`ChunkDenoiser.denoise_chunk`'s `control`)."""


class CameraController:
    """One session's camera: integrates control snapshots chunk by chunk into the chunks' `CameraChunk`s.

    Chunks must be requested in order 0, 1, 2, ...; chunk 0 starts with the unmoved reference frame. `reset_pose()`
    takes effect from the next chunk, whose first latent frame then moves from the start pose. Not thread-safe: the
    session's control path owns it.
    """

    def __init__(self, steps: PoseSteps, intrinsics: PinholeIntrinsics, initial: CameraPose | None = None) -> None:
        self._integrator = PoseIntegrator(steps, initial)
        self._intrinsics = intrinsics
        self._scale = translation_scale(steps)
        self._next_chunk = 0

    @property
    def pose(self) -> CameraPose:
        return self._integrator.pose

    @property
    def next_chunk_index(self) -> int:
        return self._next_chunk

    @property
    def intrinsics(self) -> PinholeIntrinsics:
        return self._intrinsics

    def reset_pose(self) -> None:
        self._integrator.reset_pose()

    def resume_at(self, pose: CameraPose, chunk_index: int) -> None:
        """Go on from `pose` at chunk `chunk_index` (a re-seeded session: `continuity.ResumePoint`)."""
        if chunk_index < 0:
            raise ChunkContractError(f"chunk index must be >= 0, got {chunk_index}")
        self._integrator.place(pose)
        self._next_chunk = chunk_index

    def chunk_control(self, snapshot: ControlSnapshot, chunk_index: int, chunk_size: int) -> ChunkControl:
        """Integrate chunk `chunk_index` with `snapshot` held throughout and build its camera contract."""
        if chunk_index != self._next_chunk:
            raise ChunkContractError(f"camera control for chunk {chunk_index} requested, expected {self._next_chunk}")
        start = self._integrator.pose
        poses = self._integrator.chunk_poses(snapshot, first_chunk=chunk_index == 0, latent_frames=chunk_size)
        self._next_chunk += 1
        ends = poses[TEMPORAL_COMPRESSION - 1 :: TEMPORAL_COMPRESSION]  # each latent frame's last video frame
        return ChunkControl(
            chunk_index=chunk_index,
            snapshot=snapshot,
            poses=poses,
            camera=camera_chunk(start, ends, self._intrinsics, self._scale),
        )
