from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from pipeline.lingbot.camera import (
    CameraChunk,
    CameraController,
    CameraPose,
    PinholeIntrinsics,
    camera_chunk,
    pose_matrix,
)
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.errors import ChunkContractError, ModelInputError, ModelSessionError
from pipeline.lingbot.reference.model import ReferenceWorldModel, default_scene
from pipeline.lingbot.seam import ProgressiveDecoder
from tests.support.lingbot import (
    close_session,
    content_shift,
    digest,
    generate_chunk,
    gray,
    open_session,
    run_session,
    small_config,
)

# A 128x96 view: horizon at row 48, the near ground (full motion) below row ~68.
MOTION = small_config(height=96, move_step=0.15)
SKY = (slice(14, 36), slice(24, 104))
NEAR_LEFT = (slice(68, 82), slice(14, 56))
NEAR_RIGHT = (slice(68, 82), slice(72, 114))
NEAR = (slice(74, 82), slice(20, 108))
FAR = (slice(54, 60), slice(20, 108))


def motion(keys: list[str], region: tuple[slice, slice], frames_apart: int = 4) -> tuple[int, int]:
    """How content in `region` moves over `frames_apart` frames of chunk 1 with `keys` held."""
    chunk = run_session(MOTION, [[], keys])[1]
    return content_shift(gray(chunk[0]), gray(chunk[frames_apart]), *region, max_shift=12)


def test_frame_counts_shapes_and_dtype_follow_the_chunk_contract() -> None:
    config = small_config()
    chunks = run_session(config, [["w"], ["l"], []])
    assert [tuple(c.shape) for c in chunks] == [(9, 64, 128, 3), (12, 64, 128, 3), (12, 64, 128, 3)]
    assert all(c.dtype == torch.uint8 and c.device.type == "cpu" for c in chunks)


def test_other_chunk_sizes_follow_the_contract() -> None:
    chunks = run_session(small_config(chunk_size=2), [[], []])
    assert [c.shape[0] for c in chunks] == [5, 8]


def test_latent_has_lingbot_shapes() -> None:
    config = small_config()
    model = ReferenceWorldModel()
    camera = open_session(model, "s", config)
    control = camera.chunk_control(ControlSnapshot.from_keys(0, []), 0, 3)
    latent = model.denoiser.denoise_chunk("s", 0, 3, control.camera, prompt="")
    assert latent.shape == (16, 3, 8, 16)
    assert latent.dtype == torch.float32


def test_idle_session_holds_still_on_the_reference() -> None:
    chunks = run_session(small_config(), [[], []])
    first = gray(chunks[0][0])
    for frame in torch.cat(chunks)[1:]:
        assert np.abs(gray(frame) - first).mean() < 1.5  # only the faint seeded grain differs


def test_first_frame_is_the_reference_image() -> None:
    config = small_config()
    image = torch.rand(3, 64, 128)
    image = torch.nn.functional.avg_pool2d(image[None], 9, stride=1, padding=4, count_include_pad=False)[0]
    frame = run_session(config, [[]], image=image)[0][0].permute(2, 0, 1).float() / 255
    assert (frame - image).abs().mean().item() < 0.03  # a lossy 8x codec, but the same picture


def test_same_seed_and_controls_give_identical_frames() -> None:
    plan = [["w", "l"], ["i", "a"], ["s", "j", "k"]]
    assert digest(run_session(small_config(seed=5), plan)) == digest(run_session(small_config(seed=5), plan))


def test_different_seeds_differ() -> None:
    plan = [["w"], ["l"]]
    assert digest(run_session(small_config(seed=1), plan)) != digest(run_session(small_config(seed=2), plan))


def test_compute_scale_costs_work_but_not_frames() -> None:
    plan = [["w"], ["l"]]
    assert digest(run_session(small_config(compute_scale=3.0), plan)) == digest(run_session(small_config(), plan))


