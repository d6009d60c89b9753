"""Camera maths: poses, the per-frame pose integrator, pinhole rays and the Plücker-ray control tensor.

Conventions (OpenCV style, right-handed, used for both world and camera frames):

    x right    y down    z forward          "up" is -y

`CameraPose(x, y, z, yaw, pitch)` places a camera at `(x, y, z)`; positive `yaw` turns right (the forward axis
swings towards +x), positive `pitch` looks up. Camera-to-world rotation `R = R_yaw(yaw) @ R_pitch(pitch)`, so the
forward axis is `(sin(yaw) cos(pitch), -sin(pitch), cos(yaw) cos(pitch))`. Moving (w/s, a/d) happens in the ground
plane along the heading (pitch does not make you fly) and never changes `y`.

The Plücker control tensor of a chunk of `L` latent frames has shape `[24, L, h, w]` (float32), with `h, w` the
latent grid (`H/8, W/8`). Every video frame contributes a 6-channel Plücker map, the world-space unit ray direction
`d` of each latent pixel (pinhole intrinsics on the latent grid, pixel centres at +0.5) and its moment `m = o x d`
(`o` the camera centre). The 4 video frames that one latent frame covers are stacked on channels:

    channel 6*k + c   = component c of video frame k (k = 0..3, oldest first) of that latent frame
    c = 0, 1, 2       = d_x, d_y, d_z
    c = 3, 4, 5       = m_x, m_y, m_z

The first latent frame of chunk 0 covers a single video frame (the reference frame, at the session's start pose):
its one pose is repeated 4 times to fill the slots. Poses are in the session's world frame, whose origin is the
reference camera, i.e. relative to the first frame of the stream.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pipeline.lingbot.chunks import TEMPORAL_COMPRESSION
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.errors import ChunkContractError, ControlError, ModelInputError

__all__ = [
    "DEFAULT_HFOV_DEG",
    "PLUCKER_CHANNELS",
    "CameraController",
    "CameraPose",
    "ChunkControl",
    "PinholeIntrinsics",
    "PoseIntegrator",
    "PoseSteps",
    "chunk_plucker",
    "plucker_rays",
    "recover_cameras",
    "rotation_matrix",
]

DEFAULT_HFOV_DEG = 90.0
PLUCKER_CHANNELS = 6
"""Channels of one video frame's Plücker map (direction, moment)."""


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


def plucker_rays(poses: Sequence[CameraPose], intrinsics: PinholeIntrinsics) -> torch.Tensor:
    """Per-pose Plücker maps `[N, 6, h, w]` float32: world ray directions (unit) then moments `o x d`."""
    if not poses:
        raise ControlError("plucker_rays needs at least one pose")
    rays = intrinsics.camera_rays(torch.float64).reshape(3, -1)
    rotations = torch.stack([rotation_matrix(p.yaw, p.pitch) for p in poses])
    centres = torch.tensor([p.position for p in poses], dtype=torch.float64)
    directions = rotations @ rays  # [N, 3, h*w]
    moments = torch.linalg.cross(centres[:, :, None].expand_as(directions), directions, dim=1)
    maps = torch.cat([directions, moments], dim=1)
    return maps.reshape(len(poses), PLUCKER_CHANNELS, intrinsics.height, intrinsics.width).to(torch.float32)


def chunk_plucker(poses: Sequence[CameraPose], intrinsics: PinholeIntrinsics) -> torch.Tensor:
    """A chunk's control tensor `[24, L, h, w]` from its `4 * L` per-slot poses (layout: module docstring)."""
    if len(poses) == 0 or len(poses) % TEMPORAL_COMPRESSION != 0:
        raise ChunkContractError(f"a chunk needs 4 poses per latent frame, got {len(poses)}")
    latent = len(poses) // TEMPORAL_COMPRESSION
    maps = plucker_rays(poses, intrinsics)  # [4L, 6, h, w]
    stacked = maps.reshape(latent, TEMPORAL_COMPRESSION * PLUCKER_CHANNELS, intrinsics.height, intrinsics.width)
    return stacked.permute(1, 0, 2, 3).contiguous()


