"""Keep-warm on a fake clock: an idle stream repeats its last frame at the configured rate, off the timestamp grid,
and stops the moment a generated frame comes; repeats never reorder, delay or count as generated frames."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest

from tests.support.fakes.clock import FakeClock
from tests.support.fakes.transport_port import make_chunk, make_frames
from transport.embedded.rtc import PacedVideoTrack
from transport.errors import TransportConfigError
from transport.session.pacing import (
    REPEAT_PTS_OFFSET,
    FramePacer,
    PacedFrame,
    PacingConfig,
    PacingCore,
    SendFrame,
    WaitUntil,
    frame_pts,
    is_repeat_pts,
    slot_pts,
)

W, H, FPS = 8, 6, 16.0
PERIOD = 1 / FPS
IDLE = 0.25


def _core(idle: float = IDLE) -> PacingCore:
    return PacingCore(PacingConfig(fps=FPS, width=W, height=H, idle_frame_interval=idle))


def _push(core: PacingCore, first: int, count: int, now: float, chunk: int) -> None:
    core.push_chunk(make_frames(first, count, W, H), first_frame_index=first, chunk_index=chunk, now=now)


def _run(core: PacingCore, clock: FakeClock, until: float) -> list[tuple[float, PacedFrame]]:
    """Poll like the driver, sleeping exactly to each deadline, until `until` (fake) seconds."""
    sent: list[tuple[float, PacedFrame]] = []
    while clock.now() <= until:
        decision = core.poll(clock.now())
        if isinstance(decision, SendFrame):
            sent.append((clock.now(), decision.frame))
            continue
        if decision.deadline is None or decision.deadline > until:
            break
        clock.advance(max(0.0, decision.deadline - clock.now()))
    return sent


def test_repeats_start_after_the_interval_and_come_at_its_rate() -> None:
    clock = FakeClock(10.0)
    core = _core()
    _push(core, 0, 3, clock.now(), chunk=0)
    sent = _run(core, clock, until=10.0 + 2 * PERIOD + 1.0)
    real, repeats = sent[:3], sent[3:]
    assert [frame.repeat for _, frame in real] == [False] * 3
    last_real_at = real[-1][0]
    assert [at - last_real_at for at, _ in repeats] == pytest.approx([IDLE, 2 * IDLE, 3 * IDLE, 4 * IDLE])
    # Each repeat shows the last generated frame and names it (frame and chunk), on the slot of its own time.
    for at, frame in repeats:
        assert frame.repeat
        assert (frame.frame_index, frame.chunk_index) == (2, 0)
        np.testing.assert_array_equal(frame.image, real[-1][1].image)
        assert frame.media_index == round((at - 10.0) * FPS)
    stats = core.statistics()
    assert (stats.frames_sent, stats.idle_frames_sent) == (3, 4)


def test_nothing_is_repeated_before_the_first_frame_or_when_off() -> None:
    assert _core().poll(0.0) == WaitUntil(None)
    clock = FakeClock()
    core = _core(idle=0.0)
    _push(core, 0, 2, clock.now(), chunk=0)
    assert len(_run(core, clock, until=5.0)) == 2
    assert core.poll(clock.now() + 60.0) == WaitUntil(None)
    assert core.statistics().idle_frames_sent == 0


def test_a_generated_frame_stops_the_repeats_at_once_without_waiting_for_a_slot() -> None:
    clock = FakeClock()
    core = _core()
    _push(core, 0, 1, clock.now(), chunk=0)
    sent = _run(core, clock, until=2 * IDLE)  # the frame and two repeats
    assert [frame.repeat for _, frame in sent] == [False, True, True]
    clock.advance(0.01)  # well inside the slot the last repeat took
    _push(core, 1, 2, clock.now(), chunk=1)
    decision = core.poll(clock.now())
    assert isinstance(decision, SendFrame)
    assert (decision.frame.frame_index, decision.frame.repeat) == (1, False)
    assert decision.frame.media_index > sent[-1][1].media_index
    # From there the new chunk is paced on a grid anchored at its first frame, and repeats wait for a new idle gap.
    waiting = core.poll(clock.now())
    assert isinstance(waiting, WaitUntil)
    assert waiting.deadline == pytest.approx(clock.now() + PERIOD)
    assert core.repeat_due == pytest.approx(clock.now() + IDLE)


def test_a_repeat_never_goes_out_ahead_of_a_waiting_frame() -> None:
    clock = FakeClock()
    core = _core()
    _push(core, 0, 1, clock.now(), chunk=0)
    _run(core, clock, until=0.0)
    clock.advance(IDLE + 0.1)  # the repeat is overdue when the next chunk lands
    _push(core, 1, 2, clock.now(), chunk=1)
    sent = _run(core, clock, until=clock.now() + PERIOD)
    assert [(frame.frame_index, frame.repeat) for _, frame in sent] == [(1, False), (2, False)]
    assert core.statistics().idle_frames_sent == 0


def test_timestamps_only_grow_and_only_repeats_are_off_the_grid() -> None:
    clock = FakeClock(3.0)
    core = _core()
    sent: list[tuple[float, PacedFrame]] = []
    index = 0
    for chunk, (count, rest) in enumerate([(4, 0.9), (1, 0.3), (3, 0.26), (2, 0.0), (4, 1.3)]):
        _push(core, index, count, clock.now(), chunk=chunk)
        index += count
        sent += _run(core, clock, until=clock.now() + count * PERIOD + rest)
        clock.advance(max(0.0, sent[-1][0] + count * PERIOD + rest - clock.now()))
    pts = [frame_pts(frame, FPS) for _, frame in sent]
    assert pts == sorted(set(pts)), "presentation timestamps must strictly increase"
    reference = pts[0]
    assert [is_repeat_pts(p, reference, FPS) for p in pts] == [frame.repeat for _, frame in sent]
    assert any(frame.repeat for _, frame in sent)
    for (at, frame), (next_at, following) in itertools.pairwise(sent):  # timestamps follow wall time
        ticks = slot_pts(following.media_index, FPS) - slot_pts(frame.media_index, FPS)
        assert abs(ticks / 90_000 - (next_at - at)) <= PERIOD + 1e-9


@pytest.mark.parametrize("fps", [1.0, 15.5, 16.0, 29.97, 60.0, 240.0])
def test_the_repeat_marker_is_told_apart_at_any_fps(fps: float) -> None:
    reference = slot_pts(7, fps)
    for index in (0, 1, 8, 1_000, 10_000_000):
        on_grid = PacedFrame(np.zeros((1, 1, 3), np.uint8), 0, 0, index, 0.0)
        repeat = PacedFrame(np.zeros((1, 1, 3), np.uint8), 0, 0, index, 0.0, repeat=True)
        assert not is_repeat_pts(frame_pts(on_grid, fps), reference, fps)
        assert is_repeat_pts(frame_pts(repeat, fps), reference, fps)
        assert frame_pts(repeat, fps) - frame_pts(on_grid, fps) == REPEAT_PTS_OFFSET


@pytest.mark.parametrize("interval", [-0.1, float("nan"), float("inf"), 61.0])
def test_an_invalid_idle_interval_is_refused(interval: float) -> None:
    with pytest.raises(TransportConfigError, match="idle_frame_interval"):
        PacingConfig(fps=FPS, width=W, height=H, idle_frame_interval=interval)


async def test_the_driver_repeats_while_idle_and_a_push_wakes_it_at_once() -> None:
    """The driver's wait for the next repeat ends the moment a chunk is pushed: the sleep it asked for is still
    pending (the test never ends it) when the chunk's first frame reaches the sink."""
    clock = FakeClock()
    requested: list[float] = []
    release = asyncio.Event()
    third_wait = asyncio.Event()

    async def sleep(delay: float) -> None:
        requested.append(delay)
        if len(requested) == 3:
            third_wait.set()
        if len(requested) <= 2:  # let the first two idle waits run out: two repeats
            clock.advance(delay)
            await asyncio.sleep(0)
            return
        await release.wait()  # the third never ends by itself

    pacer = FramePacer(PacingConfig(fps=FPS, width=W, height=H, idle_frame_interval=IDLE), clock=clock, sleep=sleep)
    received: list[PacedFrame] = []
    arrived = asyncio.Event()

    def sink(frame: PacedFrame) -> None:
        received.append(frame)
        arrived.set()

    task = asyncio.create_task(pacer.run(sink))
    pacer.push_chunk(make_chunk(0, first_frame_index=0, count=1, width=W, height=H))
    async with asyncio.timeout(5):
        await third_wait.wait()
    assert [(frame.frame_index, frame.repeat) for frame in received] == [(0, False), (0, True), (0, True)]
    assert requested == pytest.approx([IDLE, IDLE, IDLE])
    clock.advance(0.1)
    pacer.push_chunk(make_chunk(1, first_frame_index=1, count=1, width=W, height=H))
    async with asyncio.timeout(5):
        while len(received) < 4:
            arrived.clear()
            await arrived.wait()
    assert (received[3].frame_index, received[3].repeat) == (1, False)
    assert not release.is_set()
    stats = pacer.statistics()
    assert (stats.frames_sent, stats.idle_frames_sent) == (2, 2)
    pacer.close()
    async with asyncio.timeout(5):
        await task


async def test_a_generated_frame_replaces_repeats_still_queued_in_the_track() -> None:
    track = PacedVideoTrack(FPS)
    image = np.zeros((H, W, 3), np.uint8)
    track.offer(PacedFrame(image, 0, 0, 0, 0.0))
    track.offer(PacedFrame(image, 0, 0, 4, 0.25, repeat=True))
    track.offer(PacedFrame(image, 0, 0, 8, 0.5, repeat=True))
    track.offer(PacedFrame(image, 1, 1, 9, 0.56))
    pts = [(await track.recv()).pts for _ in range(2)]
    assert pts == [0, slot_pts(9, FPS)]
    assert track.dropped == 0
    track.offer(PacedFrame(image, 1, 1, 13, 0.8, repeat=True))
    assert (await track.recv()).pts == slot_pts(13, FPS) + REPEAT_PTS_OFFSET
    track.stop()