def test_yaw_right_pans_content_left() -> None:
    dy, dx = motion(["l"], SKY)
    assert dy == 0
    assert dx <= -7  # 4 frames x 2 degrees at f = 64 px is about 9 px
    dy, dx = motion(["j"], NEAR)
    assert dx >= 7


def test_pitch_up_moves_content_down() -> None:
    dy, dx = motion(["i"], SKY)
    assert dx == 0
    assert dy >= 5  # 4 frames x 1.5 degrees at f = 64 px is about 7 px
    dy, _ = motion(["k"], NEAR)
    assert dy <= -5


def test_walking_forward_moves_ground_away_from_the_centre() -> None:
    left_dy, left_dx = motion(["w"], NEAR_LEFT)
    right_dy, right_dx = motion(["w"], NEAR_RIGHT)
    assert left_dy > 0
    assert right_dy > 0
    assert left_dx < 0 < right_dx  # and outwards on both sides
    assert motion(["w"], SKY) == (0, 0)  # the sky is at infinity


def test_walking_back_moves_ground_towards_the_centre() -> None:
    left_dy, left_dx = motion(["s"], NEAR_LEFT)
    right_dy, right_dx = motion(["s"], NEAR_RIGHT)
    assert left_dy < 0
    assert right_dy < 0
    assert left_dx > 0 > right_dx


def test_strafing_shifts_near_ground_more_than_far_and_sky_not_at_all() -> None:
    _, near_dx = motion(["d"], NEAR)
    _, far_dx = motion(["d"], FAR)
    assert near_dx <= -6
    assert abs(far_dx) < abs(near_dx)
    assert motion(["d"], SKY) == (0, 0)
    _, near_dx = motion(["a"], NEAR)
    assert near_dx >= 6


def test_motion_is_smooth_within_a_latent_frame() -> None:
    chunk = run_session(MOTION, [[], ["l"]])[1]
    steps = [content_shift(gray(chunk[i]), gray(chunk[i + 1]), *SKY, max_shift=6)[1] for i in range(11)]
    assert all(-4 <= step <= -1 for step in steps)  # about 2.2 px every frame, no 4-frame jumps


def test_the_control_tensor_drives_the_camera() -> None:
    config = small_config()
    model = ReferenceWorldModel()
    camera = open_session(model, "s", config)
    generate_chunk(model, "s", camera, 0, [], 3)
    turned = camera_chunk(CameraPose(yaw=0.3), [CameraPose(yaw=0.3)] * 3, config.camera_intrinsics(), 1.0)
    frames = model.decoder.decode_chunk("s", 1, model.denoiser.denoise_chunk("s", 1, 3, turned, prompt=""))
    reference = gray(run_session(config, [[]])[0][0])
    # A fixed 0.3 rad turn at f = 64 px moves the picture by 64 * tan(0.3) = 19.8 px to the left.
    _, dx = content_shift(reference, gray(frames[6]), slice(16, 48), slice(30, 98), 24, 4)
    assert -22 <= dx <= -18


def test_the_relative_poses_drive_the_camera_from_the_chunks_start() -> None:
    """The reference model reads the contract's relative poses, not only its start: a chunk that turns 0.1 rad right
    per latent frame from the reference pose shows its key frames turned 0.1 k + 0.075 rad (slot 2 is three quarters
    of the way), so the sky moves left by f tan of that."""
    config = small_config()
    model = ReferenceWorldModel()
    camera = open_session(model, "s", config)
    generate_chunk(model, "s", camera, 0, [], 3)
    step = pose_matrix(CameraPose(yaw=0.1))
    turning = CameraChunk(
        torch.eye(4, dtype=torch.float64), step.expand(3, 4, 4).clone(), 1.0, config.camera_intrinsics()
    )
    frames = model.decoder.decode_chunk("s", 1, model.denoiser.denoise_chunk("s", 1, 3, turning, prompt=""))
    reference = gray(run_session(config, [[]])[0][0])
    for latent in range(3):
        expected = -64 * math.tan(0.1 * latent + 0.075)
        _, dx = content_shift(reference, gray(frames[4 * latent + 2]), slice(16, 48), slice(30, 98), 24, 4)
        assert abs(dx - expected) <= 2, (latent, dx, expected)


