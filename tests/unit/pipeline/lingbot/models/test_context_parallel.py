"""Ulysses context parallelism (`parallel.py`) on gloo ranks: 2 and 4 ranks give the 1-rank session bit for bit, each
rank's cache is the 1-rank cache's head slice, the whole denoiser (umt5 on rank 0, states broadcast) too, the
all-to-alls agree with the oracle package's Ulysses primitives, and a group that breaks the rule is refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.models import (
    TINY_DIT,
    CacheConfig,
    DiTConfig,
    LingBotFastDiT,
    ModelConfigError,
    Ulysses,
    bytes_per_session,
    check_parallel,
    write_tiny_checkpoint,
)
from tests.support.context_parallel import DiTSession, WorldSession, run_dit_session, run_group, run_world_session
from tests.support.lingbot_models import ChunkInputs, relative_error

pytest.importorskip("safetensors", reason="the lingbot extra (safetensors) is not installed")
pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built")

EIGHT_HEADS = DiTConfig(
    dim=192, ffn_dim=64, num_layers=2, num_heads=8, freq_dim=16, text_dim=20, text_len=6, rope_frames=18
)
"""8 heads of 24; a RoPE table of 18 frames, so a session of 8 chunks re-bases (at chunk 6)."""
CACHE = CacheConfig(chunk_frames=3, window_frames=9, sink_frames=3)
CHUNKS = 8


def dit_session(tmp_path: Path, config: DiTConfig = EIGHT_HEADS, latent: tuple[int, int] = (4, 8)) -> DiTSession:
    checkpoint = write_tiny_checkpoint(tmp_path / "dit", config, seed=2)
    out = tmp_path / "out"
    out.mkdir()
    return DiTSession(checkpoint, config, CACHE, CHUNKS, *latent, prompt_change_at=4, out=out)


@pytest.mark.parametrize("ranks", [2, 4])
def test_ranks_equal_one_rank_bit_for_bit_through_eviction_camera_prompt_change_and_rebase(
    tmp_path: Path, ranks: int
) -> None:
    spec = dit_session(tmp_path)
    one = run_dit_session(spec)
    statistics = one["statistics"]
    assert statistics.evicted_frames > 0, statistics
    assert statistics.rebases == 1, statistics
    results = run_group(ranks, spec)
    heads = EIGHT_HEADS.num_heads // ranks
    for rank, result in enumerate(results):
        assert all(torch.equal(a, b) for a, b in zip(result["outputs"], one["outputs"], strict=True)), rank
        assert result["statistics"].rebases == 1
        for layer in range(EIGHT_HEADS.num_layers):
            for name in ("k", "v"):
                expected = one[name][layer][:, :, rank * heads : (rank + 1) * heads]
                assert torch.equal(result[name][layer], expected), (rank, layer, name)
        assert result["statistics"].nbytes * ranks == statistics.nbytes


def test_the_camera_modulation_made_once_per_chunk_equals_the_per_forward_camera_on_one_and_two_ranks(
    tmp_path: Path,
) -> None:
    """The camera cache (`LingBotFastDiT.camera_modulation`, once per chunk) against the forward that computed it in
    each of the chunk's 5 forwards: the same x0 and cache bit for bit, over 8 chunks whose camera changes every chunk,
    through eviction and a re-base, on 1 rank and on each of 2 gloo ranks (Ulysses)."""
    spec = dit_session(tmp_path)
    per_forward = run_dit_session(dataclasses.replace(spec, camera_per_forward=True))
    statistics = per_forward["statistics"]
    assert statistics.evicted_frames > 0, statistics
    assert statistics.rebases == 1, statistics
    cached = run_dit_session(spec)
    assert all(torch.equal(a, b) for a, b in zip(cached["outputs"], per_forward["outputs"], strict=True))
    for name in ("k", "v"):
        assert all(torch.equal(a, b) for a, b in zip(cached[name], per_forward[name], strict=True)), name
    heads = EIGHT_HEADS.num_heads // 2
    for rank, result in enumerate(run_group(2, spec)):
        assert all(torch.equal(a, b) for a, b in zip(result["outputs"], per_forward["outputs"], strict=True)), rank
        for layer in range(EIGHT_HEADS.num_layers):
            expected = per_forward["k"][layer][:, :, rank * heads : (rank + 1) * heads]
            assert torch.equal(result["k"][layer], expected), (rank, layer)


def test_two_ranks_match_the_oracle_ulysses_primitives_and_dit(tmp_path: Path) -> None:
    """The oracle package (telefuser) ships Ulysses all-to-all primitives, not a Ulysses LingBot DiT: in the same
    gloo group our all-to-alls equal its `ulysses_scatter_heads` / `ulysses_gather_heads` bit for bit, and the
    2-rank session matches its (unsharded) LingBot-World-Fast DiT within 1e-5 relative, sampler included."""
    pytest.importorskip("telefuser.distributed.ulysses_comm", reason="the oracle (telefuser) is not installed")
    from tests.support.lingbot_models import LATENT_H, LATENT_W
    from tests.unit.pipeline.lingbot.models.test_parity import (
        CHUNK,
        SINK,
        TOLERANCE,
        WINDOW,
        build_oracle,
        run_oracle_session,
    )

    config = TINY_DIT
    checkpoint = write_tiny_checkpoint(tmp_path / "dit", config, seed=4)
    out = tmp_path / "out"
    out.mkdir()
    cache = CacheConfig(chunk_frames=CHUNK, window_frames=WINDOW, sink_frames=SINK)
    spec = DiTSession(checkpoint, config, cache, 7, LATENT_H, LATENT_W, prompt_change_at=7, out=out)
    results = run_group(2, spec, compare=True)
    assert all(result["telefuser"] == {"to_heads": True, "to_tokens": True} for result in results), results
    oracle = build_oracle(config, checkpoint)
    theirs = run_oracle_session(config, oracle, _oracle_inputs(spec), seed=3)
    errors = [relative_error(a, b) for a, b in zip(results[0]["outputs"], theirs, strict=True)]
    assert max(errors) <= TOLERANCE, errors


def _oracle_inputs(spec: DiTSession) -> list[ChunkInputs]:
    """The chunk inputs `run_dit_session` draws, in its order, as the parity test's `ChunkInputs`."""
    generator = torch.Generator().manual_seed(11)
    inputs = []
    for _ in range(spec.chunks):

        def draw(channels: int) -> torch.Tensor:
            return torch.randn(1, channels, 3, spec.latent_h, spec.latent_w, generator=generator)

        noise, condition = draw(16), draw(spec.config.in_dim - 16)
        inputs.append(ChunkInputs(noise, condition, draw(spec.config.control_map_channels)))
    return inputs


