"""Ulysses context parallelism on gloo ranks: one session of the DiT (or of the whole denoiser) per rank, its
results saved for the test process to compare with the 1-rank run.

Spawned ranks import this module by name: it stays light (no service, no test harness). `run_group` starts the ranks
(spawn, gloo over loopback), each runs `rank_main`, which joins the group, runs the spec's session with its
`Ulysses` layout and saves what it produced under the spec's directory as `rank{N}.pt`.
"""

from __future__ import annotations

import multiprocessing
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.models import (
    SINGLE_RANK,
    CacheConfig,
    DiTConfig,
    KVCache,
    LingBotFastDiT,
    LingBotFastOptions,
    TextKV,
    Ulysses,
    denoise_chunk,
    load_dit,
    sample_chunk,
)

__all__ = ["DiTSession", "WorldSession", "run_dit_session", "run_group", "run_world_session"]

_JOIN_S = 240.0
"""How long the ranks may take (a hung collective fails the test instead of hanging it)."""


@dataclass(frozen=True, slots=True)
class DiTSession:
    """A DiT session: `chunks` chunks of 3 latent frames of `latent_h`x`latent_w`, seeded inputs and camera, the
    prompt's text states switched at chunk `prompt_change_at`."""

    checkpoint: Path
    config: DiTConfig
    cache: CacheConfig
    chunks: int
    latent_h: int
    latent_w: int
    prompt_change_at: int
    out: Path
    camera_per_forward: bool = False
    """Compute the camera modulation in every forward (the forward before the per-chunk camera cache), not once per
    chunk as `denoise_chunk` does."""


@dataclass(frozen=True, slots=True)
class WorldSession:
    """A session of the whole denoiser (`LingBotFastFactory`): the umt5 encoder on rank 0, its states broadcast."""

    model_dir: Path
    config: LingBotSessionConfig
    prompts: tuple[str, ...]
    """One per chunk."""
    out: Path
    base_latent: torch.Tensor | None = None
    """The session's base latent (None: encoded by the 1-rank encoder here)."""


