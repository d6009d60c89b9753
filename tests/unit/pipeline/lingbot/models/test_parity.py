"""Parity with an independent implementation: the `telefuser` package's LingBot-World-Fast DiT as an oracle.

The same random tiny weights load strictly into both models; both run a session of 7 chunks of 3 latent frames
with a window of 9 frames and a sink of 3 (eviction from chunk 3 on), camera input and a padded prompt, in fp32.
The oracle is only read and run here, never copied. Traps (see docs/lingbot-fast.md): its `dtype` attribute is
bf16 by default (set to fp32), its output head is zero-initialised (the checkpoint is random everywhere), and
`head_dim // 3` must be even.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from pipeline.lingbot.models import (
    TINY_DIT,
    CacheConfig,
    DiTConfig,
    LingBotFastDiT,
    load_dit,
    write_tiny_checkpoint,
)
from tests.support.lingbot_models import (
    LATENT_H,
    LATENT_W,
    ChunkInputs,
    checkpoint_file,
    chunk_inputs,
    relative_error,
    run_session,
    text_context,
)

oracle_dit = pytest.importorskip(
    "telefuser.models.lingbot_world_fast_dit",
    reason="the oracle is absent: scripts/setup.sh --dev installs telefuser (--no-deps) with loguru and einops",
)
from safetensors.torch import load_file  # noqa: E402  (after the skip: the oracle's loader needs it too)

WINDOW, SINK, CHUNK, CHUNKS = 9, 3, 3, 7
TOLERANCE = 1e-5
CONFIGS = {
    "head_dim_32": TINY_DIT,
    "head_dim_24": DiTConfig(dim=72, ffn_dim=80, num_layers=3, num_heads=3, freq_dim=16, text_dim=20, text_len=6),
}


def build_oracle(config: DiTConfig, directory: Path) -> Any:
    oracle = oracle_dit.LingBotWorldFastDiT(
        patch_size=config.patch_size,
        text_len=config.text_len,
        in_dim=config.in_dim,
        dim=config.dim,
        ffn_dim=config.ffn_dim,
        freq_dim=config.freq_dim,
        text_dim=config.text_dim,
        out_dim=config.out_dim,
        num_heads=config.num_heads,
        num_layers=config.num_layers,
        local_attn_size=WINDOW,
        sink_size=SINK,
        eps=config.eps,
    )
    oracle.load_state_dict(load_file(str(checkpoint_file(directory))), strict=True)
    oracle.dtype = torch.float32
    return oracle.eval().requires_grad_(False)


def oracle_caches(config: DiTConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    tokens = WINDOW * config.frame_tokens(LATENT_H, LATENT_W)
    shape = (1, tokens, config.num_heads, config.head_dim)
    self_kv = [
        {"k": torch.zeros(shape), "v": torch.zeros(shape), "global_end_index": 0, "local_end_index": 0}
        for _ in range(config.num_layers)
    ]
    cross_kv: list[dict[str, Any]] = [{"is_init": False} for _ in range(config.num_layers)]
    return self_kv, cross_kv


@pytest.fixture(params=sorted(CONFIGS))
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[DiTConfig, LingBotFastDiT, Any]:
    config = CONFIGS[request.param]
    directory = write_tiny_checkpoint(tmp_path / "dit", config, seed=4)
    return config, load_dit(directory, config), build_oracle(config, directory)


def test_every_dit_call_matches_the_oracle_over_chunks_with_eviction_and_camera(
    pair: tuple[DiTConfig, LingBotFastDiT, Any],
) -> None:
    """Five calls per chunk (four noisy timesteps, then the clean pass at t = 0) with fresh random inputs."""
    config, model, oracle = pair
    cache = model.new_cache(CacheConfig(chunk_frames=CHUNK, window_frames=WINDOW, sink_frames=SINK), LATENT_H, LATENT_W)
    context = text_context(config)
    text = model.encode_text(context)
    self_kv, cross_kv = oracle_caches(config)
    frame_tokens = config.frame_tokens(LATENT_H, LATENT_W)
    generator = torch.Generator().manual_seed(9)
    worst = 0.0
    with torch.inference_mode():
        for index, chunk in enumerate(chunk_inputs(config, CHUNKS)):
            slot = cache.begin_chunk()
            for t in (999.0, 957.0, 899.0, 702.0, 0.0):
                x = torch.randn(chunk.noise.shape, generator=generator)
                latents = torch.cat([x, chunk.condition], dim=1)
                ours = model(latents, torch.tensor([t]), text, cache, slot, chunk.control)
                theirs = oracle(
                    x=x,
                    timestep=torch.tensor([t]),
                    context=context,
                    y=chunk.condition,
                    control_tensor=chunk.control,
                    kv_cache=self_kv,
                    crossattn_cache=cross_kv,
                    current_start=index * CHUNK * frame_tokens,
                    max_attention_size=WINDOW * frame_tokens,
                )
                worst = max(worst, relative_error(ours, theirs))
            held = cache.tokens_oldest_first()  # the ring's frames in the oracle's (sliding) order
            for layer, theirs_kv in zip(cache.layers, self_kv, strict=True):
                k, v = layer.k[:, held], layer.v[:, held]
                stored = k.shape[1]
                worst = max(
                    worst,
                    relative_error(k, theirs_kv["k"][:, :stored]),
                    relative_error(v, theirs_kv["v"][:, :stored]),
                )
    assert cache.statistics().evicted_frames == (CHUNKS * CHUNK - WINDOW)
    assert worst <= TOLERANCE, f"max relative error {worst:.3g}"


def oracle_denoising() -> ModuleType:
    """The oracle's chunk denoising stage (its sampler), loaded from its file: the package `__init__` that would
    import it also imports OpenCV for video output, which the tests do not need."""
    pytest.importorskip("diffusers", reason="the oracle's scheduler needs diffusers (the lingbot extra)")
    name = "_telefuser_lingbot_denoising"
    if name in sys.modules:
        return sys.modules[name]
    path = Path(oracle_dit.__file__).parents[1] / "pipelines" / "lingbot_world_fast" / "denoising.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_oracle_session(config: DiTConfig, oracle: Any, inputs: list[ChunkInputs], seed: int) -> list[torch.Tensor]:
    denoising = oracle_denoising()
    unipc = importlib.import_module("telefuser.schedulers.unipc")
    scheduler = unipc.FlowUniPCMultistepScheduler(num_train_timesteps=1000, shift=1, use_dynamic_shifting=False)
    timesteps = denoising.LingBotWorldFastTimesteps().select(scheduler, 5.0)
    stage = denoising.LingBotWorldFastDenoisingStage(oracle, torch_dtype=torch.float32)
    self_kv, cross_kv = oracle_caches(config)
    context = text_context(config)
    frame_tokens = config.frame_tokens(LATENT_H, LATENT_W)
    generator = torch.Generator().manual_seed(seed)
    outputs = []
    with torch.inference_mode():
        for index, chunk in enumerate(inputs):
            start = index * CHUNK * frame_tokens
            common = {"kv_cache": self_kv, "crossattn_cache": cross_kv, "current_start": start}
            x0 = stage.denoise_chunk(
                chunk.noise,
                chunk.condition,
                context,
                timesteps,
                scheduler,
                chunk.control,
                self_kv,
                cross_kv,
                start,
                WINDOW * frame_tokens,
                generator=generator,
            )
            oracle(
                x=x0,
                timestep=torch.zeros(1),
                context=context,
                y=chunk.condition,
                control_tensor=chunk.control,
                max_attention_size=WINDOW * frame_tokens,
                **common,
            )
            outputs.append(x0)
    return outputs


def test_whole_chunks_sampler_included_match_the_oracle(pair: tuple[DiTConfig, LingBotFastDiT, Any]) -> None:
    """The session as served: 4-step sampler with seeded re-noising, clean cache pass, eviction, camera."""
    config, model, oracle = pair
    inputs = chunk_inputs(config, CHUNKS)
    ours, cache = run_session(model, CacheConfig(chunk_frames=CHUNK, window_frames=WINDOW, sink_frames=SINK), inputs)
    theirs = run_oracle_session(config, oracle, inputs, seed=3)
    errors = [relative_error(a, b) for a, b in zip(ours, theirs, strict=True)]
    assert cache.statistics().evicted_frames > 0
    assert max(errors) <= TOLERANCE, f"per-chunk relative errors {errors}"
