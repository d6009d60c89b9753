"""The real model's camera input from the shared contract: `plucker_map(CameraChunk)`, the 6-channel Plücker map per
latent frame, pixel-unshuffled 8x8. The map's layout is checked against the reference serving code's own builder
(telefuser's `build_camera_control_chunk`, loaded by path) on the same relative poses and intrinsics; before the seam
carried the contract, the same checks held for the adapter from our old `[24, cs, h, w]` tensor (whose output the
new path equals to 1.2e-7, one float32 ulp, at 64x32 and 416x240: the commit that moved it says how that was run)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from pipeline.lingbot.camera import (
    CameraController,
    PinholeIntrinsics,
    map_rays,
    plucker_map,
    relative_poses,
    rotation_matrix,
)
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.controls import ControlSnapshot

CONFIG = LingBotSessionConfig(width=64, height=32, frame_num=4 * 9 - 3)


def maps(keys: list[str], chunks: int) -> list[torch.Tensor]:
    """The real model's camera input for `chunks` chunks with `keys` held, as `LingBotFastDenoiser` builds it."""
    camera = CameraController(CONFIG.pose_steps(), CONFIG.camera_intrinsics())
    rays = map_rays(CONFIG.camera_intrinsics())
    return [
        plucker_map(camera.chunk_control(ControlSnapshot.from_keys(index, keys), index, 3).camera, rays)
        for index in range(chunks)
    ]


def frame_map(unshuffled: torch.Tensor, frame: int) -> torch.Tensor:
    """`[1, 384, F, h, w]` -> the 6-channel pixel map `[6, H, W]` of latent frame `frame`."""
    return torch.nn.functional.pixel_shuffle(unshuffled[0, :, frame], 8)


def camera_rays() -> torch.Tensor:
    """The session's unit camera rays at pixel resolution `[3, H, W]`."""
    return PinholeIntrinsics.from_fov(CONFIG.width, CONFIG.height).camera_rays(torch.float64).float()


def test_a_still_camera_has_zero_origins_and_the_camera_rays() -> None:
    rays = camera_rays()
    for out in maps([], 2):
        assert out.shape == (1, 384, 3, 4, 8)
        for frame in range(3):
            pixel = frame_map(out, frame)
            assert float(pixel[:3].abs().max()) == 0.0
            assert torch.allclose(pixel[3:], rays, atol=1e-6)


def test_walking_at_full_speed_is_a_unit_step_forward_and_the_first_latent_frame_is_the_identity() -> None:
    first, second = maps(["w"], 2)
    assert float(frame_map(first, 0)[:3].abs().max()) == 0.0  # the session's first latent frame: identity
    for out, frames in ((first, (1, 2)), (second, (0, 1, 2))):  # carried across the chunk boundary
        for frame in frames:
            origin = frame_map(out, frame)[:3, 0, 0]
            assert torch.allclose(origin, torch.tensor([0.0, 0.0, 1.0]), atol=1e-6), (frame, origin)


def test_turning_is_the_relative_rotation_of_one_latent_frame() -> None:
    step = math.radians(CONFIG.yaw_step_deg) * 4
    expected_rotation = rotation_matrix(step, 0.0)
    out = maps(["l"], 1)[0]
    rays = camera_rays().double().reshape(3, -1)
    turned = (expected_rotation @ rays).reshape(3, CONFIG.height, CONFIG.width).float()
    assert torch.allclose(frame_map(out, 2)[3:], turned, atol=1e-5)
    assert torch.allclose(frame_map(out, 0)[3:], camera_rays(), atol=1e-6)


def oracle_control() -> ModuleType:
    pytest.importorskip("einops", reason="the oracle's control module needs einops (dev extra)")
    oracle = pytest.importorskip("telefuser", reason="the oracle is absent: scripts/setup.sh --dev installs telefuser")
    name = "_telefuser_lingbot_control"
    if name in sys.modules:
        return sys.modules[name]
    path = Path(oracle.__file__).parent / "pipelines" / "lingbot_world_fast" / "control.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_the_map_layout_equals_the_reference_builder() -> None:
    control = oracle_control()
    ours = maps(["w", "l", "i"], 2)[1]
    # The same relative poses, rebuilt from the integrator's poses by hand.
    camera = CameraController(CONFIG.pose_steps(), CONFIG.camera_intrinsics())
    chunks = [camera.chunk_control(ControlSnapshot.from_keys(i, ["w", "l", "i"]), i, 3) for i in range(2)]
    absolute = []
    for chunk in chunks:
        for latent in range(3):
            pose = chunk.poses[4 * latent + 3]
            matrix = torch.eye(4, dtype=torch.float64)
            matrix[:3, :3] = rotation_matrix(pose.yaw, pose.pitch)
            matrix[:3, 3] = torch.tensor(pose.position, dtype=torch.float64)
            absolute.append(matrix)
    poses = torch.stack(absolute)
    relative = relative_poses(poses[2], poses[3:6])
    relative[:, :3, 3] /= 4 * CONFIG.move_step
    intrinsics = PinholeIntrinsics.from_fov(CONFIG.width, CONFIG.height)
    ks = torch.tensor([[intrinsics.fx, intrinsics.fy, intrinsics.cx, intrinsics.cy]] * 3, dtype=torch.float32)
    expected = control.build_camera_control_chunk(
        relative.float(), ks, CONFIG.latent_height, CONFIG.latent_width, CONFIG.height, CONFIG.width
    ).control_tensor
    assert expected.shape == ours.shape
    assert torch.allclose(ours, expected, atol=1e-5)
