"""The streamed Wan VAE: chunked decode equals diffusers' one-shot decode, the reference prefix equals a one-shot
encode of the image and its zero frames, sessions are independent, release is idempotent, loading is strict.

Tolerance: exact (0.0). The wrapper runs the same encoder/decoder calls, one latent frame at a time, that
diffusers' `encode`/`decode` run inside themselves, on the same device and dtype, so nothing is reassociated; a
tolerance would only hide a cache handed over wrongly (which changes frames by O(0.1), measured below)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline.lingbot.errors import ModelInputError, ModelSessionError
from pipeline.lingbot.models import CheckpointError
from pipeline.lingbot.models.vae import StreamingVAE, load_vae, tiny_vae, write_tiny_vae

pytest.importorskip("diffusers", reason="the lingbot extra (diffusers) is not installed")
safetensors_torch = pytest.importorskip("safetensors.torch", reason="the lingbot extra (safetensors) is not installed")

HEIGHT, WIDTH = 32, 48
LATENT_H, LATENT_W = HEIGHT // 8, WIDTH // 8


@pytest.fixture(scope="module")
def vae() -> Any:
    return tiny_vae(seed=0)


@pytest.fixture
def streaming(vae: Any) -> StreamingVAE:
    return StreamingVAE(vae)


def latents(frames: int, seed: int = 2) -> torch.Tensor:
    return torch.randn(16, frames, LATENT_H, LATENT_W, generator=torch.Generator().manual_seed(seed))


def chunks(latent: torch.Tensor, size: int = 3) -> list[torch.Tensor]:
    return [latent[:, start : start + size] for start in range(0, latent.shape[1], size)]


def one_shot_decode(vae: Any, normalised: torch.Tensor) -> torch.Tensor:
    config = vae.config
    mean = torch.tensor(config.latents_mean).view(-1, 1, 1, 1)
    std = torch.tensor(config.latents_std).view(-1, 1, 1, 1)
    with torch.inference_mode():
        video: torch.Tensor = vae.decode((normalised * std + mean)[None]).sample[0]
    return video


def decode_in_chunks(streaming: StreamingVAE, session: str, latent: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    parts, start = [], 0
    for size in sizes:
        parts.append(streaming.decode_chunk(session, latent[:, start : start + size]))
        start += size
    return torch.cat(parts, dim=1)


@pytest.mark.parametrize("sizes", [[3, 3, 3, 3], [1, 2, 3, 3]])
def test_chunked_decode_equals_one_shot_decode(vae: Any, streaming: StreamingVAE, sizes: list[int]) -> None:
    latent = latents(sum(sizes))
    streaming.open("s")
    streamed = decode_in_chunks(streaming, "s", latent, sizes)
    assert torch.equal(streamed, one_shot_decode(vae, latent))
    assert streamed.shape == (3, 4 * (sum(sizes) - 1) + 1, HEIGHT, WIDTH)


def test_frame_contract_is_nine_then_twelve_per_chunk(streaming: StreamingVAE) -> None:
    streaming.open("s")
    counts = [streaming.decode_chunk("s", chunk).shape[1] for chunk in chunks(latents(9))]
    assert counts == [9, 12, 12]


def test_a_cache_handed_over_wrongly_would_show(vae: Any, streaming: StreamingVAE) -> None:
    """The exact comparison is sensitive: decoding a chunk with another session's cache changes it visibly."""
    latent = latents(6)
    streaming.open("right")
    streaming.open("wrong")
    streaming.decode_chunk("right", latent[:, :3])
    streaming.decode_chunk("wrong", latents(3, seed=9))
    whole = one_shot_decode(vae, latent)
    assert torch.equal(streaming.decode_chunk("right", latent[:, 3:]), whole[:, 9:])
    assert float((streaming.decode_chunk("wrong", latent[:, 3:]) - whole[:, 9:]).abs().max()) > 0.05


def test_sessions_decoded_interleaved_equal_each_alone(streaming: StreamingVAE) -> None:
    first, second = latents(9, seed=3), latents(9, seed=4)
    streaming.open("a")
    streaming.open("b")
    a_parts, b_parts = [], []
    for a_chunk, b_chunk in zip(chunks(first), chunks(second), strict=True):
        a_parts.append(streaming.decode_chunk("a", a_chunk))
        b_parts.append(streaming.decode_chunk("b", b_chunk))
    streaming.open("alone")
    alone = decode_in_chunks(streaming, "alone", second, [3, 3, 3])
    assert torch.equal(torch.cat(b_parts, dim=1), alone)
    assert not torch.equal(torch.cat(a_parts, dim=1), alone)


def test_release_is_idempotent_and_ends_the_session(streaming: StreamingVAE) -> None:
    streaming.open("s")
    streaming.decode_chunk("s", latents(3))
    streaming.release("s")
    streaming.release("s")
    streaming.release("never-opened")
    assert streaming.statistics().open_sessions == 0
    with pytest.raises(ModelSessionError, match="no decode cache for session 's'"):
        streaming.decode_chunk("s", latents(3))