def test_custom_reference_image_also_follows_the_camera() -> None:
    image = torch.rand(3, 96, 128)
    image = torch.nn.functional.avg_pool2d(image[None], 7, stride=1, padding=3, count_include_pad=False)[0]
    chunk = run_session(MOTION, [[], ["l"]], image=image)[1]
    _, dx = content_shift(gray(chunk[0]), gray(chunk[4]), *SKY, max_shift=12)
    assert dx <= -7


def test_sessions_have_isolated_caches() -> None:
    config_a = small_config(seed=1)
    config_b = small_config(seed=2, width=64)
    alone_a = run_session(config_a, [["l"], ["w"], ["i"]])
    alone_b = run_session(config_b, [["j"], ["s"], ["k"]])
    model = ReferenceWorldModel()
    camera_a = open_session(model, "a", config_a)
    camera_b = open_session(model, "b", config_b)
    mixed_a, mixed_b = [], []
    for index, (keys_a, keys_b) in enumerate(zip([["l"], ["w"], ["i"]], [["j"], ["s"], ["k"]], strict=True)):
        mixed_b.append(generate_chunk(model, "b", camera_b, index, keys_b, 3))
        mixed_a.append(generate_chunk(model, "a", camera_a, index, keys_a, 3))
    assert digest(mixed_a) == digest(alone_a)
    assert digest(mixed_b) == digest(alone_b)


def test_release_frees_the_session_and_is_idempotent() -> None:
    config = small_config()
    model = ReferenceWorldModel()
    camera = open_session(model, "s", config)
    open_session(model, "other", config)
    generate_chunk(model, "s", camera, 0, [], 3)
    assert model.denoiser.statistics().open_sessions == 2
    assert model.decoder.statistics().calls == 1
    close_session(model, "s")
    close_session(model, "s")
    assert model.denoiser.statistics().open_sessions == 1
    assert model.encoder.statistics().open_sessions == 1
    control = camera.chunk_control(ControlSnapshot.from_keys(1, []), 1, 3)
    with pytest.raises(ModelSessionError, match="no cache for session 's'"):
        model.denoiser.denoise_chunk("s", 1, 3, control.camera, prompt="")
    with pytest.raises(ModelSessionError):
        model.encoder.encode_reference("s", None)


def test_releasing_an_unknown_session_is_a_no_op() -> None:
    close_session(ReferenceWorldModel(), "never-opened")


def test_creating_a_cache_twice_is_rejected() -> None:
    config = small_config()
    model = ReferenceWorldModel()
    open_session(model, "s", config)
    with pytest.raises(ModelSessionError, match="already has a cache"):
        model.decoder.create_cache("s", config)


def test_chunks_out_of_order_are_rejected() -> None:
    config = small_config()
    model = ReferenceWorldModel()
    open_session(model, "s", config)
    camera = CameraController(config.pose_steps(), config.camera_intrinsics())
    control = camera.chunk_control(ControlSnapshot.from_keys(0, []), 0, 3)
    with pytest.raises(ModelSessionError, match="out of order, expected chunk 0"):
        model.denoiser.denoise_chunk("s", 1, 3, control.camera, prompt="")
    latent = model.denoiser.denoise_chunk("s", 0, 3, control.camera, prompt="")
    with pytest.raises(ModelSessionError, match="out of order"):
        model.decoder.decode_chunk("s", 2, latent)


def test_chunk_size_and_index_must_match_the_session_plan() -> None:
    config = small_config()
    model = ReferenceWorldModel()
    camera = open_session(model, "s", config)
    control = camera.chunk_control(ControlSnapshot.from_keys(0, []), 0, 3)
    two = dataclasses.replace(control.camera, relative=control.camera.relative[:2])
    with pytest.raises(ChunkContractError, match="chunk_size 2"):
        model.denoiser.denoise_chunk("s", 0, 2, two, prompt="")
    with pytest.raises(ChunkContractError, match="outside the session"):
        model.denoiser.denoise_chunk("s", 8, 3, control.camera, prompt="")


