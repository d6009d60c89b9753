"""The rolling KV cache: bounded, sink kept, eviction equal to a cache that never evicts, memory estimate."""

from __future__ import annotations

import pytest
import torch

from pipeline.lingbot.errors import ModelSessionError
from pipeline.lingbot.models import (
    LINGBOT_FAST_14B,
    PUBLISHED_CACHE,
    TINY_DIT,
    CacheConfig,
    KVCache,
    LingBotFastDiT,
    ModelConfigError,
    ModelContextExhaustedError,
    bytes_per_session,
)
from tests.support.lingbot_models import LATENT_H, LATENT_W, chunk_inputs, run_session, text_context

FRAME_TOKENS = 2


def marked_cache(config: CacheConfig) -> KVCache:
    return KVCache(TINY_DIT, config, frame_tokens=FRAME_TOKENS)


def write_marks(cache: KVCache, chunks: int) -> list[list[int]]:
    """Writes each frame's absolute index into its keys and values (through the slot's write pieces, as a forward
    does); returns the frames the chunk attends to after each chunk, oldest first (the ring keeps no order)."""
    held = []
    for _ in range(chunks):
        slot = cache.begin_chunk()
        marks = torch.arange(slot.first_frame, slot.first_frame + slot.frames, dtype=torch.float32)
        marks = marks.repeat_interleave(FRAME_TOKENS).view(1, -1, 1, 1)
        taken = 0
        for start, tokens in slot.writes:
            for layer in cache.layers:
                layer.k[:, start : start + tokens] = marks[:, taken : taken + tokens]
                layer.v[:, start : start + tokens] = marks[:, taken : taken + tokens]
            taken += tokens
        frames = cache.layers[0].v[0, : slot.visible : FRAME_TOKENS, 0, 0]
        held.append(sorted(int(f) for f in frames))
    return held


def test_the_cache_never_exceeds_its_window_and_keeps_the_sink() -> None:
    cache = marked_cache(CacheConfig(chunk_frames=3, window_frames=9, sink_frames=2))
    shapes = {tuple(layer.k.shape) for layer in cache.layers}
    for step, frames in enumerate(write_marks(cache, 12)):
        stats = cache.statistics()
        assert stats.stored_frames <= 9
        assert len(frames) <= 9
        newest = 3 * step + 2
        assert frames[:2] == [0, 1] if newest >= 1 else True
        assert frames[-1] == newest
    assert {tuple(layer.k.shape) for layer in cache.layers} == shapes
    assert cache.statistics().evicted_frames == 36 - 9


def test_eviction_holds_the_sink_and_the_newest_frames_of_a_cache_that_never_evicts() -> None:
    window, sink = 8, 2
    windowed = write_marks(marked_cache(CacheConfig(chunk_frames=3, window_frames=window, sink_frames=sink)), 10)
    unbounded = write_marks(marked_cache(CacheConfig(chunk_frames=3, window_frames=None, max_frames=30)), 10)
    for held, everything in zip(windowed, unbounded, strict=True):
        if len(everything) <= window:
            assert held == everything
        else:
            assert held == everything[:sink] + everything[-(window - sink) :]


def clean_passes(model: LingBotFastDiT, config: CacheConfig, chunks: int) -> KVCache:
    """One t = 0 pass per chunk over fixed inputs (no sampler), so each call's input is the same in every run."""
    cache = model.new_cache(config, LATENT_H, LATENT_W)
    text = model.encode_text(text_context(TINY_DIT))
    with torch.inference_mode():
        for chunk in chunk_inputs(TINY_DIT, chunks):
            slot = cache.begin_chunk()
            latents = torch.cat([chunk.noise, chunk.condition], dim=1)
            model(latents, torch.zeros(1), text, cache, slot, chunk.control)
    return cache


