"""The just-in-time chunk schedule, driven step by step on a fake time line."""

from __future__ import annotations

import itertools
import math

import pytest

from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.errors import SessionConfigError
from pipeline.lingbot.policy.playout import PlayoutConfig, PlayoutScheduler

FPS = 16.0


def run_chunk(scheduler: PlayoutScheduler, now: float, generation_s: float, frames: int) -> float:
    """Start a chunk at its due time (or `now`, if later), finish it `generation_s` later; return that time."""
    start = max(now, scheduler.due())
    scheduler.started(start)
    ready_at = start + generation_s
    scheduler.ready(ready_at, frames)
    return ready_at


def test_the_first_chunk_starts_at_once_and_plays_as_soon_as_it_is_ready() -> None:
    scheduler = PlayoutScheduler(PlayoutConfig(fps=FPS))
    assert scheduler.due() == -math.inf
    scheduler.started(10.0)
    playout = scheduler.ready(10.1, 9)
    assert playout.starts_at == 10.1
    assert playout.ends_at == pytest.approx(10.1 + 9 / FPS)
    assert playout.lead_s == 0.0
    assert playout.underrun_frames == 0


def test_the_next_chunk_is_due_p95_plus_margin_before_playback_ends() -> None:
    config = PlayoutConfig(fps=FPS, min_margin_s=0.03, max_margin_s=0.25, margin_fraction=0.5)
    scheduler = PlayoutScheduler(config)
    scheduler.started(0.0)
    scheduler.ready(0.1, 12)
    end = 0.1 + 12 / FPS
    assert scheduler.playout_end == pytest.approx(end)
    assert scheduler.margin() == pytest.approx(0.05)
    assert scheduler.due() == pytest.approx(end - 0.1 - 0.05)


def test_the_margin_is_bounded_both_ways() -> None:
    config = PlayoutConfig(fps=FPS, min_margin_s=0.03, max_margin_s=0.25, margin_fraction=0.5)
    fast = PlayoutScheduler(config)
    fast.started(0.0)
    fast.ready(0.001, 12)
    assert fast.margin() == 0.03
    slow = PlayoutScheduler(config)
    slow.started(0.0)
    slow.ready(2.0, 12)
    assert slow.margin() == 0.25


def test_fast_generation_is_never_more_than_the_margin_ahead_of_playback() -> None:
    scheduler = PlayoutScheduler(PlayoutConfig(fps=FPS))
    now = 0.0
    for _ in range(50):
        now = run_chunk(scheduler, now, 0.02, 12)
    stats = scheduler.statistics()
    assert stats.underruns == 0
    assert stats.max_lead_s <= stats.margin_s + 1e-9
    assert stats.max_lead_s == pytest.approx(0.03)


def test_steady_generation_plays_back_to_back_without_underruns() -> None:
    scheduler = PlayoutScheduler(PlayoutConfig(fps=FPS))
    now = run_chunk(scheduler, 0.0, 0.1, 9)
    ends: list[float] = [scheduler.playout_end or 0.0]
    for _ in range(20):
        now = run_chunk(scheduler, now, 0.1, 12)
        ends.append(scheduler.playout_end or 0.0)
    assert all(b - a == pytest.approx(12 / FPS) for a, b in itertools.pairwise(ends))
    assert scheduler.statistics().underruns == 0


def test_an_idle_gap_is_not_made_up_and_is_no_underrun() -> None:
    scheduler = PlayoutScheduler(PlayoutConfig(fps=FPS))
    now = run_chunk(scheduler, 0.0, 0.1, 9)
    now = run_chunk(scheduler, now, 0.1, 12)
    # Idle for 10 s: playback ended long ago. The next chunk starts at once and plays as soon as it is ready.
    resumed = now + 10.0
    assert scheduler.due() < resumed
    scheduler.started(resumed)
    playout = scheduler.ready(resumed + 0.1, 12)
    assert playout.starts_at == pytest.approx(resumed + 0.1)
    assert playout.lead_s == 0.0
    assert playout.underrun_frames == 0
    # ... and the one after it is scheduled from the new end, not from any older media time.
    assert scheduler.due() == pytest.approx(playout.ends_at - 0.1 - 0.05)
    assert scheduler.statistics().underruns == 0