def test_a_reopened_session_starts_from_a_fresh_cache(streaming: StreamingVAE) -> None:
    latent = latents(3)
    streaming.open("s")
    fresh = streaming.decode_chunk("s", latent)
    streaming.release("s")
    streaming.open("s")
    assert torch.equal(streaming.decode_chunk("s", latent), fresh)


def test_opening_a_session_twice_is_refused(streaming: StreamingVAE) -> None:
    streaming.open("s")
    with pytest.raises(ModelSessionError, match="already has a decode cache"):
        streaming.open("s")


def test_a_latent_of_the_wrong_shape_is_refused(streaming: StreamingVAE) -> None:
    streaming.open("s")
    with pytest.raises(ModelInputError, match=r"latent chunk must be \[16, n>=1, h, w\]"):
        streaming.decode_chunk("s", torch.zeros(4, 3, LATENT_H, LATENT_W))


def reference_image(seed: int = 1) -> torch.Tensor:
    return torch.rand(3, HEIGHT, WIDTH, generator=torch.Generator().manual_seed(seed))


def test_reference_prefix_equals_one_shot_encode_normalised(vae: Any, streaming: StreamingVAE) -> None:
    image = reference_image()
    prefix = streaming.encode_reference(image)
    frames = prefix.latent.shape[1]
    video = torch.cat([image[None, :, None] * 2 - 1, torch.zeros(1, 3, 4 * (frames - 1), HEIGHT, WIDTH)], dim=2)
    with torch.inference_mode():
        raw = vae.encode(video).latent_dist.mode()[0]
    mean = torch.tensor(vae.config.latents_mean).view(-1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(-1, 1, 1, 1)
    assert torch.equal(prefix.latent, (raw - mean) / std)
    assert prefix.latent.shape == (16, frames, LATENT_H, LATENT_W)


def test_reference_prefix_stops_when_zero_frames_converge(streaming: StreamingVAE) -> None:
    prefix = streaming.encode_reference(reference_image())
    assert prefix.converged
    assert prefix.last_change == 0.0
    assert torch.equal(prefix.latent[:, -1], prefix.latent[:, -2])
    assert not torch.equal(prefix.latent[:, -2], prefix.latent[:, -3])
    assert 2 < prefix.latent.shape[1] < 32


def test_reference_prefix_is_capped_and_says_it_did_not_converge(streaming: StreamingVAE) -> None:
    prefix = streaming.encode_reference(reference_image(), max_prefix_frames=5)
    assert prefix.latent.shape[1] == 5
    assert not prefix.converged
    assert prefix.last_change > 0.0


def test_a_reference_of_a_size_the_vae_cannot_compress_is_refused(streaming: StreamingVAE) -> None:
    with pytest.raises(ModelInputError, match="not a multiple of 8 pixels"):
        streaming.encode_reference(torch.rand(3, 30, 48))


@pytest.fixture(scope="module")
def vae_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_vae(tmp_path_factory.mktemp("vae"), seed=0)


def test_a_written_vae_folder_loads_the_same_weights(vae_folder: Path, vae: Any) -> None:
    loaded = load_vae(vae_folder)
    reference = vae.state_dict()
    assert all(torch.equal(value, reference[key]) for key, value in loaded.state_dict().items())
    assert set(loaded.state_dict()) == set(reference)


def damaged(vae_folder: Path, tmp_path: Path, edit: dict[str, torch.Tensor | None]) -> Path:
    folder = Path(shutil.copytree(vae_folder, tmp_path / "vae"))
    path = folder / "diffusion_pytorch_model.safetensors"
    tensors = safetensors_torch.load_file(str(path))
    for key, value in edit.items():
        if value is None:
            del tensors[key]
        else:
            tensors[key] = value
    safetensors_torch.save_file(tensors, str(path))
    return folder


def test_a_vae_missing_a_key_is_refused_naming_it(vae_folder: Path, tmp_path: Path) -> None:
    folder = damaged(vae_folder, tmp_path, {"decoder.conv_out.weight": None})
    with pytest.raises(CheckpointError, match=r"1 missing keys: decoder\.conv_out\.weight"):
        load_vae(folder)


def test_a_vae_with_a_wrong_shape_is_refused_naming_it(vae_folder: Path, tmp_path: Path) -> None:
    folder = damaged(vae_folder, tmp_path, {"quant_conv.bias": torch.zeros(7)})
    with pytest.raises(CheckpointError, match=r"quant_conv\.bias is \[7\], expected \[32\]"):
        load_vae(folder)


def test_a_vae_without_its_config_is_refused(vae_folder: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(vae_folder, tmp_path / "vae"))
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json is missing or not JSON"):
        load_vae(folder)


def test_a_config_for_another_model_is_refused(vae_folder: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(vae_folder, tmp_path / "vae"))
    config = json.loads((folder / "config.json").read_text())
    config["_class_name"] = "AutoencoderKL"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="is for AutoencoderKL, not AutoencoderKLWan"):
        load_vae(folder)
