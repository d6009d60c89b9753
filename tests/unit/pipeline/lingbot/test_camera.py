from __future__ import annotations

import math
import pickle
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.lingbot.camera import (
    PLUCKER_MAP_CHANNELS,
    CameraChunk,
    CameraController,
    CameraPose,
    PinholeIntrinsics,
    PoseIntegrator,
    PoseSteps,
    camera_chunk,
    map_rays,
    plucker_map,
    pose_matrix,
    relative_poses,
    rotation_matrix,
)
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.errors import ChunkContractError, ControlError, ModelInputError

STEPS = PoseSteps(move=0.1, yaw=math.radians(2), pitch=math.radians(1.5), pitch_limit=math.radians(85))
INTRINSICS = PinholeIntrinsics.from_fov(32, 16)


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


def test_pinhole_rays_span_the_field_of_view() -> None:
    rays = INTRINSICS.camera_rays()
    # 90 degrees across 32 pixels: the outermost pixel centres sit at +-(15.5/16) of tan(45 degrees).
    assert (rays[0, 0, -1] / rays[2, 0, -1]).item() == pytest.approx(15.5 / 16)
    assert (rays[1, 0, 0] / rays[2, 0, 0]).item() == pytest.approx(-7.5 / 16)


def chunks(keys: list[str], count: int, controller: CameraController | None = None) -> list[CameraChunk]:
    controller = controller or CameraController(STEPS, INTRINSICS)
    return [controller.chunk_control(ControlSnapshot.from_keys(i, keys), i, 3).camera for i in range(count)]


def test_the_contract_holds_one_relative_pose_per_latent_frame_chained_from_the_start() -> None:
    controller = CameraController(STEPS, INTRINSICS)
    for index in range(3):
        before = controller.pose
        control = controller.chunk_control(keys("w", "l", "i", seq=index), index, 3)
        camera = control.camera
        assert camera.chunk_size == 3
        assert camera.relative.dtype == camera.start.dtype == torch.float64
        assert torch.equal(camera.start, pose_matrix(before))  # the pose the chunk moved from
        ends = [pose_matrix(control.poses[4 * latent + 3]) for latent in range(3)]  # each latent frame's last frame
        assert torch.allclose(camera.world_poses(), torch.stack(ends), atol=1e-12)
        unscaled = camera.relative.clone()
        unscaled[:, :3, 3] *= camera.translation_scale
        assert torch.allclose(unscaled, relative_poses(camera.start, torch.stack(ends)), atol=1e-12)


def test_the_sessions_first_latent_frame_is_the_identity_and_the_next_chunk_carries_the_step() -> None:
    first, second = chunks(["w"], 2)
    assert torch.equal(first.relative[0], torch.eye(4, dtype=torch.float64))
    assert torch.equal(first.start, torch.eye(4, dtype=torch.float64))
    assert torch.allclose(second.start, first.world_poses()[-1], atol=1e-15)
    # walking at full speed is a unit step forward per latent frame, across the chunk boundary too
    for camera, frames in ((first, (1, 2)), (second, (0, 1, 2))):
        for frame in frames:
            assert torch.allclose(camera.relative[frame, :3, 3], torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))
            assert torch.allclose(camera.relative[frame, :3, :3], torch.eye(3, dtype=torch.float64))


def test_a_reset_is_an_ordinary_step_from_the_start_pose_not_a_jump() -> None:
    controller = CameraController(STEPS, INTRINSICS)
    chunks(["w", "l"], 2, controller)
    controller.reset_pose()
    after = controller.chunk_control(keys("w"), 2, 3).camera
    assert torch.equal(after.start, torch.eye(4, dtype=torch.float64))
    assert torch.allclose(after.relative[0, :3, 3], torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))
    assert torch.allclose(after.world_poses()[-1, :3, 3], torch.tensor([0.0, 0.0, 1.2], dtype=torch.float64))