def test_bad_tensors_are_rejected() -> None:
    config = small_config()
    model = ReferenceWorldModel()
    camera = open_session(model, "s", config)
    control = camera.chunk_control(ControlSnapshot.from_keys(0, []), 0, 3)
    contract = control.camera
    with pytest.raises(ModelInputError, match="control must have 3 latent frames"):
        model.denoiser.denoise_chunk(
            "s", 0, 3, dataclasses.replace(contract, relative=contract.relative[:2]), prompt=""
        )
    other = dataclasses.replace(contract, intrinsics=PinholeIntrinsics.from_fov(64, 64))
    with pytest.raises(ModelInputError, match="control intrinsics must be the session's"):
        model.denoiser.denoise_chunk("s", 0, 3, other, prompt="")
    with pytest.raises(ModelInputError, match="control must be a CameraChunk"):
        model.denoiser.denoise_chunk("s", 0, 3, torch.zeros(24, 3, 8, 16), prompt="")  # type: ignore[arg-type]
    contract.relative[2, 0, 3] = float("inf")  # a tensor changed after the contract was built
    with pytest.raises(ModelInputError, match="non-finite"):
        model.denoiser.denoise_chunk("s", 0, 3, contract, prompt="")
    with pytest.raises(ModelInputError, match="latent chunk must be"):
        model.decoder.decode_chunk("s", 0, torch.zeros(16, 3, 4, 4))
    model.encoder.create_cache("img", config)
    with pytest.raises(ModelInputError, match="reference image must be"):
        model.encoder.encode_reference("img", torch.zeros(3, 32, 32))


def test_default_scene_is_a_textured_landscape_with_a_horizon() -> None:
    scene = default_scene(128, 64)
    assert scene.shape == (3, 64, 128)
    sky, ground = scene[:, :24], scene[:, 40:]
    assert sky[2].mean() > sky[1].mean()  # blue above
    assert ground[1].mean() > ground[0].mean()
    assert ground[1].mean() > ground[2].mean()
    assert ground[1].std() > 0.05  # and textured, so motion is visible


def test_decoding_per_latent_frame_gives_the_whole_chunks_frames_bit_for_bit() -> None:
    config = small_config()
    model = ReferenceWorldModel()
    whole_model = ReferenceWorldModel()
    camera = open_session(model, "s", config)
    open_session(whole_model, "s", config)
    assert isinstance(model.decoder, ProgressiveDecoder)
    for index, keys in enumerate((["w", "l"], ["a", "i"], [])):
        control = camera.chunk_control(ControlSnapshot.from_keys(index, keys), index, 3)
        latent = model.denoiser.denoise_chunk("s", index, 3, control.camera, prompt="")
        parts = list(model.decoder.decode_parts("s", index, latent))
        whole = whole_model.decoder.decode_chunk("s", index, latent)
        assert [part.shape[0] for part in parts] == ([1, 4, 4] if index == 0 else [4, 4, 4])
        assert torch.equal(torch.cat(parts), whole)
        assert len(torch.unique(whole.reshape(len(whole), -1), dim=0)) > 1  # the parts differ: a real comparison
    assert model.decoder.statistics().calls == 3


def test_a_chunk_decoded_in_parts_counts_only_once_it_is_finished() -> None:
    config = small_config()
    model = ReferenceWorldModel()
    camera = open_session(model, "s", config)
    control = camera.chunk_control(ControlSnapshot.from_keys(0, []), 0, 3)
    latent = model.denoiser.denoise_chunk("s", 0, 3, control.camera, prompt="")
    parts = model.decoder.decode_parts("s", 0, latent)
    next(parts)
    with pytest.raises(ModelSessionError, match="out of order, expected chunk 0"):
        model.decoder.decode_chunk("s", 1, latent)
    assert sum(part.shape[0] for part in parts) == 8
    assert model.decoder.decode_chunk("s", 1, latent).shape[0] == 12
