from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.lingbot.chunks import (
    ChunkPlan,
    frame_num_for_duration,
    frame_num_for_latent_frames,
    latent_frames_for,
    validate_frame_num,
)
from pipeline.lingbot.errors import ChunkContractError


def test_latent_frames_follow_four_n_plus_one() -> None:
    assert latent_frames_for(1) == 1
    assert latent_frames_for(5) == 2
    assert latent_frames_for(81) == 21
    assert frame_num_for_latent_frames(21) == 81


def test_frame_num_not_four_n_plus_one_names_neighbours() -> None:
    with pytest.raises(ChunkContractError, match=r"frame_num 50 is not 4n\+1; nearest valid: 49 or 53"):
        validate_frame_num(50)


def test_frame_num_below_one_names_smallest_valid() -> None:
    with pytest.raises(ChunkContractError, match="smallest valid: 1"):
        validate_frame_num(0)


def test_frame_num_must_be_int() -> None:
    with pytest.raises(ChunkContractError, match="must be an int"):
        validate_frame_num(True)


def test_plan_names_whole_chunk_neighbours_when_not_a_multiple() -> None:
    # 53 frames = 14 latent frames; chunk_size 3 wants 12 (45 frames) or 15 (57 frames).
    with pytest.raises(ChunkContractError, match=r"nearest valid: 45 \(12 latent frames\) or 57 \(15 latent frames\)"):
        ChunkPlan.create(53, 3)


def test_plan_rejecting_non_4n1_names_neighbours_for_the_chunk_size() -> None:
    with pytest.raises(ChunkContractError, match=r"nearest valid: 49 or 53; nearest valid for chunk_size 3: 45 or 57"):
        ChunkPlan.create(50, 3)


def test_default_chunking_frame_counts() -> None:
    plan = ChunkPlan.create(4 * (3 * 4 - 1) + 1, 3)  # 45 frames, 12 latent frames, 4 chunks
    assert (plan.latent_frames, plan.num_chunks, plan.truncated) == (12, 4, False)
    assert [plan.frames_in_chunk(i) for i in range(4)] == [9, 12, 12, 12]
    assert [plan.first_frame_of_chunk(i) for i in range(4)] == [0, 9, 21, 33]
    assert plan.latent_range(2) == (6, 9)


def test_short_clip_is_truncated_to_one_chunk() -> None:
    plan = ChunkPlan.create(5, 3)  # 2 latent frames < chunk_size 3
    assert plan.truncated
    assert (plan.chunk_size, plan.requested_chunk_size, plan.num_chunks) == (2, 3, 1)
    assert plan.frames_in_chunk(0) == 5


def test_chunk_index_outside_plan_is_rejected_with_range() -> None:
    plan = ChunkPlan.create(21, 3)  # 6 latent frames, 2 chunks
    with pytest.raises(ChunkContractError, match=r"valid 0\.\.1"):
        plan.frames_in_chunk(2)


def test_inconsistent_plan_constructor_is_rejected() -> None:
    with pytest.raises(ChunkContractError):
        ChunkPlan(frame_num=45, chunk_size=2, requested_chunk_size=3)


@given(chunk_size=st.integers(1, 8), chunks=st.integers(1, 60))
def test_chunks_tile_the_clip_exactly(chunk_size: int, chunks: int) -> None:
    frame_num = frame_num_for_latent_frames(chunk_size * chunks)
    plan = ChunkPlan.create(frame_num, chunk_size)
    assert plan.num_chunks == chunks
    total = 0
    for index in range(chunks):
        assert plan.first_frame_of_chunk(index) == total
        assert plan.chunk_of_frame(total) == index
        total += plan.frames_in_chunk(index)
        assert plan.chunk_of_frame(total - 1) == index
    assert total == frame_num


def test_duration_ten_minutes_at_defaults() -> None:
    assert frame_num_for_duration(600, 16, 3) == 9597  # 800 chunks, 599.8 s


def test_duration_shorter_than_one_chunk_gives_one_chunk() -> None:
    assert frame_num_for_duration(0.1, 16, 3) == 9


@given(seconds=st.floats(0.05, 3600), fps=st.integers(1, 60), chunk_size=st.integers(1, 8))
def test_duration_is_the_largest_whole_chunk_count_that_fits(seconds: float, fps: int, chunk_size: int) -> None:
    frame_num = frame_num_for_duration(seconds, fps, chunk_size)
    plan = ChunkPlan.create(frame_num, chunk_size)
    assert not plan.truncated
    one_chunk = frame_num_for_latent_frames(chunk_size)
    if frame_num > one_chunk:
        assert frame_num <= seconds * fps + 1e-6
    assert frame_num + 4 * chunk_size > seconds * fps


@pytest.mark.parametrize(("seconds", "fps", "chunk_size"), [(0, 16, 3), (-1, 16, 3), (float("nan"), 16, 3), (1, 0, 3)])
def test_duration_rejects_bad_input(seconds: float, fps: int, chunk_size: int) -> None:
    with pytest.raises(ChunkContractError):
        frame_num_for_duration(seconds, fps, chunk_size)
