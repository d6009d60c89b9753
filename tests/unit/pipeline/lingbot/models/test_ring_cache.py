"""The copy-free KV cache (issue #32): a ring after the sink, keys rotated at absolute frames, the sink moved on a
re-base. Proved against the sliding cache it replaced (tests/support/sliding_kv_cache.py) over long sessions that
evict every chunk and re-base several times, and held to its memory: the same buffers all session long, and a chunk
start that moves no cached key (the sink's keys on a re-base only)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pipeline.lingbot.models import TINY_DIT, CacheConfig, KVCache, LingBotFastDiT, TextKV, denoise_chunk
from pipeline.lingbot.models.workload import WorkloadCounter
from tests.support.lingbot_models import LATENT_H, LATENT_W, chunk_inputs, relative_error, text_context
from tests.support.sliding_kv_cache import sliding_cache

TABLE_64 = dataclasses.replace(TINY_DIT, rope_frames=64)
"""A short RoPE table: a 42-chunk session (126 latent frames) re-bases 3 times (a shift of 30 frames)."""
CHUNKS = 42


def _model(tiny_model: LingBotFastDiT) -> LingBotFastDiT:
    model = LingBotFastDiT(TABLE_64)
    model.load_state_dict(tiny_model.state_dict())
    return model


def _session(model: LingBotFastDiT, cache: KVCache, chunks: int) -> list[torch.Tensor]:
    text: TextKV = model.encode_text(text_context(model.config))
    generator = torch.Generator().manual_seed(3)
    return [
        denoise_chunk(model, cache, text, chunk.condition, chunk.noise, generator, chunk.control)
        for chunk in chunk_inputs(model.config, chunks)
    ]


@pytest.mark.parametrize(("window", "sink"), [(9, 3), (10, 3)], ids=["ring-of-whole-chunks", "ring-wraps-in-a-chunk"])
def test_the_ring_equals_the_sliding_cache_over_42_chunks_with_3_rebases(
    tiny_model: LingBotFastDiT, window: int, sink: int
) -> None:
    model = _model(tiny_model)
    config = CacheConfig(window_frames=window, sink_frames=sink)
    ring = model.new_cache(config, LATENT_H, LATENT_W)
    ours = _session(model, ring, CHUNKS)
    theirs = _session(model, sliding_cache(model, config, LATENT_H, LATENT_W), CHUNKS)
    stats = ring.statistics()
    assert stats.rebases == 3
    assert stats.evicted_frames == 3 * CHUNKS - window
    full = window // 3  # chunks before the first eviction: attention over the same keys in the same order
    for before, (a, b) in enumerate(zip(ours[:full], theirs[:full], strict=True)):
        assert torch.equal(a, b), f"chunk {before}"
    errors = [relative_error(a, b) for a, b in zip(ours, theirs, strict=True)]
    assert max(errors) <= 1e-6, errors


def test_a_session_keeps_its_buffers_and_a_chunk_start_moves_no_cached_key(tiny_model: LingBotFastDiT) -> None:
    """Memory constant: the same K/V and angle buffers (address, shape) from the first chunk to the last. Eviction
    writes over the ring's oldest frames, so a chunk start touches no cached key (a slide would move every frame
    after the sink); a re-base rotates the sink's keys, and only those. Neither syncs with or copies from the host."""
    model = _model(tiny_model)
    config = CacheConfig(window_frames=9, sink_frames=3)
    cache = model.new_cache(config, LATENT_H, LATENT_W)
    text = model.encode_text(text_context(TABLE_64))
    sink = config.sink_frames * cache.frame_tokens
    layout: list[tuple[int, tuple[int, ...]]] = []
    rebases = 0
    for chunk in chunk_inputs(TABLE_64, CHUNKS):
        before = [(layer.k.clone(), layer.v.clone()) for layer in cache.layers]
        rebased = cache.statistics().rebases
        with torch.inference_mode(), WorkloadCounter() as counter:
            slot = cache.begin_chunk()
        assert counter.workload().syncs == counter.workload().host_to_device == 0
        if cache.statistics().rebases > rebased:
            rebases += 1
            moved = [
                not torch.equal(layer.k[:, :sink], k[:, :sink])
                for layer, (k, _) in zip(cache.layers, before, strict=True)
            ]
            assert all(moved), "a re-base rotates the sink's keys"
        for layer, (k, v) in zip(cache.layers, before, strict=True):
            assert torch.equal(layer.k[:, sink:], k[:, sink:])
            assert torch.equal(layer.v, v)
        buffers = [t for layer in cache.layers for t in (layer.k, layer.v)] + list(cache.chunk_angles(slot))
        layout = layout or [(t.data_ptr(), tuple(t.shape)) for t in buffers]
        assert [(t.data_ptr(), tuple(t.shape)) for t in buffers] == layout
        with torch.inference_mode():  # one t = 0 pass per chunk fills the cache with the model's keys
            model(torch.cat([chunk.noise, chunk.condition], dim=1), torch.zeros(1), text, cache, slot, chunk.control)
    assert rebases == 3
    assert cache.statistics().stored_frames == 9


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu-check.sh runs it on one)")
def test_on_cuda_a_chunks_start_and_forwards_never_synchronise_with_the_host(tiny_model: LingBotFastDiT) -> None:
    """What the meta counter pins, on a real stream: with CUDA's sync debug mode set to raise, 14 chunks of the ring
    cache (eviction from the 4th, a re-base from the 11th) run their `begin_chunk` and all 5 forwards, and the
    frames stay finite. The chunk's inputs and timesteps are put on the device before, as the sampler does once."""
    model = _model(tiny_model).to("cuda")
    cache = model.new_cache(CacheConfig(window_frames=9, sink_frames=3), LATENT_H, LATENT_W)
    text = model.encode_text(text_context(TABLE_64).cuda())
    timesteps = torch.tensor([999.0, 957.0, 899.0, 702.0, 0.0], device="cuda")
    with torch.inference_mode():
        for chunk in chunk_inputs(TABLE_64, 14):
            latents = torch.cat([chunk.noise, chunk.condition], dim=1).cuda()
            control = chunk.control.cuda()
            camera = model.camera_modulation(control)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                slot = cache.begin_chunk()
                outputs = [
                    model(latents, timesteps[step : step + 1], text, cache, slot, camera=camera) for step in range(5)
                ]
            finally:
                torch.cuda.set_sync_debug_mode("default")
            assert all(bool(torch.isfinite(out).all()) for out in outputs)
    assert cache.statistics().rebases >= 1
