"""Frame pacing on a fake clock: absolute deadlines, drops when late, latest-wins overflow, size checks."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.support.fakes.clock import FakeClock
from tests.support.fakes.transport_port import make_chunk, make_frames
from transport.errors import TransportConfigError
from transport.session.pacing import FramePacer, PacedFrame, PacingConfig, PacingCore, SendFrame, WaitUntil

W, H, FPS = 8, 6, 16.0
PERIOD = 1 / FPS


def _core(**overrides: object) -> PacingCore:
    settings: dict[str, object] = {"fps": FPS, "width": W, "height": H, "ring_frames": 32, "reanchor_after": 0.5}
    settings.update(overrides)
    return PacingCore(PacingConfig(**settings))  # type: ignore[arg-type]


def _push(core: PacingCore, first: int, count: int, now: float, chunk: int = 0) -> int:
    return core.push_chunk(make_frames(first, count, W, H), first_frame_index=first, chunk_index=chunk, now=now)


def _run(
    core: PacingCore, clock: FakeClock, until: float, *, step_delay: float = 0.0
) -> list[tuple[float, PacedFrame]]:
    """Drive the core like the driver does: poll, sleep exactly to the deadline (plus `step_delay`), repeat."""
    sent: list[tuple[float, PacedFrame]] = []
    while clock.now() <= until:
        decision = core.poll(clock.now())
        if isinstance(decision, SendFrame):
            sent.append((clock.now(), decision.frame))
            continue
        if decision.deadline is None:
            break
        clock.advance(max(0.0, decision.deadline - clock.now()) + step_delay)
    return sent


def test_frames_go_out_on_absolute_deadlines_without_drift() -> None:
    clock = FakeClock(100.0)
    core = _core()
    _push(core, 0, 12, clock.now())
    sent = _run(core, clock, until=200)
    assert [f.frame_index for _, f in sent] == list(range(12))
    t0 = sent[0][0]
    for n, (at, frame) in enumerate(sent):
        assert frame.deadline == pytest.approx(t0 + n * PERIOD, abs=1e-12)
        assert at == pytest.approx(frame.deadline, abs=1e-12)
        assert frame.media_index == n


def test_sender_lateness_does_not_accumulate() -> None:
    # Every wake-up is 20 ms late (less than a frame): the grid stays put, nothing is dropped.
    clock = FakeClock()
    core = _core()
    _push(core, 0, 16, clock.now())
    sent = _run(core, clock, until=10, step_delay=0.020)
    assert len(sent) == 16
    t0 = sent[0][1].deadline
    assert [f.deadline for _, f in sent] == pytest.approx([t0 + n * PERIOD for n in range(16)])
    assert core.statistics().dropped_late == 0


def test_late_sender_drops_frames_of_missed_slots_and_keeps_its_grid() -> None:
    clock = FakeClock()
    core = _core()
    _push(core, 0, 10, clock.now())
    first = core.poll(clock.now())
    assert isinstance(first, SendFrame)
    clock.advance(3.5 * PERIOD)  # blocked for 3.5 frames: slots 1, 2, 3 are missed
    late = core.poll(clock.now())
    assert isinstance(late, SendFrame)
    assert late.frame.frame_index == 3  # frames 1 and 2 dropped; 3 is sent in slot 3 (now), not slowed down
    assert late.frame.media_index == 3
    assert late.frame.deadline == pytest.approx(3 * PERIOD)
    stats = core.statistics()
    assert stats.dropped_late == 2
    nxt = core.poll(clock.now())
    assert isinstance(nxt, WaitUntil)
    assert nxt.deadline == pytest.approx(4 * PERIOD)


def test_lateness_keeps_the_newest_waiting_frame() -> None:
    clock = FakeClock()
    core = _core()
    _push(core, 0, 3, clock.now())
    assert isinstance(core.poll(clock.now()), SendFrame)
    clock.advance(10 * PERIOD)
    late = core.poll(clock.now())
    assert isinstance(late, SendFrame)
    assert late.frame.frame_index == 2
    assert core.statistics().dropped_late == 1


def test_long_stall_reanchors_the_grid() -> None:
    clock = FakeClock()
    core = _core(reanchor_after=0.5, ring_frames=64)
    _push(core, 0, 40, clock.now())
    assert isinstance(core.poll(clock.now()), SendFrame)
    clock.advance(2.0 + 0.3 * PERIOD)
    resumed = core.poll(clock.now())
    assert isinstance(resumed, SendFrame)
    # The frames of the 31 missed slots are dropped (latency stays bounded) and the grid restarts at the stall's
    # end, while the media timeline advanced with wall time (2 s at 16 fps).
    assert resumed.frame.frame_index == 32
    assert resumed.frame.media_index == 32
    assert resumed.frame.deadline == pytest.approx(2.0 + 0.3 * PERIOD)
    nxt = core.poll(clock.now())
    assert isinstance(nxt, WaitUntil)
    assert nxt.deadline == pytest.approx(2.0 + 1.3 * PERIOD)
    stats = core.statistics()
    assert (stats.dropped_late, stats.reanchors) == (31, 1)


def test_underrun_reanchors_at_the_next_arrival_without_dropping() -> None:
    clock = FakeClock()
    core = _core()
    _push(core, 0, 4, clock.now())
    sent = _run(core, clock, until=10)
    assert len(sent) == 4
    clock.advance(0.5)  # generation is late: nothing to send for 0.5 s
    _push(core, 4, 4, clock.now(), chunk=1)
    resumed = _run(core, clock, until=20)
    assert [f.frame_index for _, f in resumed] == [4, 5, 6, 7]
    assert resumed[0][0] == pytest.approx(clock.now() - 3 * PERIOD)
    stats = core.statistics()
    assert (stats.dropped_late, stats.underruns, stats.reanchors) == (0, 1, 1)
    media = [f.media_index for _, f in sent + resumed]
    assert media == sorted(set(media))  # strictly increasing across the re-anchor


def test_overflow_drops_the_oldest_frames() -> None:
    clock = FakeClock()
    core = _core(ring_frames=8)
    _push(core, 0, 6, clock.now())
    _push(core, 6, 6, clock.now(), chunk=1)
    stats = core.statistics()
    assert (stats.dropped_overflow, stats.pending) == (4, 8)
    sent = _run(core, clock, until=10)
    assert [f.frame_index for _, f in sent] == list(range(4, 12))


def test_wrong_sized_frames_are_counted_and_skipped() -> None:
    clock = FakeClock()
    core = _core()
    assert not core.push(np.zeros((H, W + 1, 3), np.uint8), frame_index=0, chunk_index=0, now=0)
    assert not core.push(np.zeros((H, W, 3), np.float32), frame_index=1, chunk_index=0, now=0)
    assert not core.push(np.zeros((H, W, 4), np.uint8), frame_index=2, chunk_index=0, now=0)
    assert core.push(np.zeros((H, W, 3), np.uint8), frame_index=3, chunk_index=0, now=0)
    assert core.push_chunk(np.zeros((2, H + 2, W, 3), np.uint8), first_frame_index=4, chunk_index=1, now=0) == 0
    assert core.push_chunk(np.zeros((H, W, 3), np.uint8), first_frame_index=6, chunk_index=2, now=0) == 0
    stats = core.statistics()
    assert (stats.rejected_size, stats.pending) == (3 + 2 + H, 1)
    assert [f.frame_index for _, f in _run(core, clock, until=1)] == [3]


def test_empty_ring_waits_for_frames() -> None:
    assert _core().poll(0.0) == WaitUntil(None)


@pytest.mark.parametrize(
    "settings",
    [
        {"fps": 0},
        {"fps": float("nan")},
        {"width": 0},
        {"ring_frames": 0},
        {"reanchor_after": 0},
    ],
)
def test_invalid_pacing_config_is_refused(settings: dict[str, object]) -> None:
    values: dict[str, object] = {"fps": FPS, "width": W, "height": H}
    values.update(settings)
    with pytest.raises(TransportConfigError):
        PacingConfig(**values)  # type: ignore[arg-type]


async def test_driver_sends_every_frame_in_order_to_the_sink() -> None:
    clock = FakeClock()
    sleeps: list[float] = []

    async def sleep(delay: float) -> None:
        sleeps.append(delay)
        clock.advance(delay)
        await asyncio.sleep(0)

    pacer = FramePacer(PacingConfig(fps=FPS, width=W, height=H), clock=clock, sleep=sleep)
    received: list[PacedFrame] = []
    done = asyncio.Event()

    def sink(frame: PacedFrame) -> None:
        received.append(frame)
        if len(received) == 8:
            done.set()

    task = asyncio.create_task(pacer.run(sink))
    pacer.push_chunk(make_chunk(0, first_frame_index=0, count=5, width=W, height=H))
    pacer.push_chunk(make_chunk(1, first_frame_index=5, count=3, width=W, height=H))
    async with asyncio.timeout(5):
        await done.wait()
    pacer.close()
    async with asyncio.timeout(5):
        await task
    assert [f.frame_index for f in received] == list(range(8))
    assert [f.chunk_index for f in received] == [0] * 5 + [1] * 3
    assert [f.deadline for f in received] == pytest.approx([n * PERIOD for n in range(8)])
    assert sleeps == pytest.approx([PERIOD] * 7)
    assert pacer.statistics().frames_sent == 8


async def test_driver_survives_a_failing_sink() -> None:
    clock = FakeClock()

    async def sleep(delay: float) -> None:
        clock.advance(delay)
        await asyncio.sleep(0)

    pacer = FramePacer(PacingConfig(fps=FPS, width=W, height=H), clock=clock, sleep=sleep)
    seen: list[int] = []
    done = asyncio.Event()

    def sink(frame: PacedFrame) -> None:
        seen.append(frame.frame_index)
        if frame.frame_index == 1:
            raise RuntimeError("encoder hiccup")
        if frame.frame_index == 3:
            done.set()

    task = asyncio.create_task(pacer.run(sink))
    pacer.push_chunk(make_chunk(0, first_frame_index=0, count=4, width=W, height=H))
    async with asyncio.timeout(5):
        await done.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == [0, 1, 2, 3]
    assert pacer.sink_errors == 1