def _states(config: DiTConfig, seed: int) -> torch.Tensor:
    context = torch.randn(1, config.text_len, config.text_dim, generator=torch.Generator().manual_seed(seed))
    context[:, config.text_len // 2 :] = 0
    return context


def run_dit_session(spec: DiTSession, parallel: Ulysses = SINGLE_RANK) -> dict[str, Any]:
    """The session's x0 per chunk, the cache's layers (K and V) after it, and its statistics."""
    model = load_dit(spec.checkpoint, spec.config, parallel=parallel)
    cache = model.new_cache(spec.cache, spec.latent_h, spec.latent_w)
    inputs = torch.Generator().manual_seed(11)
    sampler = torch.Generator().manual_seed(3)
    outputs = []
    text = model.encode_text(_states(spec.config, 5))
    for index in range(spec.chunks):
        if index == spec.prompt_change_at:
            text = model.encode_text(_states(spec.config, 6))
        shape = (1, 0, 3, spec.latent_h, spec.latent_w)

        def draw(channels: int, shape: tuple[int, ...] = shape) -> torch.Tensor:
            return torch.randn(shape[0], channels, *shape[2:], generator=inputs)

        noise, condition = draw(16), draw(spec.config.in_dim - 16)
        control = draw(spec.config.control_map_channels)
        denoise = _denoise_camera_per_forward if spec.camera_per_forward else denoise_chunk
        outputs.append(denoise(model, cache, text, condition, noise, sampler, control))
    return {
        "outputs": outputs,
        "k": [layer.k.clone() for layer in cache.layers],
        "v": [layer.v.clone() for layer in cache.layers],
        "statistics": cache.statistics(),
    }


def _denoise_camera_per_forward(
    model: LingBotFastDiT,
    cache: KVCache,
    text: TextKV,
    condition: torch.Tensor,
    noise: torch.Tensor,
    generator: torch.Generator,
    control: torch.Tensor,
) -> torch.Tensor:
    """`denoise_chunk` as it was before the camera cache: every forward is given the Plücker map."""
    with torch.inference_mode():
        slot = cache.begin_chunk(noise.shape[2])

        def predict(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            velocity: torch.Tensor = model(torch.cat([x, condition], dim=1), t, text, cache, slot, control)
            return velocity

        x0 = sample_chunk(predict, noise, generator)
        predict(x0, torch.zeros(noise.shape[0]))
    return x0


def run_world_session(spec: WorldSession, parallel: Ulysses = SINGLE_RANK) -> dict[str, Any]:
    """The denoiser's latent chunks for the spec's prompts (its base latent from the 1-rank encoder)."""
    from pipeline.lingbot.camera import CameraController
    from pipeline.lingbot.controls import ControlSnapshot
    from pipeline.lingbot.models.world import LingBotFastFactory
    from pipeline.lingbot.seam import ModelShard

    factory = LingBotFastFactory(LingBotFastOptions(str(spec.model_dir), denoise_ranks=parallel.world_size))
    base = spec.base_latent
    if base is None:
        encoder = factory.encoder(ModelShard("cpu"))
        encoder.create_cache("s", spec.config)
        base = encoder.encode_reference("s", None)
    denoiser = factory.denoiser(ModelShard("cpu", parallel.rank, parallel.world_size))
    denoiser.create_cache("s", spec.config, base)
    camera = CameraController(spec.config.pose_steps(), spec.config.camera_intrinsics())
    latents = []
    for index, prompt in enumerate(spec.prompts):
        control = camera.chunk_control(ControlSnapshot.from_keys(index, ["w", "l"]), index, 3).camera
        latents.append(denoiser.denoise_chunk("s", index, 3, control, prompt=prompt))
    return {"latents": latents, "base": base}


def rank_main(rank: int, world_size: int, port: int, spec: DiTSession | WorldSession, compare: bool) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        parallel = Ulysses(rank, world_size)
        result = run_dit_session(spec, parallel) if isinstance(spec, DiTSession) else run_world_session(spec, parallel)
        if compare:
            result["telefuser"] = _compare_with_telefuser(parallel, spec)
        torch.save(result, spec.out / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _compare_with_telefuser(parallel: Ulysses, spec: DiTSession | WorldSession) -> dict[str, bool]:
    """Our all-to-alls against the oracle package's Ulysses primitives in the same gloo group, on a q-like tensor of
    this rank's tokens: whether each equals the oracle's bit for bit."""
    from telefuser.distributed.ulysses_comm import ulysses_gather_heads, ulysses_scatter_heads

    assert isinstance(spec, DiTSession)
    heads, head_dim = spec.config.num_heads, spec.config.head_dim
    tokens = 3 * spec.latent_h * spec.latent_w // 4 // parallel.world_size
    local = torch.randn(1, tokens, heads, head_dim, generator=torch.Generator().manual_seed(40 + parallel.rank))
    group = dist.group.WORLD
    assert group is not None
    ours = parallel.to_heads(local)
    theirs = ulysses_scatter_heads(local, group, async_comm=False)()
    back = parallel.to_tokens(ours)
    theirs_back = ulysses_gather_heads(theirs, group, num_heads=heads, async_comm=False)()
    return {
        "to_heads": torch.equal(ours, theirs),
        "to_tokens": torch.equal(back, theirs_back) and torch.equal(back, local),
    }


def run_group(world_size: int, spec: DiTSession | WorldSession, *, compare: bool = False) -> list[dict[str, Any]]:
    """Runs `spec` on `world_size` gloo ranks (spawned) and returns each rank's saved result."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    ranks = [
        context.Process(target=rank_main, args=(rank, world_size, port, spec, compare), name=f"cp-rank{rank}")
        for rank in range(world_size)
    ]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=_JOIN_S)
    for process in ranks:
        if process.is_alive():
            process.kill()
            process.join()
    codes = [process.exitcode for process in ranks]
    assert codes == [0] * world_size, f"ranks exited with {codes}"
    return [torch.load(spec.out / f"rank{rank}.pt", weights_only=False) for rank in range(world_size)]
