"""The four-step Fast sampler: its schedule, its arithmetic and one chunk's denoise with the clean cache pass."""

from __future__ import annotations

import pytest
import torch

from pipeline.lingbot.models import (
    FAST_SCHEDULE,
    TINY_DIT,
    CacheConfig,
    FastSchedule,
    LingBotFastDiT,
    ModelConfigError,
    denoise_chunk,
    fast_schedule,
    sample_chunk,
)
from tests.support.lingbot_models import LATENT_H, LATENT_W, chunk_inputs, text_context


def test_fast_schedule_has_the_published_timesteps_and_sigmas() -> None:
    assert FAST_SCHEDULE.timesteps == (999, 957, 899, 702)
    assert FAST_SCHEDULE.x0_sigmas == pytest.approx((0.99979985, 0.95799279, 0.89980382, 0.70240670), abs=1e-7)
    assert FAST_SCHEDULE.renoise_sigmas == pytest.approx((0.95771992, 0.89941138, 0.70240670), abs=1e-7)


def test_fast_schedule_matches_the_reference_scheduler_lookups() -> None:
    unipc = pytest.importorskip("telefuser.schedulers.unipc", reason="the oracle's scheduler (telefuser, diffusers)")
    scheduler = unipc.FlowUniPCMultistepScheduler(num_train_timesteps=1000, shift=1, use_dynamic_shifting=False)
    scheduler.set_timesteps(1000, shift=5.0)
    timesteps = scheduler.timesteps[[0, 179, 358, 679]]
    assert tuple(int(t) for t in timesteps) == FAST_SCHEDULE.timesteps
    x0 = [float(scheduler.sigmas[torch.argmin((scheduler.timesteps - t).abs())]) for t in timesteps]
    renoise = [float(scheduler.sigmas[scheduler.index_for_timestep(t)]) for t in timesteps[1:]]
    assert FAST_SCHEDULE.x0_sigmas == tuple(x0)
    assert FAST_SCHEDULE.renoise_sigmas == tuple(renoise)


def test_schedule_indices_outside_the_table_are_refused() -> None:
    with pytest.raises(ModelConfigError):
        fast_schedule((0, 1000))
    with pytest.raises(ModelConfigError):
        FastSchedule(timesteps=(1, 2), x0_sigmas=(0.5,), renoise_sigmas=())


