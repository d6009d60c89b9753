"""Past the RoPE table: positions re-base, frames stay finite, the cache stays bounded; never a shape error.

The full-size table has 1024 frame positions (a chunk starting at latent frame >= 1022 runs off it); the tests
shrink the table (`rope_frames`) so a tiny session crosses it several times in a few chunks.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from pipeline.lingbot.models import (
    TINY_DIT,
    CacheConfig,
    KVCache,
    ModelContextExhaustedError,
    load_dit,
)
from tests.support.lingbot_models import chunk_inputs, relative_error, run_session

SHORT_TABLE = dataclasses.replace(TINY_DIT, rope_frames=15)


def test_the_full_size_table_rebases_the_chunk_that_would_start_at_frame_1023() -> None:
    cache = KVCache(TINY_DIT, CacheConfig(), frame_tokens=1)
    slots = [cache.begin_chunk() for _ in range(342)]
    assert slots[340].position == slots[340].first_frame == 1020
    assert slots[341].first_frame == 1023
    assert slots[341].position == 1023 - 510
    assert cache.statistics().rebases == 1


def test_without_a_sink_rebasing_changes_nothing(tiny_checkpoint: Path) -> None:
    """RoPE depends on position differences only: a session re-based twice equals one on a table that never ends."""
    inputs = chunk_inputs(TINY_DIT, 9)
    config = CacheConfig(window_frames=9, sink_frames=0)
    short, short_cache = run_session(load_dit(tiny_checkpoint, SHORT_TABLE), config, inputs)
    long, _ = run_session(load_dit(tiny_checkpoint, TINY_DIT), config, inputs)
    assert short_cache.statistics().rebases >= 2
    errors = [relative_error(a, b) for a, b in zip(short, long, strict=True)]
    assert max(errors) <= 1e-5, errors


def test_with_a_sink_a_session_runs_far_past_the_table_finite_and_bounded(tiny_checkpoint: Path) -> None:
    model = load_dit(tiny_checkpoint, SHORT_TABLE)
    config = CacheConfig(window_frames=9, sink_frames=3, rebase_frames=6)
    outputs, cache = run_session(model, config, chunk_inputs(TINY_DIT, 12))
    stats = cache.statistics()
    assert stats.next_frame == 36 > SHORT_TABLE.rope_frames * 2
    assert stats.rebases >= 3
    assert stats.stored_frames == 9
    assert stats.next_frame - stats.position_offset <= SHORT_TABLE.rope_frames
    assert all(torch.isfinite(x).all() for x in outputs)


def test_a_window_of_only_sink_and_one_chunk_rebases_with_nothing_to_move() -> None:
    """Window = sink + chunk: after eviction only the sink is cached when the table ends; the re-base moves no key
    (it used to reshape an empty slice and fail)."""
    cache = KVCache(SHORT_TABLE, CacheConfig(window_frames=6, sink_frames=3), frame_tokens=2)
    slots = [cache.begin_chunk() for _ in range(8)]
    assert cache.statistics().rebases >= 2
    assert all(slot.position + slot.frames <= SHORT_TABLE.rope_frames for slot in slots)


def test_a_cache_without_a_window_ends_with_model_context_exhausted() -> None:
    cache = KVCache(SHORT_TABLE, CacheConfig(window_frames=None, max_frames=30), frame_tokens=1)
    for _ in range(5):
        cache.begin_chunk()
    with pytest.raises(ModelContextExhaustedError, match="past the RoPE table") as raised:
        cache.begin_chunk()
    assert raised.value.reason == "model_context_exhausted"
