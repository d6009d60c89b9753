"""The DiT's call contract: shapes in and out, the camera's effect, and inputs refused with a sentence."""

from __future__ import annotations

import pytest
import torch

from pipeline.lingbot.errors import ModelInputError
from pipeline.lingbot.models import TINY_DIT, CacheConfig, LingBotFastDiT, TextKV
from tests.support.lingbot_models import LATENT_H, LATENT_W, chunk_inputs, text_context


def call(
    model: LingBotFastDiT,
    latents: torch.Tensor,
    control: torch.Tensor | None,
    text: TextKV | None = None,
) -> torch.Tensor:
    cache = model.new_cache(CacheConfig(), LATENT_H, LATENT_W)
    text = text or model.encode_text(text_context(TINY_DIT))
    with torch.inference_mode():
        result: torch.Tensor = model(latents, torch.tensor([500.0]), text, cache, cache.begin_chunk(), control)
    return result


def test_output_is_the_velocity_of_the_noisy_channels(tiny_model: LingBotFastDiT) -> None:
    chunk = chunk_inputs(TINY_DIT, 1)[0]
    out = call(tiny_model, torch.cat([chunk.noise, chunk.condition], dim=1), chunk.control)
    assert out.shape == chunk.noise.shape
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_the_camera_changes_the_prediction_and_may_be_absent(tiny_model: LingBotFastDiT) -> None:
    chunk = chunk_inputs(TINY_DIT, 1)[0]
    latents = torch.cat([chunk.noise, chunk.condition], dim=1)
    with_camera = call(tiny_model, latents, chunk.control)
    moved = call(tiny_model, latents, chunk.control.flip(2))
    without = call(tiny_model, latents, None)
    assert not torch.allclose(with_camera, moved)
    assert not torch.allclose(with_camera, without)


@pytest.mark.parametrize(
    ("latent_shape", "control_shape", "message"),
    [
        ((1, 35, 3, LATENT_H, LATENT_W), None, r"latents must be \[B, 36, 3, h, w\]"),
        ((1, 36, 2, LATENT_H, LATENT_W), None, r"latents must be"),
        ((1, 36, 3, LATENT_H, LATENT_W + 2), None, r"does not match the cache's 6 tokens"),
        ((2, 36, 3, LATENT_H, LATENT_W), None, r"batch 2, the cache 1"),
        ((1, 36, 3, LATENT_H, LATENT_W), (1, 24, 3, LATENT_H, LATENT_W), r"control must be \[1, 384, 3, 4, 6\]"),
    ],
)
def test_wrong_inputs_are_refused_with_the_expected_shape(
    tiny_model: LingBotFastDiT,
    latent_shape: tuple[int, ...],
    control_shape: tuple[int, ...] | None,
    message: str,
) -> None:
    control = torch.zeros(control_shape) if control_shape else None
    with pytest.raises(ModelInputError, match=message):
        call(tiny_model, torch.zeros(latent_shape), control)


def test_text_of_the_wrong_width_or_depth_is_refused(tiny_model: LingBotFastDiT) -> None:
    with pytest.raises(ModelInputError, match=r"\[B, L, 24\]"):
        tiny_model.encode_text(torch.zeros(1, 8, 23))
    shallow = TextKV(tiny_model.encode_text(text_context(TINY_DIT)).layers[:1])
    with pytest.raises(ModelInputError, match="1 layers, the model 2"):
        call(tiny_model, torch.zeros(1, 36, 3, LATENT_H, LATENT_W), None, shallow)


def test_a_forward_given_the_camera_modulation_equals_one_given_the_camera_map(tiny_model: LingBotFastDiT) -> None:
    chunk = chunk_inputs(TINY_DIT, 1)[0]
    latents = torch.cat([chunk.noise, chunk.condition], dim=1)
    text = tiny_model.encode_text(text_context(TINY_DIT))
    cache = tiny_model.new_cache(CacheConfig(), LATENT_H, LATENT_W)
    with torch.inference_mode():
        camera = tiny_model.camera_modulation(chunk.control)
        cached = tiny_model(latents, torch.tensor([500.0]), text, cache, cache.begin_chunk(), camera=camera)
    assert camera.nbytes == 2 * TINY_DIT.num_layers * camera.tokens * TINY_DIT.dim * 4
    assert torch.equal(cached, call(tiny_model, latents, chunk.control, text))


def test_a_forward_refuses_a_camera_given_twice_or_for_other_tokens(tiny_model: LingBotFastDiT) -> None:
    chunk = chunk_inputs(TINY_DIT, 1)[0]
    latents = torch.cat([chunk.noise, chunk.condition], dim=1)
    text = tiny_model.encode_text(text_context(TINY_DIT))
    cache = tiny_model.new_cache(CacheConfig(), LATENT_H, LATENT_W)
    with torch.inference_mode():
        camera = tiny_model.camera_modulation(chunk.control)
        one_frame = tiny_model.camera_modulation(chunk.control[:, :, :1])
        slot = cache.begin_chunk()
        with pytest.raises(ModelInputError, match="not both"):
            tiny_model(latents, torch.tensor([500.0]), text, cache, slot, chunk.control, camera=camera)
        with pytest.raises(ModelInputError, match="camera modulation has 2 layers of 6 tokens"):
            tiny_model(latents, torch.tensor([500.0]), text, cache, slot, camera=one_frame)
