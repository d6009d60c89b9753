"""The memory estimate: the published model's figures (weights, the parts measured on meta, per-session caches,
sessions per GPU) from meta-device models, and the arithmetic of what fits."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.errors import SessionConfigError
from pipeline.lingbot.models import (
    LINGBOT_FAST_14B,
    TINY_DIT,
    LingBotFastOptions,
    ModelDirSummary,
    estimate_memory,
    session_limits,
)
from pipeline.lingbot.policy.service import LingBotService
from pipeline.lingbot.reference.model import ReferenceWorldModel

transformers = pytest.importorskip("transformers", reason="the lingbot extra (transformers) is not installed")
diffusers = pytest.importorskip("diffusers", reason="the lingbot extra (diffusers) is not installed")

GB = 1e9


def parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.fixture(scope="module")
def full_size() -> ModelDirSummary:
    """Parameter counts of the published parts, built on the meta device: the DiT, the Wan2.1 VAE (diffusers'
    defaults) and the umt5-xxl encoder."""
    from pipeline.lingbot.models import LingBotFastDiT

    umt5_xxl = transformers.UMT5Config(
        vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
        feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False,
    )  # fmt: skip
    with torch.device("meta"):
        dit = parameters(LingBotFastDiT(LINGBOT_FAST_14B))
        vae = parameters(diffusers.AutoencoderKLWan())
        text = parameters(transformers.UMT5EncoderModel(umt5_xxl))
    return ModelDirSummary(LINGBOT_FAST_14B, dit, vae, text)


def test_the_published_model_in_bf16(full_size: ModelDirSummary) -> None:
    estimate = estimate_memory(full_size, LingBotFastOptions("."), "cuda:0", capacity=80 * 2**30)
    assert estimate.dtype == "bfloat16"
    assert full_size.dit_parameters * 2 / GB == pytest.approx(37.08, abs=0.01)
    assert estimate.model_bytes / GB == pytest.approx(48.7, abs=0.2)  # + the VAE (0.25 GB) and umt5-xxl (11.4 GB)
    assert estimate.attention_cache_bytes / GB == pytest.approx(23.42, abs=0.01)
    parts = estimate.parts
    assert parts is not None
    assert parts.decoder_cache_bytes / GB == pytest.approx(1.89, abs=0.01)  # the Wan VAE decoder's feature cache
    assert estimate.session_bytes == estimate.attention_cache_bytes + parts.decoder_cache_bytes
    assert parts.camera_modulation_bytes / GB == pytest.approx(3.83, abs=0.01)
    assert parts.dit_transient_bytes / GB == pytest.approx(0.79, abs=0.01)
    assert parts.decode_transient_bytes / GB == pytest.approx(3.74, abs=0.01)
    assert parts.encode_transient_bytes / GB == pytest.approx(2.66, abs=0.01)
    assert estimate.once_bytes / GB == pytest.approx(12.01, abs=0.01)  # the above and a 1 GB context
    assert estimate.total_bytes(1) / GB == pytest.approx(86.0, abs=0.1)
    assert estimate.fits_sessions == 0  # an 80 GiB H100 (77.3 GB usable) holds no session at window 18
    h200 = estimate_memory(full_size, LingBotFastOptions("."), "cuda:0", capacity=141 * 10**9)
    assert h200.fits_sessions == 2
    shorter = estimate_memory(
        full_size, LingBotFastOptions(".", window_frames=9, sink_frames=3), "cuda:0", capacity=141 * 10**9
    )
    assert shorter.attention_cache_bytes < estimate.attention_cache_bytes / 1.9
    assert shorter.fits_sessions == 4
    mapping = estimate.to_mapping()
    assert mapping["once_bytes"] == estimate.once_bytes
    assert mapping["parts"] == {
        "attention_cache_bytes": estimate.attention_cache_bytes,
        "decoder_cache_bytes": parts.decoder_cache_bytes,
        "camera_modulation_bytes": parts.camera_modulation_bytes,
        "dit_transient_bytes": parts.dit_transient_bytes,
        "decode_transient_bytes": parts.decode_transient_bytes,
        "encode_transient_bytes": parts.encode_transient_bytes,
        "context_bytes": parts.context_bytes,
    }


def test_on_the_cpu_the_default_is_float32(full_size: ModelDirSummary) -> None:
    estimate = estimate_memory(full_size, LingBotFastOptions("."), "cpu", capacity=64 * 2**30)
    assert estimate.dtype == "float32"
    assert estimate.fits_sessions == 0  # 195 GB of fp32 weights do not fit in 64 GiB
    assert estimate.to_mapping()["resolution"] == "832x480"


def test_what_fits_is_what_is_left_after_the_weights_divided_by_a_session() -> None:
    summary = ModelDirSummary(TINY_DIT, 1000, 100, 10)
    estimate = estimate_memory(summary, LingBotFastOptions("."), "cpu", capacity=10**9)
    assert estimate.model_bytes == 4 * 1110
    assert estimate.usable_bytes == 9 * 10**8
    assert estimate.once_bytes > 0  # the published VAE's transients (no VAE config given); no context on the CPU
    assert estimate.fits_sessions == max(
        0, (estimate.usable_bytes - estimate.model_bytes - estimate.once_bytes) // estimate.session_bytes
    )
    assert estimate.total_bytes(3) == estimate.model_bytes + estimate.once_bytes + 3 * estimate.session_bytes


def test_sessions_above_the_planned_pixels_or_with_a_chunk_the_window_cannot_hold_are_refused() -> None:
    check = session_limits(LingBotFastOptions(".", window_frames=9, sink_frames=3))
    check(LingBotSessionConfig(width=832, height=480, chunk_size=6))  # the planned size and the largest chunk pass
    with pytest.raises(SessionConfigError, match=r"width x height: 848x480 is more pixels than the 832x480"):
        check(LingBotSessionConfig(width=848, height=480))
    with pytest.raises(SessionConfigError, match=r"chunk_size: 7 latent frames .* at most 6"):
        check(LingBotSessionConfig(chunk_size=7, frame_num=4 * 14 - 3))
    service = LingBotService(ReferenceWorldModel(), check_config=check)  # the service runs it on every create
    with pytest.raises(SessionConfigError, match="chunk_size: 7"):
        service.prepare({"chunk_size": 7, "frame_num": 4 * 14 - 3}, None)
    assert service.prepare({"chunk_size": 3}, None).width == 416


def test_a_size_whose_frame_tokens_the_dit_group_cannot_split_is_refused_at_create() -> None:
    """8 ranks: 832x480 (52 x 30 = 1 560 tokens a frame) splits; 784x480 (49 x 30 = 1 470) does not."""
    check = session_limits(LingBotFastOptions(".", denoise_ranks=8))
    check(LingBotSessionConfig(width=832, height=480))
    with pytest.raises(SessionConfigError, match=r"784x480 makes 1470 tokens .* \(LINGSTREAM_DENOISE_RANKS\)"):
        check(LingBotSessionConfig(width=784, height=480))
    session_limits(LingBotFastOptions("."))(LingBotSessionConfig(width=784, height=480))  # one rank splits anything


def test_each_rank_of_a_dit_group_holds_its_share_of_a_session() -> None:
    """The self-attention cache divides by P (each rank caches its heads); the prompt's text K/V stay whole."""
    summary = ModelDirSummary(LINGBOT_FAST_14B, 1000, 100, 10)
    one = estimate_memory(summary, LingBotFastOptions("."), "cpu", capacity=10**12)
    eight = estimate_memory(summary, LingBotFastOptions(".", denoise_ranks=8), "cpu", capacity=10**12)
    text = 2 * LINGBOT_FAST_14B.num_layers * LINGBOT_FAST_14B.text_len * LINGBOT_FAST_14B.dim * 4  # float32
    assert eight.denoise_ranks == 8
    assert eight.attention_cache_bytes == (one.attention_cache_bytes - text) // 8 + text
    assert eight.session_bytes - eight.attention_cache_bytes == one.session_bytes - one.attention_cache_bytes
    assert eight.fits_sessions > 4 * one.fits_sessions


def test_with_the_tiny_decoder_a_session_holds_its_small_memory_instead_of_the_wan_decoders_cache(
    full_size: ModelDirSummary,
) -> None:
    from pipeline.lingbot.models.tiny_decoder import TinyDecoderConfig

    summary = dataclasses.replace(full_size, tiny_decoder=TinyDecoderConfig())
    wan = estimate_memory(summary, LingBotFastOptions("."), "cuda:0", capacity=80 * 2**30)
    tiny = estimate_memory(summary, LingBotFastOptions(".", decoder="tiny"), "cuda:0", capacity=80 * 2**30)
    assert tiny.attention_cache_bytes == wan.attention_cache_bytes
    assert (wan.session_bytes - tiny.session_bytes) / GB == pytest.approx(1.89 - 0.067, abs=0.01)
    assert (wan.once_bytes - tiny.once_bytes) / GB == pytest.approx(3.74 - 0.50, abs=0.01)
    assert tiny.total_bytes(1) / GB == pytest.approx(81.0, abs=0.1)  # still more than an H100's 77.3 usable
    assert tiny.fits_sessions == 0