def test_sample_chunk_predicts_x0_and_renoises_with_the_generator() -> None:
    """With a constant velocity the arithmetic can be followed by hand."""
    seen: list[float] = []

    def predict(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        seen.append(float(t[0]))
        return torch.ones_like(x)

    noise = torch.randn(1, 2, 1, 2, 2, generator=torch.Generator().manual_seed(1))
    result = sample_chunk(predict, noise, torch.Generator().manual_seed(2))
    replay = torch.Generator().manual_seed(2)
    x = noise
    for step in range(4):
        x0 = x - FAST_SCHEDULE.x0_sigmas[step]
        if step < 3:
            sigma = FAST_SCHEDULE.renoise_sigmas[step]
            x = (1 - sigma) * x0 + sigma * torch.randn(x.shape, generator=replay)
    assert seen == [999.0, 957.0, 899.0, 702.0]
    torch.testing.assert_close(result, x0, rtol=1e-6, atol=1e-6)


def test_denoise_chunk_leaves_the_clean_pass_keys_in_the_cache(tiny_model: LingBotFastDiT) -> None:
    """The slot ends up holding the K/V of a t = 0 pass over the chunk's x0, not those of a noisy step."""
    chunk = chunk_inputs(TINY_DIT, 1)[0]
    text = tiny_model.encode_text(text_context(TINY_DIT))
    cache = tiny_model.new_cache(CacheConfig(), LATENT_H, LATENT_W)
    x0 = denoise_chunk(tiny_model, cache, text, chunk.condition, chunk.noise, torch.Generator().manual_seed(0))
    fresh = tiny_model.new_cache(CacheConfig(), LATENT_H, LATENT_W)
    with torch.inference_mode():
        slot = fresh.begin_chunk()
        tiny_model(torch.cat([x0, chunk.condition], dim=1), torch.zeros(1), text, fresh, slot)
    for ours, clean in zip(cache.layers, fresh.layers, strict=True):
        assert torch.equal(ours.k, clean.k)
        assert torch.equal(ours.v, clean.v)
    assert cache.statistics().chunks == 1


def test_denoising_is_reproducible_for_a_seed(tiny_model: LingBotFastDiT) -> None:
    chunk = chunk_inputs(TINY_DIT, 1)[0]
    text = tiny_model.encode_text(text_context(TINY_DIT))
    results = []
    for _ in range(2):
        cache = tiny_model.new_cache(CacheConfig(), LATENT_H, LATENT_W)
        generator = torch.Generator().manual_seed(42)
        results.append(denoise_chunk(tiny_model, cache, text, chunk.condition, chunk.noise, generator, chunk.control))
    assert torch.equal(results[0], results[1])
    assert results[0].dtype == torch.float32
    assert results[0].shape == chunk.noise.shape


def test_the_sampler_copies_its_sigmas_to_the_device_once_per_chunk_not_per_step() -> None:
    from pipeline.lingbot.models.workload import WorkloadCounter

    def predict(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)

    counter = WorkloadCounter()
    with torch.inference_mode(), counter:
        sample_chunk(predict, torch.zeros(1, 16, 3, 4, 6, device="meta"), None)
    assert len(FAST_SCHEDULE.renoise_sigmas) == 3
    assert counter.workload().host_to_device == 1
    assert counter.workload().syncs == 1


def test_the_device_schedule_table_gives_the_python_numbers_results_bit_for_bit(tiny_model: LingBotFastDiT) -> None:
    """The sampler as it was (a timestep filled from a Python number per step, x0's sigma a Python float) and as it
    is (both read from the chunk's device table) give equal x0 on the tiny model: the same float32 values."""
    chunk = chunk_inputs(TINY_DIT, 1)[0]
    text = tiny_model.encode_text(text_context(TINY_DIT))
    cache = tiny_model.new_cache(CacheConfig(), LATENT_H, LATENT_W)
    with torch.inference_mode():
        slot = cache.begin_chunk()

        def predict(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            velocity: torch.Tensor = tiny_model(torch.cat([x, chunk.condition], dim=1), t, text, cache, slot)
            return velocity

        ours = sample_chunk(predict, chunk.noise, torch.Generator().manual_seed(4))
        generator = torch.Generator().manual_seed(4)
        x = chunk.noise.float()
        for step, t in enumerate(FAST_SCHEDULE.timesteps):
            velocity = predict(x, torch.full((1,), float(t), dtype=torch.float32))
            before = (x.double() - FAST_SCHEDULE.x0_sigmas[step] * velocity.double()).float()
            if step < 3:
                renoise = torch.tensor(FAST_SCHEDULE.renoise_sigmas[step], dtype=torch.float32)
                x = (1 - renoise) * before + renoise * torch.randn(x.shape, generator=generator)
    assert torch.equal(ours, before)


def test_a_chunk_copies_from_the_host_once_and_its_forwards_never_sync() -> None:
    """The whole chunk (the camera modulation, 4 steps, the clean pass) on the tiny model on `meta`, which keeps
    device rules as CUDA does: one host-to-device copy (the schedule's table), no scalar read, no device-to-host
    copy; and one forward alone: none at all (its RoPE angles are the cache's, made by `begin_chunk`)."""
    from pipeline.lingbot.models.workload import WorkloadCounter, count_forward

    with torch.device("meta"):
        model = LingBotFastDiT(TINY_DIT)
    cache = model.new_cache(CacheConfig(window_frames=9, sink_frames=3), LATENT_H, LATENT_W)
    with torch.inference_mode():
        text = model.encode_text(torch.zeros(1, TINY_DIT.text_len, TINY_DIT.text_dim, device="meta"))
        for _ in range(3):
            cache.begin_chunk()
    shape = (1, 3, LATENT_H, LATENT_W)
    noise, condition = torch.zeros(1, 16, *shape[1:], device="meta"), torch.zeros(1, 20, *shape[1:], device="meta")
    control = torch.zeros(1, TINY_DIT.control_map_channels, *shape[1:], device="meta")
    with torch.inference_mode(), WorkloadCounter() as counter:
        denoise_chunk(model, cache, text, condition, noise, None, control)
    chunk = counter.workload()
    assert chunk.kernels_by_op["addmm"] > 5 * 2 * TINY_DIT.num_layers  # the forwards ran under the counter
    assert (chunk.host_to_device, chunk.scalar_reads, chunk.device_to_host, chunk.syncs) == (1, 0, 0, 1)
    forward = count_forward(TINY_DIT, width=8 * LATENT_W, height=8 * LATENT_H, dit=model, camera_cached=True)
    assert (forward.host_to_device, forward.syncs) == (0, 0)
