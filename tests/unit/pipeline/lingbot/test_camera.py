from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.lingbot import (
    CameraController,
    CameraPose,
    ChunkContractError,
    ControlError,
    ControlSnapshot,
    ModelInputError,
    PinholeIntrinsics,
    PoseIntegrator,
    PoseSteps,
    chunk_plucker,
    plucker_rays,
    recover_cameras,
    rotation_matrix,
)

STEPS = PoseSteps(move=0.1, yaw=math.radians(2), pitch=math.radians(1.5), pitch_limit=math.radians(85))
INTRINSICS = PinholeIntrinsics.from_fov(16, 8)


def keys(*held: str, seq: int = 0) -> ControlSnapshot:
    return ControlSnapshot.from_keys(seq, held)


def centre_direction(pose: CameraPose) -> torch.Tensor:
    rotation = rotation_matrix(pose.yaw, pose.pitch)
    return rotation @ torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)


def test_rotation_is_proper_and_turns_right_for_positive_yaw() -> None:
    rotation = rotation_matrix(0.3, -0.2)
    assert torch.allclose(rotation @ rotation.T, torch.eye(3, dtype=torch.float64), atol=1e-12)
    assert torch.linalg.det(rotation).item() == pytest.approx(1.0)
    forward = centre_direction(CameraPose(yaw=math.radians(90)))
    assert torch.allclose(forward, torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64), atol=1e-12)  # +x is right


def test_positive_pitch_looks_up() -> None:
    forward = centre_direction(CameraPose(pitch=math.radians(30)))
    assert forward[1].item() == pytest.approx(-0.5)  # y points down, so up is negative y


def test_w_walks_along_the_heading_and_d_strafes_right() -> None:
    integrator = PoseIntegrator(STEPS)
    pose = integrator.step(keys("w"))
    assert (pose.x, pose.z) == pytest.approx((0.0, 0.1))
    integrator = PoseIntegrator(STEPS, CameraPose(yaw=math.radians(90)))
    pose = integrator.step(keys("w"))
    assert (pose.x, pose.z) == pytest.approx((0.1, 0.0), abs=1e-12)
    integrator = PoseIntegrator(STEPS)
    pose = integrator.step(keys("d"))
    assert (pose.x, pose.y, pose.z) == pytest.approx((0.1, 0.0, 0.0))


def test_looking_up_does_not_make_you_fly() -> None:
    integrator = PoseIntegrator(STEPS, CameraPose(pitch=math.radians(60)))
    pose = integrator.step(keys("w"))
    assert pose.y == 0.0
    assert pose.z == pytest.approx(0.1)


def test_pitch_is_clamped_at_the_limit() -> None:
    integrator = PoseIntegrator(STEPS)
    poses = integrator.advance(keys("i"), 200)
    assert poses[-1].pitch == pytest.approx(math.radians(85))
    assert max(p.pitch for p in poses) <= math.radians(85)
    poses = integrator.advance(keys("k"), 400)
    assert poses[-1].pitch == pytest.approx(-math.radians(85))


def test_yaw_wraps_instead_of_growing() -> None:
    integrator = PoseIntegrator(STEPS)
    integrator.advance(keys("l"), 1000)  # 2000 degrees
    assert -math.pi < integrator.pose.yaw <= math.pi
    assert integrator.pose.yaw == pytest.approx(math.radians(2000 - 6 * 360))


def test_pose_persists_across_chunks_and_resets() -> None:
    integrator = PoseIntegrator(STEPS)
    first = integrator.chunk_poses(keys("w", "l"), first_chunk=True, latent_frames=3)
    assert len(first) == 12
    assert first[0] == first[1] == first[2] == first[3] == CameraPose()  # the reference frame, repeated
    assert first[4] != CameraPose()
    second = integrator.chunk_poses(keys("w", "l"), first_chunk=False, latent_frames=3)
    assert second[0].yaw == pytest.approx(first[-1].yaw + STEPS.yaw)
    assert second[-1].yaw == pytest.approx(20 * STEPS.yaw)  # 8 + 12 steps
    integrator.reset_pose()
    assert integrator.pose == CameraPose()


def test_initial_pitch_beyond_the_limit_is_rejected() -> None:
    with pytest.raises(ControlError, match="pitch limit"):
        PoseIntegrator(STEPS, CameraPose(pitch=1.5))


def test_pose_steps_reject_a_pitch_limit_that_flips_the_camera() -> None:
    with pytest.raises(ControlError, match="pi/2"):
        PoseSteps(move=0.1, yaw=0.1, pitch=0.1, pitch_limit=math.pi / 2)


