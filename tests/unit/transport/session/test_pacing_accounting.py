"""The pacer's accounting on a hand-built timeline: every frame in is counted once (sent, dropped late, pushed out
of the ring, or rejected), and the grid, media timeline and lateness figures are exact. The configuration's bounds
are checked at their edges."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.fakes.transport_port import make_frames
from transport.errors import TransportConfigError
from transport.session.pacing import PacedFrame, PacingConfig, PacingCore, SendFrame, WaitUntil

W, H = 8, 6
FPS = 8.0  # a period of 0.125 s: exact in binary


def _sent(decision: SendFrame | WaitUntil) -> PacedFrame:
    assert isinstance(decision, SendFrame), decision
    return decision.frame


def test_every_frame_is_accounted_for_and_the_grid_is_exact() -> None:
    core = PacingCore(PacingConfig(fps=FPS, width=W, height=H, ring_frames=4, reanchor_after=0.5))
    assert core.push_chunk(make_frames(0, 3, W, H), first_frame_index=0, chunk_index=0, now=0.0) == 3

    first = _sent(core.poll(0.0))  # anchors the grid at 0
    assert (first.frame_index, first.media_index, first.deadline) == (0, 0, 0.0)
    assert core.poll(0.0) == WaitUntil(0.125)
    assert _sent(core.poll(0.125)).media_index == 1
    late = _sent(core.poll(0.3))  # 50 ms behind slot 2: less than a period, nothing dropped
    assert (late.frame_index, late.media_index, late.deadline) == (2, 2, 0.25)
    assert core.poll(0.375) == WaitUntil(None)

    # An underrun: the next frames arrive at 0.7, long after slot 3 (0.375) came due. The grid re-anchors at 0.7
    # and the media timeline continues by the wall time elapsed on the old grid: floor(0.7 * 8) = 5 slots.
    assert core.push_chunk(make_frames(3, 2, W, H), first_frame_index=3, chunk_index=1, now=0.7) == 2
    resumed = _sent(core.poll(0.7))
    assert (resumed.frame_index, resumed.media_index, resumed.deadline) == (3, 5, 0.7)

    # Four more into a ring of four that holds frame 4: frame 4 is pushed out (the newest frames win).
    assert core.push_chunk(make_frames(5, 4, W, H), first_frame_index=5, chunk_index=2, now=0.7) == 4
    # 0.26 s behind slot 1 (0.825): two slots missed, so frames 5 and 6 are dropped late and 7 goes in slot 3.
    caught_up = _sent(core.poll(1.085))
    assert (caught_up.frame_index, caught_up.media_index) == (7, 5 + 3)
    assert caught_up.deadline == pytest.approx(0.7 + 3 * 0.125)
    # A stall of 0.8 s (over reanchor_after): the newest frame is kept, and the grid re-anchors at 2.0 after
    # floor((2.0 - 0.7) * 8) = 10 slots of media time.
    stalled = _sent(core.poll(2.0))
    assert (stalled.frame_index, stalled.media_index, stalled.deadline) == (8, 15, 2.0)
    # Late again, by 0.26 s behind slot 1: two more frames dropped late (the count adds up).
    core.push_chunk(make_frames(9, 3, W, H), first_frame_index=9, chunk_index=3, now=2.0)
    assert _sent(core.poll(2.385)).frame_index == 11

    # Frames of the wrong shape are rejected, counted per frame the caller meant to send.
    assert core.push_chunk(np.zeros(3, np.uint8), first_frame_index=9, chunk_index=3, now=2.0) == 0
    assert core.push_chunk(np.zeros((2, H, W), np.uint8), first_frame_index=12, chunk_index=4, now=2.0) == 0
    assert core.push_chunk(np.array(7, np.uint8), first_frame_index=14, chunk_index=5, now=2.0) == 0
    assert core.push(np.zeros((H, W, 4), np.uint8), frame_index=15, chunk_index=6, now=2.0) is False

    stats = core.statistics()
    assert (stats.frames_in, stats.frames_sent, stats.dropped_late, stats.dropped_overflow, stats.rejected_size) == (
        3 + 2 + 4 + 3 + 3 + 2 + 1 + 1,
        7,
        4,
        1,
        3 + 2 + 1 + 1,
    )
    assert (stats.underruns, stats.reanchors, stats.pending) == (1, 2, 0)
    assert stats.max_lateness == pytest.approx(0.05)
    assert stats.frames_in == stats.frames_sent + stats.dropped_late + stats.dropped_overflow + stats.rejected_size
    assert core.push_chunk(make_frames(16, 2, W, H), first_frame_index=16, chunk_index=7, now=2.0) == 2
    assert core.clear() == 2
    assert core.pending == 0


def test_a_frame_arriving_exactly_at_its_deadline_is_not_an_underrun() -> None:
    core = PacingCore(PacingConfig(fps=FPS, width=W, height=H))
    core.push_chunk(make_frames(0, 1, W, H), first_frame_index=0, chunk_index=0, now=0.0)
    _sent(core.poll(0.0))
    core.push_chunk(make_frames(1, 1, W, H), first_frame_index=1, chunk_index=0, now=0.125)  # just in time
    assert _sent(core.poll(0.125)).media_index == 1
    core.push_chunk(make_frames(2, 1, W, H), first_frame_index=2, chunk_index=0, now=0.375)  # exactly a slot late
    resumed = _sent(core.poll(0.375))
    stats = core.statistics()
    assert (stats.underruns, stats.reanchors) == (1, 1)  # a whole slot late: the grid moves to the arrival
    assert (resumed.deadline, resumed.media_index) == (0.375, 3)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"fps": 240.5}, r"fps must be in \(0, 240\], got 240.5"),
        ({"fps": 0.0}, "fps must be in"),
        ({"fps": float("inf")}, "fps must be in"),
        ({"width": 0}, "frame size must be positive, got 0x6"),
        ({"height": 0}, "frame size must be positive, got 8x0"),
        ({"ring_frames": 0}, "ring_frames must be at least 1, got 0"),
        ({"reanchor_after": 0.0}, "reanchor_after must be positive, got 0.0"),
    ],
)
def test_pacing_config_refuses_values_past_its_bounds(settings: dict[str, float], message: str) -> None:
    values: dict[str, float] = {"fps": FPS, "width": W, "height": H, **settings}
    with pytest.raises(TransportConfigError, match=message):
        PacingConfig(**values)  # type: ignore[arg-type]


def test_pacing_config_accepts_its_bounds() -> None:
    PacingConfig(fps=240.0, width=1, height=1, ring_frames=1, reanchor_after=1e-3)