def test_a_session_that_cannot_move_has_unit_scale_and_zero_translations() -> None:
    still = PoseSteps(move=0.0, yaw=STEPS.yaw, pitch=STEPS.pitch, pitch_limit=STEPS.pitch_limit)
    camera = CameraController(still, INTRINSICS).chunk_control(keys("w", "l"), 0, 3).camera
    assert camera.translation_scale == 1.0
    assert float(camera.relative[:, :3, 3].abs().max()) == 0.0


@pytest.mark.parametrize("held", [("w",), ("s",), ("a",), ("d",), ("j",), ("l",), ("i",), ("k",)])
def test_video_frame_cameras_are_the_integrators_poses_for_a_turn_or_a_walk(held: tuple[str, ...]) -> None:
    controller = CameraController(STEPS, INTRINSICS)
    for index in range(2):
        control = controller.chunk_control(keys(*held, seq=index), index, 3)
        rotations, centres = control.camera.video_frame_cameras((0, 1, 2, 3))
        for latent in range(3):
            for slot in range(4):
                pose = control.poses[4 * latent + slot]
                assert torch.allclose(rotations[latent, slot], rotation_matrix(pose.yaw, pose.pitch), atol=1e-12)
                assert torch.allclose(centres[latent, slot], torch.tensor(pose.position, dtype=torch.float64))


def test_video_frame_cameras_follow_the_chord_of_a_walking_turn_and_end_on_the_pose() -> None:
    control = CameraController(STEPS, INTRINSICS).chunk_control(keys("w", "l"), 0, 3)
    rotations, centres = control.camera.video_frame_cameras((0, 3))
    for latent in range(3):
        first, last = control.poses[4 * latent], control.poses[4 * latent + 3]
        assert torch.allclose(centres[latent, 1], torch.tensor(last.position, dtype=torch.float64), atol=1e-12)
        assert torch.allclose(rotations[latent, 1], rotation_matrix(last.yaw, last.pitch), atol=1e-12)
        # the first slot's heading is exact (one axis), its centre on the chord: within a tenth of a step of the arc
        assert torch.allclose(rotations[latent, 0], rotation_matrix(first.yaw, first.pitch), atol=1e-12)
        assert torch.allclose(
            centres[latent, 0], torch.tensor(first.position, dtype=torch.float64), atol=0.1 * STEPS.move
        )


@settings(max_examples=40, deadline=None)
@given(
    yaw=st.floats(-math.pi, math.pi),
    pitch=st.floats(-1.55, 1.55),
    x=st.floats(-3, 3),
    fraction=st.sampled_from([0, 1, 2, 3]),
)
def test_video_frame_cameras_interpolate_any_rotation_on_its_geodesic(
    yaw: float, pitch: float, x: float, fraction: int
) -> None:
    """Slot s is the relative rotation to the power (s + 1) / 4: four steps of slot 0 make the whole rotation, two of
    slot 1, and the angle grows linearly; robust up to half a turn."""
    relative = pose_matrix(CameraPose(x=x, yaw=yaw, pitch=pitch))[None]
    camera = CameraChunk(torch.eye(4, dtype=torch.float64), relative, 1.0, INTRINSICS)
    rotations, centres = camera.video_frame_cameras((0, 1, fraction))
    whole = relative[0, :3, :3]
    assert torch.allclose(torch.linalg.matrix_power(rotations[0, 0], 4), whole, atol=1e-9)
    assert torch.allclose(torch.linalg.matrix_power(rotations[0, 1], 2), whole, atol=1e-9)
    angle = math.acos(max(-1.0, min(1.0, (float(torch.trace(whole)) - 1) / 2)))
    partial = math.acos(max(-1.0, min(1.0, (float(torch.trace(rotations[0, 2])) - 1) / 2)))
    assert partial == pytest.approx(angle * (fraction + 1) / 4, abs=1e-6)
    assert float(centres[0, 2, 0]) == pytest.approx(x * (fraction + 1) / 4)