def test_plucker_directions_are_unit_and_moments_orthogonal() -> None:
    poses = [CameraPose(x=1.0, y=-0.5, z=3.0, yaw=0.4, pitch=-0.3), CameraPose(x=-7.0, z=2.0, yaw=-2.0, pitch=0.8)]
    maps = plucker_rays(poses, INTRINSICS).to(torch.float64)
    assert maps.shape == (2, 6, 8, 16)
    directions, moments = maps[:, :3], maps[:, 3:]
    assert torch.allclose(torch.linalg.vector_norm(directions, dim=1), torch.ones(2, 8, 16, dtype=torch.float64))
    assert (directions * moments).sum(dim=1).abs().max().item() < 1e-5
    centre = torch.tensor(poses[0].position, dtype=torch.float64)[:, None, None].expand(3, 8, 16)
    expected = torch.linalg.cross(centre, directions[0], dim=0)
    assert torch.allclose(moments[0], expected, atol=1e-5)


def test_yaw_rotates_rays_about_the_up_axis_to_the_right() -> None:
    still = plucker_rays([CameraPose()], INTRINSICS)[0, :3].to(torch.float64)
    turned = plucker_rays([CameraPose(yaw=0.5)], INTRINSICS)[0, :3].to(torch.float64)
    assert torch.allclose(turned[1], still[1], atol=1e-6)  # the up/down component is untouched
    # In the ground plane every ray turned by +0.5 rad towards +x (right), i.e. clockwise seen from above.
    still_angle = torch.atan2(still[0], still[2])
    turned_angle = torch.atan2(turned[0], turned[2])
    assert torch.allclose(turned_angle - still_angle, torch.full_like(still_angle, 0.5), atol=1e-5)


def test_pinhole_rays_span_the_field_of_view() -> None:
    rays = INTRINSICS.camera_rays()
    # 90 degrees across 16 pixels: the outermost pixel centres sit at +-(7.5/8) of tan(45 degrees).
    assert (rays[0, 0, -1] / rays[2, 0, -1]).item() == pytest.approx(7.5 / 8)
    assert (rays[1, 0, 0] / rays[2, 0, 0]).item() == pytest.approx(-3.5 / 8)


def test_chunk_plucker_layout_stacks_four_video_frames_per_latent_frame() -> None:
    integrator = PoseIntegrator(STEPS)
    poses = integrator.chunk_poses(keys("w", "l", "i"), first_chunk=True, latent_frames=3)
    control = chunk_plucker(poses, INTRINSICS)
    assert control.shape == (24, 3, 8, 16)
    assert control.dtype == torch.float32
    maps = plucker_rays(poses, INTRINSICS)
    for latent in range(3):
        for slot in range(4):
            channels = control[6 * slot : 6 * slot + 6, latent]
            assert torch.equal(channels, maps[4 * latent + slot])
    assert torch.equal(control[0:6, 0], control[18:24, 0])  # chunk 0's first latent frame is one frame, repeated


def test_chunk_plucker_needs_four_poses_per_latent_frame() -> None:
    with pytest.raises(ChunkContractError):
        chunk_plucker([CameraPose()] * 3, INTRINSICS)


@settings(max_examples=25, deadline=None)
@given(
    x=st.floats(-500, 500),
    z=st.floats(-500, 500),
    yaw=st.floats(-math.pi, math.pi),
    pitch=st.floats(-1.48, 1.48),
)
def test_cameras_are_recovered_from_the_control_tensor(x: float, z: float, yaw: float, pitch: float) -> None:
    pose = CameraPose(x=x, y=0.0, z=z, yaw=yaw, pitch=pitch)
    control = chunk_plucker([pose] * 4, INTRINSICS)
    rotations, centres = recover_cameras(control, INTRINSICS)
    assert torch.allclose(rotations[0, 0], rotation_matrix(yaw, pitch), atol=1e-5)
    tolerance = 1e-6 * max(1.0, abs(x), abs(z)) * 100
    assert torch.allclose(centres[0, 0], torch.tensor([x, 0.0, z], dtype=torch.float64), atol=tolerance)


def test_recover_rejects_non_unit_directions_and_bad_shapes() -> None:
    control = chunk_plucker([CameraPose()] * 4, INTRINSICS)
    with pytest.raises(ModelInputError, match="unit"):
        recover_cameras(control * 2, INTRINSICS)
    with pytest.raises(ModelInputError, match=r"\[24, L, 8, 16\]"):
        recover_cameras(control[:, :, :4], INTRINSICS)
    with pytest.raises(ModelInputError, match="non-finite"):
        recover_cameras(control * float("nan"), INTRINSICS)


def test_camera_controller_builds_chunks_in_order_and_reports_the_snapshot() -> None:
    controller = CameraController(STEPS, INTRINSICS)
    snapshot = keys("l", seq=7)
    control = controller.chunk_control(snapshot, 0, 3)
    assert control.snapshot is snapshot
    assert control.plucker.shape == (24, 3, 8, 16)
    assert controller.next_chunk_index == 1
    with pytest.raises(ChunkContractError, match="expected 1"):
        controller.chunk_control(snapshot, 2, 3)
    controller.reset_pose()
    assert controller.pose == CameraPose()
    after_reset = controller.chunk_control(keys(), 1, 3)
    assert all(pose == CameraPose() for pose in after_reset.poses)
