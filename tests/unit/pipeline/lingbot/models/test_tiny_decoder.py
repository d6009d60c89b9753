"""The tiny streaming decoder (`LINGSTREAM_DECODER=tiny`, issue #32) on random weights: the Wan VAE's frame
contract, streaming equal to one-shot decode, the weights from the model directory (strict, TAEHV's layout), a clear
start error without them, and the whole world model decoding with it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.models import (
    TINY_DECODER_DIR,
    CheckpointError,
    StreamingTinyDecoder,
    TinyDecoderConfig,
    TinyVideoDecoder,
    check_tiny_decoder,
    load_tiny_decoder,
    write_tiny_decoder,
)
from pipeline.lingbot.models.bundle import LingBotFastOptions, check_model_dir, write_tiny_model
from pipeline.lingbot.models.tiny_decoder import TINY_DECODER_WEIGHTS, TINY_TEST_CONFIG
from pipeline.lingbot.models.vae import StreamingVAE, tiny_vae
from pipeline.lingbot.models.world import LingBotFastFactory, LingBotFastWorldModel
from pipeline.lingbot.seam import ModelShard

safetensors_torch = pytest.importorskip("safetensors.torch", reason="the lingbot extra (safetensors) is not installed")

H, W = 4, 6  # latent size: 32x48 pixels


def _decoder(seed: int = 0, config: TinyDecoderConfig = TINY_TEST_CONFIG) -> StreamingTinyDecoder:
    torch.manual_seed(seed)
    return StreamingTinyDecoder(TinyVideoDecoder(config), device="cpu", dtype=torch.float32)


def _latents(frames: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(16, frames, H, W, generator=torch.Generator().manual_seed(seed))


def _stream(
    decoder: StreamingTinyDecoder | StreamingVAE, session: str, latents: torch.Tensor, sizes: list[int]
) -> list[torch.Tensor]:
    decoder.open(session)
    out, start = [], 0
    for size in sizes:
        out.append(decoder.decode_chunk(session, latents[:, start : start + size]))
        start += size
    decoder.release(session)
    return out


def test_each_chunk_has_the_wan_vaes_frames_and_size() -> None:
    pytest.importorskip("diffusers", reason="the lingbot extra (diffusers) is not installed")
    latents = _latents(6)
    tiny = _stream(_decoder(), "s", latents, [3, 3])
    wan = _stream(StreamingVAE(tiny_vae(seed=0), device="cpu", dtype=torch.float32), "s", latents, [3, 3])
    assert [tuple(chunk.shape) for chunk in tiny] == [tuple(chunk.shape) for chunk in wan]
    assert [chunk.shape[1] for chunk in tiny] == [9, 12]
    assert tiny[0].shape == (3, 9, 8 * H, 8 * W)
    assert all(chunk.dtype == torch.float32 and chunk.min() >= -1 and chunk.max() <= 1 for chunk in tiny)
    assert all(float(chunk.std()) > 0 for chunk in tiny)  # random weights: noise, not a constant


def test_streaming_in_any_chunking_equals_one_shot_decode_bit_for_bit() -> None:
    decoder = _decoder()
    latents = _latents(12)
    (whole,) = _stream(decoder, "whole", latents, [12])
    for sizes in ([3, 3, 3, 3], [1, 2, 3, 3, 3], [1] * 12):
        parts = _stream(decoder, f"s{len(sizes)}", latents, sizes)
        assert torch.equal(torch.cat(parts, 1), whole), sizes
    # The module's batched path (every latent frame at once) is the same within float rounding, not bit for bit.
    module = decoder.module
    with torch.inference_mode():
        batched = module.decode(latents.permute(1, 0, 2, 3), module.new_memory())
    batched_video = batched[module.config.frames_to_trim :].permute(1, 0, 2, 3) * 2 - 1
    assert torch.allclose(batched_video, whole, atol=1e-5, rtol=0)


def test_the_memory_is_what_carries_a_session_across_chunks() -> None:
    decoder = _decoder()
    latents = _latents(6)
    first, second = _stream(decoder, "a", latents, [3, 3])
    decoder.open("fresh")
    decoder.decode_chunk("fresh", torch.zeros(16, 1, H, W))  # a primed session, but not this one's history
    wrong = decoder.decode_chunk("fresh", latents[:, 3:])
    assert wrong.shape == second.shape
    assert float((wrong - second).abs().max()) > 1e-3
    # interleaved sessions are independent
    decoder.open("x")
    decoder.open("y")
    x = [decoder.decode_chunk("x", latents[:, :3])]
    y = [decoder.decode_chunk("y", latents[:, :3])]
    x.append(decoder.decode_chunk("x", latents[:, 3:]))
    y.append(decoder.decode_chunk("y", latents[:, 3:]))
    assert all(torch.equal(a, b) for a, b in zip(x, [first, second], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(y, [first, second], strict=True))


def test_sessions_and_inputs_are_checked() -> None:
    decoder = _decoder()
    with pytest.raises(Exception, match="not open"):
        decoder.decode_chunk("nobody", _latents(3))
    decoder.open("s")
    with pytest.raises(Exception, match="already open"):
        decoder.open("s")
    with pytest.raises(Exception, match=r"latents must be \[16"):
        decoder.decode_chunk("s", torch.zeros(8, 3, H, W))
    decoder.release("s")
    decoder.release("s")  # idempotent


def test_weights_load_from_the_model_directory_strictly(tmp_path: Path) -> None:
    path = write_tiny_decoder(tmp_path / TINY_DECODER_DIR, seed=3)
    assert path.name == TINY_DECODER_WEIGHTS
    config, parameters = check_tiny_decoder(tmp_path / TINY_DECODER_DIR)
    assert config == TINY_TEST_CONFIG
    loaded = load_tiny_decoder(tmp_path / TINY_DECODER_DIR)
    torch.manual_seed(3)
    written = TinyVideoDecoder(TINY_TEST_CONFIG)
    assert parameters == sum(p.numel() for p in written.parameters())
    for (name, a), (_, b) in zip(
        loaded.decoder.state_dict().items(), written.decoder.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name

    tensors = safetensors_torch.load_file(str(path))
    # TAEHV's layout: encoder tensors beside the decoder's are ignored; a time grow stored for stride 2 where this
    # decoder has stride 1 (the first stage) keeps the last time step's channels.
    grow = "decoder.7.conv.weight"
    assert tuple(tensors[grow].shape) == (16, 16, 1, 1)
    doubled = torch.randn(32, 16, 1, 1)
    wider = dict(tensors, **{grow: doubled, "encoder.0.weight": torch.zeros(1)})
    safetensors_torch.save_file(wider, str(path))
    reloaded = load_tiny_decoder(tmp_path / TINY_DECODER_DIR).decoder.state_dict()
    assert torch.equal(reloaded["7.conv.weight"], doubled[16:])

    broken = {k: v for k, v in tensors.items() if k != "decoder.3.conv.2.weight"}
    broken["decoder.99.weight"] = torch.zeros(1)
    broken["decoder.5.conv.0.bias"] = torch.zeros(3)
    safetensors_torch.save_file(broken, str(path))
    with pytest.raises(CheckpointError) as caught:
        load_tiny_decoder(tmp_path / TINY_DECODER_DIR)
    message = str(caught.value)
    assert "missing: decoder.3.conv.2.weight" in message
    assert "unexpected: decoder.99.weight" in message
    assert "wrong shape: decoder.5.conv.0.bias" in message


def test_tiny_without_its_weights_stops_the_start_with_a_clear_error(tmp_path: Path) -> None:
    pytest.importorskip("diffusers", reason="the lingbot extra (diffusers) is not installed")
    pytest.importorskip("transformers", reason="the lingbot extra (transformers) is not installed")
    root = write_tiny_model(tmp_path / "model", seed=0)
    check_model_dir(root, decoder="tiny")  # tiny-checkpoint writes one
    shutil.rmtree(root / TINY_DECODER_DIR)
    check_model_dir(root)  # the Wan VAE needs none
    with pytest.raises(CheckpointError, match=r"LINGSTREAM_DECODER=tiny needs the tiny decoder's weights at .*"):
        check_model_dir(root, decoder="tiny")
    with pytest.raises(CheckpointError, match="LINGSTREAM_DECODER=tiny needs"):
        LingBotFastWorldModel.load(LingBotFastOptions(str(root), decoder="tiny"))
    with pytest.raises(ValueError, match="decoder must be one of wan, tiny"):
        LingBotFastOptions(str(root), decoder="taehv")


def test_the_world_model_decodes_with_the_tiny_decoder_in_the_same_contract(tmp_path: Path) -> None:
    pytest.importorskip("diffusers", reason="the lingbot extra (diffusers) is not installed")
    pytest.importorskip("transformers", reason="the lingbot extra (transformers) is not installed")
    from pipeline.lingbot.camera import CameraController
    from pipeline.lingbot.controls import ControlSnapshot

    root = write_tiny_model(tmp_path / "model", seed=0)
    config = LingBotSessionConfig(width=64, height=32, frame_num=4 * 6 - 3, seed=7)
    world = LingBotFastWorldModel.load(LingBotFastOptions(str(root), decoder="tiny"))
    world.encoder.create_cache("s", config)
    world.denoiser.create_cache("s", config, world.encoder.encode_reference("s", None))
    world.decoder.create_cache("s", config)
    camera = CameraController(config.pose_steps(), config.camera_intrinsics())
    shapes = []
    for index in range(2):
        control = camera.chunk_control(ControlSnapshot.from_keys(index, ["w"]), index, 3).camera
        latent = world.denoiser.denoise_chunk("s", index, 3, control, prompt="")
        whole = world.decoder.decode_chunk("s", index, latent)
        shapes.append(tuple(whole.shape))
        assert whole.dtype == torch.uint8
    assert shapes == [(9, 32, 64, 3), (12, 32, 64, 3)]
    factory = LingBotFastFactory(LingBotFastOptions(str(root), decoder="tiny"))
    decoder = factory.decoder(ModelShard("cpu"))
    assert decoder.statistics().open_sessions == 0