def test_slow_generation_underruns_are_counted_in_frames() -> None:
    scheduler = PlayoutScheduler(PlayoutConfig(fps=FPS))
    now = run_chunk(scheduler, 0.0, 0.1, 12)
    end = scheduler.playout_end
    assert end is not None
    # Started in time (before playback ends) but ready 0.2 s after it ended: 0.2 s * 16 fps = 4 slots stood still.
    scheduler.started(max(now, scheduler.due()))
    playout = scheduler.ready(end + 0.2, 12)
    assert playout.underrun_s == pytest.approx(0.2)
    assert playout.underrun_frames == 4
    assert playout.starts_at == pytest.approx(end + 0.2)
    stats = scheduler.statistics()
    assert (stats.underruns, stats.underrun_frames, stats.chunks, stats.frames) == (1, 4, 2, 24)


def test_generation_slower_than_real_time_underruns_every_chunk() -> None:
    scheduler = PlayoutScheduler(PlayoutConfig(fps=FPS))
    now = 0.0
    for _ in range(10):
        now = run_chunk(scheduler, now, 1.0, 12)  # 1 s for 0.75 s of video
    stats = scheduler.statistics()
    assert stats.underruns == 9
    assert stats.underrun_frames == 9 * 4


def test_chunk_size_one_schedules_four_frame_chunks_just_in_time() -> None:
    scheduler = PlayoutScheduler(PlayoutConfig(fps=FPS))
    now = run_chunk(scheduler, 0.0, 0.04, 1)  # chunk 0 of chunk_size 1 is a single frame
    for _ in range(40):
        now = run_chunk(scheduler, now, 0.04, 4)
    stats = scheduler.statistics()
    assert stats.underruns == 0
    assert stats.max_lead_s == pytest.approx(0.03)
    end = scheduler.playout_end
    assert end is not None
    assert end - now == pytest.approx(4 / FPS + 0.03)


def test_each_start_is_one_chunk_ready_completes_the_oldest_and_abandon_forgets_the_newest() -> None:
    scheduler = PlayoutScheduler(PlayoutConfig(fps=FPS))
    with pytest.raises(RuntimeError, match="without started"):
        scheduler.ready(1.0, 12)
    scheduler.started(1.0)
    scheduler.started(1.5)
    scheduler.started(1.7)
    scheduler.abandon()  # the newest (1.7) was not generated: paused while it waited for the lease
    assert scheduler.in_flight == 2
    scheduler.ready(2.0, 12)  # the oldest, started at 1.0
    assert scheduler.generation_p95() == pytest.approx(1.0)
    scheduler.ready(2.9, 12)  # then the one started at 1.5: 1.4 s
    assert scheduler.generation_p95() == pytest.approx(1.0 + 0.95 * 0.4)  # the p95 of 1.0 and 1.4
    scheduler.started(3.0)
    scheduler.started(3.1)
    scheduler.abandon_all()  # a re-seed: neither will be ready
    assert scheduler.in_flight == 0


def test_with_a_chunk_in_flight_the_next_is_dated_from_where_its_playback_should_end() -> None:
    config = PlayoutConfig(fps=FPS, min_margin_s=0.05, max_margin_s=0.05)
    slow = PlayoutScheduler(config)  # 1.2 s to generate 0.75 s of video: the next chunk starts during this one
    slow.started(0.0)
    slow.ready(1.2, 12)
    slow.started(1.2)
    # expected ready 1.2 + 1.2 = 2.4 (after the stream's end at 1.95), playback to 3.15; due 3.15 - 1.2 - 0.05
    assert slow.due(frames_in_flight=12) == pytest.approx(1.9)
    assert slow.due(frames_in_flight=12) < 1.2 + 1.2  # before the chunk in flight is ready: the overlap
    fast = PlayoutScheduler(config)  # 0.3 s per 0.75 s chunk: nothing changes, the next starts after it is ready
    fast.started(0.0)
    fast.ready(0.3, 12)
    fast.started(0.3)
    # the stream ends at 1.05; expected ready 0.6 plays from 1.05 to 1.8; due 1.8 - 0.3 - 0.05
    assert fast.due(frames_in_flight=12) == pytest.approx(1.45)
    assert fast.due(frames_in_flight=12) > 0.3 + 0.3


