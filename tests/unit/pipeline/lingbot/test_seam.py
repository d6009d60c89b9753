from __future__ import annotations

import dataclasses

import pytest
import torch

from pipeline.lingbot.camera import CameraController
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.errors import ChunkContractError, ModelInputError
from pipeline.lingbot.reference.model import ReferenceWorldModel
from pipeline.lingbot.seam import (
    ChunkCondition,
    ChunkDecoder,
    ChunkDenoiser,
    ReferenceEncoder,
    WorldModel,
    WorldModelParts,
    first_frame_mask,
    slice_condition,
    validate_base_latent,
    validate_control,
)


def numbered_latent(frames: int) -> torch.Tensor:
    """A `[2, frames, 1, 1]` latent whose value is its frame index."""
    return torch.arange(frames, dtype=torch.float32).view(1, frames, 1, 1).repeat(2, 1, 1, 1)


def test_condition_slices_the_chunk_window() -> None:
    sliced = slice_condition(numbered_latent(10), chunk_index=1, chunk_size=3)
    assert sliced.shape == (2, 3, 1, 1)
    assert sliced[0, :, 0, 0].tolist() == [3.0, 4.0, 5.0]


def test_condition_repeats_the_tail_past_the_prefix() -> None:
    sliced = slice_condition(numbered_latent(4), chunk_index=1, chunk_size=3)
    assert sliced[0, :, 0, 0].tolist() == [3.0, 3.0, 3.0]
    single = slice_condition(numbered_latent(1), chunk_index=700, chunk_size=3)
    assert single[0, :, 0, 0].tolist() == [0.0, 0.0, 0.0]


def test_slice_is_a_copy() -> None:
    base = numbered_latent(3)
    sliced = slice_condition(base, 0, 3)
    sliced.zero_()
    assert base[0, 2, 0, 0].item() == 2.0


def test_first_frame_mask_marks_only_the_reference_frame() -> None:
    assert first_frame_mask(0, 3).tolist() == [True, False, False]
    assert first_frame_mask(1, 3).tolist() == [False, False, False]


@pytest.mark.parametrize(("index", "size"), [(-1, 3), (0, 0), (True, 3)])
def test_condition_artifact_validates(index: int, size: int) -> None:
    with pytest.raises(ChunkContractError):
        ChunkCondition(index, size)


def test_base_latent_and_control_shapes_are_validated() -> None:
    config = LingBotSessionConfig(width=64, height=32, frame_num=45)
    validate_base_latent(torch.zeros(16, 1, 4, 8), config)
    with pytest.raises(ModelInputError, match=r"\[16, T>=1, 4, 8\]"):
        validate_base_latent(torch.zeros(16, 1, 8, 4), config)
    with pytest.raises(ModelInputError, match="floating-point"):
        validate_base_latent(torch.zeros(16, 1, 4, 8, dtype=torch.int64), config)
    camera = CameraController(config.pose_steps(), config.camera_intrinsics())
    control = camera.chunk_control(ControlSnapshot.from_keys(0, ["w"]), 0, 3).camera
    validate_control(control, config, 3)
    with pytest.raises(ModelInputError, match="3 latent frames, got 2"):
        validate_control(dataclasses.replace(control, relative=control.relative[:2]), config, 3)
    with pytest.raises(ModelInputError, match="the session's"):
        validate_control(control, LingBotSessionConfig(width=32, height=32, frame_num=45), 3)
    with pytest.raises(ModelInputError, match="CameraChunk"):
        validate_control(torch.zeros(24, 3, 4, 8), config, 3)  # type: ignore[arg-type]


def test_reference_stages_satisfy_the_protocols() -> None:
    model = ReferenceWorldModel()
    assert isinstance(model.encoder, ReferenceEncoder)
    assert isinstance(model.denoiser, ChunkDenoiser)
    assert isinstance(model.decoder, ChunkDecoder)
    parts: WorldModel = WorldModelParts(model.encoder, model.denoiser, model.decoder)
    assert parts.denoiser is model.denoiser