def test_layer_zero_keys_equal_those_of_a_run_without_a_window(tiny_model: LingBotFastDiT) -> None:
    """Layer 0's K/V depend only on the call's own input: after evictions the windowed cache must hold exactly
    the sink's and the newest frames' K/V of a cache that never evicts (the newest in ring order)."""
    window, sink, frames = 9, 3, 18
    tokens = TINY_DIT.frame_tokens(LATENT_H, LATENT_W)
    windowed = clean_passes(tiny_model, CacheConfig(window_frames=window, sink_frames=sink), frames // 3)
    unbounded = clean_passes(tiny_model, CacheConfig(window_frames=None, max_frames=frames), frames // 3)
    ring = window - sink
    recent = range(frames - ring, frames)  # in the ring, frame f lies at sink + (f - sink) % ring
    kept_frames = [*range(sink), *sorted(recent, key=lambda f: (f - sink) % ring)]
    kept = torch.tensor([f * tokens + t for f in kept_frames for t in range(tokens)])
    assert windowed.statistics().evicted_frames == frames - window
    for name in ("k", "v"):
        ours = getattr(windowed.layers[0], name)
        reference = getattr(unbounded.layers[0], name)[:, kept]
        assert torch.equal(ours, reference)


def test_before_any_eviction_a_window_changes_nothing(tiny_model: LingBotFastDiT) -> None:
    inputs = chunk_inputs(TINY_DIT, 3)
    windowed, _ = run_session(tiny_model, CacheConfig(window_frames=9, sink_frames=3), inputs)
    unbounded, _ = run_session(tiny_model, CacheConfig(window_frames=None, max_frames=9), inputs)
    for a, b in zip(windowed, unbounded, strict=True):
        assert torch.equal(a, b)


def test_a_cache_without_a_window_refuses_the_chunk_that_does_not_fit() -> None:
    cache = marked_cache(CacheConfig(chunk_frames=3, window_frames=None, max_frames=6))
    cache.begin_chunk()
    cache.begin_chunk()
    with pytest.raises(ModelContextExhaustedError, match="has no window") as raised:
        cache.begin_chunk()
    assert raised.value.reason == "model_context_exhausted"


def test_only_the_newest_slot_may_be_used(tiny_model: LingBotFastDiT) -> None:
    cache = tiny_model.new_cache(CacheConfig(window_frames=9, sink_frames=3), 4, 6)
    old = cache.begin_chunk()
    cache.begin_chunk()
    with pytest.raises(ModelSessionError, match="stale"):
        cache.check_slot(old)


def test_a_chunk_longer_than_configured_is_refused() -> None:
    with pytest.raises(ModelSessionError, match=r"1\.\.3 latent frames"):
        marked_cache(CacheConfig(chunk_frames=3, window_frames=9, sink_frames=3)).begin_chunk(4)


@pytest.mark.parametrize(
    "values",
    [
        {"window_frames": 9, "sink_frames": 7},
        {"window_frames": None},
        {"window_frames": 9, "max_frames": 9},
        {"chunk_frames": 0},
        {"rebase_frames": 2},
    ],
)
def test_inconsistent_cache_configs_are_refused(values: dict[str, int | None]) -> None:
    with pytest.raises(ModelConfigError):
        CacheConfig(**values)  # type: ignore[arg-type]


def test_a_window_the_rope_table_cannot_hold_is_refused() -> None:
    with pytest.raises(ModelConfigError, match="re-base"):
        KVCache(TINY_DIT, CacheConfig(window_frames=1020, sink_frames=6), frame_tokens=1)


def test_memory_estimate_matches_the_published_figures() -> None:
    kv = 40 * 2 * 18 * 1560 * 5120 * 2
    text = 40 * 2 * 512 * 5120 * 2
    assert kv == 40 * 575_078_400
    assert bytes_per_session(LINGBOT_FAST_14B, 480, 832, torch.bfloat16, PUBLISHED_CACHE) == kv + text
    with pytest.raises(ModelConfigError):
        bytes_per_session(LINGBOT_FAST_14B, 484, 832, torch.bfloat16)


def test_memory_estimate_equals_what_a_session_allocates(tiny_model: LingBotFastDiT) -> None:
    config = CacheConfig(window_frames=9, sink_frames=3)
    _, cache = run_session(tiny_model, config, chunk_inputs(TINY_DIT, 1))
    text = tiny_model.encode_text(torch.zeros(1, TINY_DIT.text_len, TINY_DIT.text_dim))
    allocated = cache.statistics().nbytes + text.nbytes
    assert bytes_per_session(TINY_DIT, 32, 48, torch.float32, config) == allocated