def test_a_chunk_started_while_another_is_generated_continues_the_stream() -> None:
    scheduler = PlayoutScheduler(PlayoutConfig(fps=FPS))
    scheduler.started(0.0)  # chunk 0
    scheduler.started(0.1)  # chunk 1, while chunk 0 is generated: the stream is meant to go on after chunk 0
    assert scheduler.ready(1.0, 12).underrun_frames == 0  # chunk 0 plays 1.0 .. 1.75
    late = scheduler.ready(2.0, 12)  # chunk 1 came 0.25 s after the stream ran dry
    assert late.underrun_s == pytest.approx(0.25)
    assert late.underrun_frames == 4


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"fps": 0.0}, "fps"),
        ({"min_margin_s": 0.3, "max_margin_s": 0.2}, "min_margin_s"),
        ({"margin_fraction": -1.0}, "margin_fraction"),
        ({"window": 0}, "window"),
    ],
)
def test_invalid_configs_are_rejected(overrides: dict[str, float], match: str) -> None:
    values: dict[str, float] = {"fps": FPS, **overrides}
    with pytest.raises(ValueError, match=match):
        PlayoutConfig(**values)  # type: ignore[arg-type]


def test_the_session_config_selects_the_schedule_by_name() -> None:
    assert LingBotSessionConfig().schedule == "just_in_time"
    assert LingBotSessionConfig.from_mapping({"schedule": "media_clock"}).schedule == "media_clock"
    with pytest.raises(SessionConfigError, match="schedule must be one of"):
        LingBotSessionConfig.from_mapping({"schedule": "asap"})


def test_a_chunk_in_parts_plays_from_its_first_part_and_is_timed_by_when_it_could_start_without_a_stall() -> None:
    scheduler = PlayoutScheduler(PlayoutConfig(fps=FPS))
    scheduler.started(0.0)
    # Parts of 4 frames (0.25 s each) at 0.1, 0.3 and 0.5 s: each comes before the frames before it have played.
    playout = scheduler.ready(0.5, 12, parts=[(0.1, 4), (0.3, 4), (0.5, 4)])
    assert playout.starts_at == 0.1
    assert playout.ends_at == pytest.approx(0.1 + 12 / FPS)
    assert playout.underrun_frames == 0
    # It could have started as late as 0.1 s after it began (the first part), not 0.5 s (the whole chunk); the margin
    # stays half the whole chunk's generation time (0.25 s), not of its first part's (0.05 s).
    assert scheduler.generation_p95() == pytest.approx(0.1)
    assert scheduler.margin() == pytest.approx(0.25)
    assert scheduler.due() == pytest.approx(playout.ends_at - 0.1 - 0.25)


def test_a_part_that_comes_after_the_frames_before_it_played_is_an_underrun() -> None:
    scheduler = PlayoutScheduler(PlayoutConfig(fps=FPS))
    scheduler.started(0.0)
    playout = scheduler.ready(1.0, 8, parts=[(0.1, 4), (1.0, 4)])  # the first 4 frames end at 0.35 s
    assert playout.underrun_s == pytest.approx(0.65)
    assert playout.underrun_frames == math.ceil(0.65 * FPS)
    assert playout.ends_at == pytest.approx(1.0 + 4 / FPS)
    assert scheduler.generation_p95() == pytest.approx(1.0 - 4 / FPS)  # start it 0.75 s in and nothing stalls
    assert scheduler.statistics().underruns == 1


def test_a_continuing_chunk_whose_first_part_comes_late_stalls_only_until_that_part() -> None:
    scheduler = PlayoutScheduler(PlayoutConfig(fps=FPS))
    scheduler.started(0.0)
    scheduler.ready(0.1, 4)  # plays 0.1 .. 0.35
    scheduler.started(0.2)
    playout = scheduler.ready(0.6, 8, parts=[(0.4, 4), (0.6, 4)])
    assert playout.starts_at == 0.4
    assert playout.underrun_s == pytest.approx(0.05)
    assert playout.ends_at == pytest.approx(0.4 + 8 / FPS)
    scheduler.started(0.7)
    with pytest.raises(ValueError, match="more than the chunk"):
        scheduler.ready(0.8, 4, parts=[(0.7, 8)])