def test_the_contract_rejects_what_is_not_a_chunks_camera() -> None:
    good = chunks(["w"], 1)[0]
    eye = torch.eye(4, dtype=torch.float64)
    bad: list[tuple[Callable[[], CameraChunk], str]] = [
        (lambda: CameraChunk(eye, good.relative.float(), 1.0, INTRINSICS), "float64"),
        (lambda: CameraChunk(eye, good.relative * float("nan"), 1.0, INTRINSICS), "non-finite"),
        (lambda: CameraChunk(eye, good.relative * 2, 1.0, INTRINSICS), "rigid"),
        (lambda: CameraChunk(eye, good.relative[:, :3], 1.0, INTRINSICS), r"\[cs, 4, 4\]"),
        (lambda: CameraChunk(eye, good.relative[:0], 1.0, INTRINSICS), "at least one"),
        (lambda: CameraChunk(eye, good.relative, 0.0, INTRINSICS), "translation_scale"),
    ]
    for build, message in bad:
        with pytest.raises(ModelInputError, match=message):
            build()
    good.relative[1, 0, 0] = float("inf")  # tensors are mutable: check() sees it
    with pytest.raises(ModelInputError, match="non-finite"):
        good.check()
    with pytest.raises(ModelInputError, match="slots"):
        chunks([], 1)[0].video_frame_cameras((4,))
    with pytest.raises(ChunkContractError):
        camera_chunk(CameraPose(), [], INTRINSICS, 1.0)


def test_the_plucker_map_is_the_pixel_map_of_origins_and_directions_unshuffled() -> None:
    """Per latent frame: the relative translation at every pixel, then the relative rotation of every camera ray,
    at pixel resolution, folded 8x8 onto 384 channels in `F.pixel_unshuffle`'s order."""
    camera = chunks(["w", "l", "i"], 2)[1]
    out = plucker_map(camera)
    assert out.shape == (1, PLUCKER_MAP_CHANNELS, 3, 2, 4)
    assert out.dtype == torch.float32
    rays = INTRINSICS.camera_rays(torch.float64).reshape(3, -1)
    for frame in range(3):
        relative = camera.relative[frame]
        directions = (relative[:3, :3] @ rays).reshape(3, 16, 32)
        origins = relative[:3, 3, None, None].expand(3, 16, 32)
        pixel = torch.cat([origins, directions]).float()
        assert torch.allclose(out[0, :, frame], torch.nn.functional.pixel_unshuffle(pixel[None], 8)[0], atol=1e-6)
    assert torch.equal(plucker_map(camera, map_rays(INTRINSICS)), out)
    with pytest.raises(ModelInputError, match="rays must be"):
        plucker_map(camera, map_rays(PinholeIntrinsics.from_fov(16, 16)))
    with pytest.raises(ModelInputError, match="divisible by 8"):
        map_rays(PinholeIntrinsics.from_fov(20, 16))


def test_camera_controller_builds_chunks_in_order_and_reports_the_snapshot() -> None:
    controller = CameraController(STEPS, INTRINSICS)
    snapshot = keys("l", seq=7)
    control = controller.chunk_control(snapshot, 0, 3)
    assert control.snapshot is snapshot
    assert control.camera.chunk_size == 3
    assert control.camera.intrinsics == INTRINSICS
    assert controller.next_chunk_index == 1
    with pytest.raises(ChunkContractError, match="expected 1"):
        controller.chunk_control(snapshot, 2, 3)
    controller.reset_pose()
    assert controller.pose == CameraPose()
    after_reset = controller.chunk_control(keys(), 1, 3)
    assert all(pose == CameraPose() for pose in after_reset.poses)
    assert torch.equal(after_reset.camera.world_poses(), torch.eye(4, dtype=torch.float64).expand(3, 4, 4))


def test_the_contract_pickles_for_a_process_boundary() -> None:
    camera = chunks(["w", "l"], 2)[1]
    copy = pickle.loads(pickle.dumps(camera))
    assert torch.equal(copy.start, camera.start)
    assert torch.equal(copy.relative, camera.relative)
    assert (copy.translation_scale, copy.intrinsics) == (camera.translation_scale, camera.intrinsics)