def test_two_ranks_of_the_denoiser_encode_the_prompt_once_and_equal_one_rank(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="the lingbot extra (transformers) is not installed")
    pytest.importorskip("diffusers", reason="the lingbot extra (diffusers) is not installed")
    from pipeline.lingbot.models import write_tiny_model

    model_dir = write_tiny_model(tmp_path / "model", seed=0)
    out = tmp_path / "out"
    out.mkdir()
    config = LingBotSessionConfig(width=64, height=32, frame_num=4 * 9 - 3, seed=7)
    spec = WorldSession(model_dir, config, ("a red car", "a red car", "snow"), out)
    one = run_world_session(spec)
    results = run_group(2, dataclasses.replace(spec, base_latent=one["base"]))
    for result in results:
        assert all(torch.equal(a, b) for a, b in zip(result["latents"], one["latents"], strict=True))


def test_a_group_that_does_not_divide_the_heads_or_tokens_is_refused_naming_the_variable() -> None:
    with pytest.raises(ModelConfigError, match=r"LINGSTREAM_DENOISE_RANKS=3 does not divide the DiT's 8 attention"):
        check_parallel(EIGHT_HEADS, 3)
    with pytest.raises(ModelConfigError, match=r"LINGSTREAM_DENOISE_RANKS=4 does not divide the 6 tokens"):
        check_parallel(EIGHT_HEADS, 4, frame_tokens=6)
    with pytest.raises(ModelConfigError, match="attention heads"):
        LingBotFastDiT(EIGHT_HEADS, Ulysses(0, 3))
    model = LingBotFastDiT(EIGHT_HEADS, Ulysses(0, 4))
    with pytest.raises(ModelConfigError, match="6 tokens of a latent frame"):
        model.new_cache(CACHE, 4, 6)


def test_the_full_size_session_cache_divides_by_the_ranks() -> None:
    from pipeline.lingbot.models import LINGBOT_FAST_14B

    one = bytes_per_session(LINGBOT_FAST_14B, 480, 832, torch.bfloat16)
    text = 2 * LINGBOT_FAST_14B.num_layers * LINGBOT_FAST_14B.text_len * LINGBOT_FAST_14B.dim * 2
    for ranks in (1, 2, 4, 5, 8):
        check_parallel(LINGBOT_FAST_14B, ranks, LINGBOT_FAST_14B.frame_tokens(60, 104))
        assert (
            bytes_per_session(LINGBOT_FAST_14B, 480, 832, torch.bfloat16, ranks=ranks) - text == (one - text) // ranks
        )
