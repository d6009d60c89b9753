"""Session metrics windows: they keep the newest `window` records in order once they wrap, build the records read
back exactly as recorded, and summarise only the samples still in the window."""

from __future__ import annotations

import gc

import pytest

from pipeline import IdleInterval, IdleReason, StageTiming, StreamingSessionMetrics
from pipeline.metrics import SampleWindow


def test_stage_timings_keep_the_newest_window_oldest_first_after_wrapping() -> None:
    metrics = StreamingSessionMetrics("s", window=3)
    for sequence_id in range(7):
        stage = "encode" if sequence_id % 2 else "decode"
        metrics.on_stage(stage, sequence_id, 0.5 * sequence_id, 0.5 * sequence_id + 0.1, sequence_id, sequence_id + 2)
    timings = metrics.stage_timings
    assert len(timings) == 3
    assert list(timings) == [
        StageTiming("decode", 4, 2.0, 2.1, 4.0, 6.0),
        StageTiming("encode", 5, 2.5, 2.6, 5.0, 7.0),
        StageTiming("decode", 6, 3.0, 3.1, 6.0, 8.0),
    ]
    assert timings[-1] == StageTiming("decode", 6, 3.0, 3.1, 6.0, 8.0)
    assert timings[0].sequence_id == 4
    assert [t.sequence_id for t in timings[1:]] == [5, 6]
    with pytest.raises(IndexError):
        timings[3]
    with pytest.raises(IndexError):
        timings[-4]


def test_an_empty_timing_window_is_falsy_and_has_no_newest() -> None:
    timings = StreamingSessionMetrics("s").stage_timings
    assert not timings
    with pytest.raises(IndexError):
        timings[-1]


def test_idle_intervals_read_back_their_stage_reason_and_detail_after_wrapping() -> None:
    metrics = StreamingSessionMetrics("s", window=2)
    metrics.on_idle("encode", 1.0, 2.0, IdleReason.MISSING_INPUT, "control")
    metrics.on_idle("decode", 2.0, 2.5, IdleReason.ACTOR_BUSY, None)
    metrics.on_idle("decode", 3.0, 3.0, IdleReason.ACTOR_BUSY, None)  # empty: not recorded
    metrics.on_idle("denoise", 4.0, 4.25, IdleReason.RESOURCE_GROUP, "gpu")
    assert metrics.idle_intervals == (
        IdleInterval("decode", 2.0, 2.5, IdleReason.ACTOR_BUSY, None),
        IdleInterval("denoise", 4.0, 4.25, IdleReason.RESOURCE_GROUP, "gpu"),
    )
    # the totals cover the whole life, not only the window
    assert metrics.snapshot().idle_by_reason == {"missing_input": 1.0, "actor_busy": 0.5, "resource_group": 0.25}


def test_a_sample_window_summarises_its_last_samples_and_the_lifetime_count_and_max() -> None:
    window = SampleWindow(4)
    for value in (100.0, 1.0, 2.0, 3.0, 4.0, 5.0):
        window.add(value)
    summary = window.summary()
    assert (summary.count, summary.max, summary.mean, summary.p50) == (6, 100.0, 3.5, 3.5)


def test_stage_durations_and_queued_times_are_summarised_per_stage_that_ran() -> None:
    metrics = StreamingSessionMetrics("s", window=8, stage_ids=("encode", "denoise", "decode"))
    metrics.on_stage("encode", 0, 0.0, 0.5, 1.0, 3.0)
    metrics.on_stage("encode", 1, 1.0, 1.25, 3.0, 4.0)
    metrics.on_stage("decode", 0, 3.0, 3.0, 3.5, 3.75)
    snapshot = metrics.snapshot()
    assert (snapshot.stage_durations["encode"].count, snapshot.stage_durations["encode"].mean) == (2, 1.5)
    assert snapshot.stage_queued["encode"].max == 0.5
    assert snapshot.stage_durations["decode"].max == 0.25
    assert set(snapshot.stage_durations) == set(snapshot.stage_queued) == {"encode", "decode"}  # denoise never ran


def test_filling_the_windows_adds_no_object_for_the_collector() -> None:
    metrics = StreamingSessionMetrics("s", window=256, stage_ids=("encode",))
    gc.collect()
    tracked = len(gc.get_objects())
    for sequence_id in range(200):
        metrics.on_stage("encode", sequence_id, 0.0, 0.0, 0.0, 1.0)
        metrics.on_idle("encode", 0.0, 1.0, IdleReason.EDGE_FULL, "a")
        metrics.on_output(sequence_id, float(sequence_id))
    assert len(metrics.stage_timings) == 200
    assert len(gc.get_objects()) <= tracked + 2  # the loop's own iterator at most, not one per record