def recover_cameras(control: torch.Tensor, intrinsics: PinholeIntrinsics) -> tuple[torch.Tensor, torch.Tensor]:
    """Read the cameras back out of a control tensor: `(rotations [L, 4, 3, 3], centres [L, 4, 3])`, float64.

    The rotation of each video frame is the least-squares (Kabsch) fit of its direction channels against the
    intrinsics' camera rays; the centre `o` solves `sum(I - d d^T) o = sum(d x m)` over the frame's rays (each moment
    `m = o x d` pins `o` to its ray's line).
    """
    expected = (TEMPORAL_COMPRESSION * PLUCKER_CHANNELS, intrinsics.height, intrinsics.width)
    if control.ndim != 4 or (control.shape[0], control.shape[2], control.shape[3]) != expected:
        raise ModelInputError(
            f"control tensor must be [24, L, {intrinsics.height}, {intrinsics.width}], got {list(control.shape)}"
        )
    if not bool(torch.isfinite(control).all()):
        raise ModelInputError("control tensor holds non-finite values")
    latent = control.shape[1]
    frames = control.to(torch.float64).permute(1, 0, 2, 3).reshape(latent * TEMPORAL_COMPRESSION, PLUCKER_CHANNELS, -1)
    directions, moments = frames[:, :3], frames[:, 3:]
    norms = torch.linalg.vector_norm(directions, dim=1)
    if bool(((norms - 1.0).abs() > 1e-3).any()):
        raise ModelInputError("control tensor direction channels are not unit vectors")
    rays = intrinsics.camera_rays(torch.float64, control.device).reshape(3, -1)
    # Kabsch: rotation R minimising sum |R a - d|^2, from the SVD of H = sum a d^T.
    cov = rays[None] @ directions.transpose(1, 2)  # [N, 3, 3]
    u, _, vh = torch.linalg.svd(cov)
    v = vh.transpose(1, 2)
    sign = torch.sign(torch.linalg.det(v @ u.transpose(1, 2)))
    fix = torch.diag_embed(torch.stack([torch.ones_like(sign), torch.ones_like(sign), sign], dim=1))
    rotations = v @ fix @ u.transpose(1, 2)
    count = directions.shape[2]
    eye = torch.eye(3, dtype=torch.float64, device=control.device)
    normal = count * eye - directions @ directions.transpose(1, 2)
    rhs = torch.linalg.cross(directions, moments, dim=1).sum(dim=2)
    centres = torch.linalg.solve(normal, rhs)
    return (
        rotations.reshape(latent, TEMPORAL_COMPRESSION, 3, 3),
        centres.reshape(latent, TEMPORAL_COMPRESSION, 3),
    )


@dataclass(frozen=True, slots=True, eq=False)
class ChunkControl:
    """The control of one chunk: the snapshot it was built from, its per-slot poses and its Plücker tensor."""

    chunk_index: int
    snapshot: ControlSnapshot
    poses: tuple[CameraPose, ...]
    """`4 * chunk_size` poses, slot order (see the module docstring)."""
    plucker: torch.Tensor
    """`[24, chunk_size, h, w]` float32 on the CPU."""


class CameraController:
    """One session's camera: integrates control snapshots chunk by chunk into Plücker control tensors.

    Chunks must be requested in order 0, 1, 2, ...; chunk 0 starts with the unmoved reference frame. `reset_pose()`
    takes effect from the next chunk. Not thread-safe: the session's control path owns it.
    """

    def __init__(self, steps: PoseSteps, intrinsics: PinholeIntrinsics, initial: CameraPose | None = None) -> None:
        self._integrator = PoseIntegrator(steps, initial)
        self._intrinsics = intrinsics
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

    def chunk_control(self, snapshot: ControlSnapshot, chunk_index: int, chunk_size: int) -> ChunkControl:
        """Integrate chunk `chunk_index` with `snapshot` held throughout and build its control tensor."""
        if chunk_index != self._next_chunk:
            raise ChunkContractError(f"camera control for chunk {chunk_index} requested, expected {self._next_chunk}")
        poses = self._integrator.chunk_poses(snapshot, first_chunk=chunk_index == 0, latent_frames=chunk_size)
        self._next_chunk += 1
        return ChunkControl(
            chunk_index=chunk_index,
            snapshot=snapshot,
            poses=poses,
            plucker=chunk_plucker(poses, self._intrinsics),
        )
