"""`BindingCore` and `BindingLifecycle` on their own: state moves, task ownership, the grace timer, frames, status,
closing. The bindings' own tests cover the same machinery through LiveKit and aiortc."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
import pytest

from pipeline.bidirectional import ChunkOutput, ChunkPart
from pipeline.clock import MonotonicClock
from tests.support.fakes.transport_port import FakeSessionPort, make_chunk
from tests.support.fakes.transport_timers import FakeTimers
from tests.support.waits import until
from transport.base import ChunkStatus, DoneStatus, ErrorStatus, StateStatus, StatusMessage
from transport.protocol import ProtocolError, decode_status
from transport.session.binding import (
    TERMINAL_BINDING_STATES,
    BindingCore,
    BindingLifecycle,
    BindingState,
    PartFeed,
    TransitionTable,
)
from transport.session.outbox import Outbound, encode_outbound
from transport.session.pacing import PacedFrame, frame_pts, is_repeat_pts

NEW, LIVE, OVER, CLOSED = BindingState.NEW, BindingState.LIVE, BindingState.OVER, BindingState.CLOSED

TABLE: TransitionTable = {
    NEW: frozenset({LIVE, CLOSED}),
    LIVE: frozenset({OVER, CLOSED}),
    OVER: frozenset({CLOSED}),
    CLOSED: frozenset(),
}


@dataclass(frozen=True, slots=True)
class Settings:
    ring_frames: int = 8
    reanchor_after: float = 0.5
    idle_frame_interval: float = 0.0
    status_max_bytes: int = 4096
    status_flush_timeout: float = 1.0


class FakeLink:
    """A `StatusLink` whose readiness the test sets; it records what was sent."""

    def __init__(self, *, ready: bool = True) -> None:
        self.ready = ready
        self.sent: list[Outbound] = []
        self._changed = asyncio.Event()

    @property
    def link_ready(self) -> bool:
        return self.ready

    async def wait_link_ready(self) -> None:
        while not self.ready:
            self._changed.clear()
            await self._changed.wait()

    async def send_status(self, message: Outbound) -> None:
        self.sent.append(message)
        self._changed.set()

    async def wait_sent(self, count: int) -> list[StatusMessage]:
        async with asyncio.timeout(5):
            while len(self.sent) < count:
                self._changed.clear()
                await self._changed.wait()
        decoded = [decode_status(message.payload) for message in self.sent]
        statuses = [status for status in decoded if not isinstance(status, ProtocolError)]
        assert len(statuses) == len(decoded), f"the binding sent a status the client cannot decode: {decoded}"
        return statuses


class FailingPort(FakeSessionPort):
    def client_gone(self, reason: str) -> None:
        super().client_gone(reason)
        raise RuntimeError("the session is already gone")


class FrameTaker:
    """The binding's side of the frame sink: records every due frame and says whether a connection took it."""

    def __init__(self) -> None:
        self.frames: list[PacedFrame] = []
        self.accept: list[bool] = []  # answers for the next frames; then every frame is taken
        self.seen = asyncio.Event()

    def deliver(self, frame: PacedFrame) -> bool:
        self.frames.append(frame)
        self.seen.set()
        return self.accept.pop(0) if self.accept else True

    async def wait_frames(self, count: int) -> list[PacedFrame]:
        async with asyncio.timeout(5):
            while len(self.frames) < count:
                self.seen.clear()
                await self.seen.wait()
        return self.frames


@dataclass
class Rig:
    core: BindingCore
    port: FakeSessionPort
    timers: FakeTimers
    link: FakeLink
    frames: FrameTaker
    expired: list[str]


def _rig(port: FakeSessionPort | None = None, *, ready: bool = True, settings: Settings | None = None) -> Rig:
    port = port if port is not None else FakeSessionPort("s1", fps=50.0)
    timers = FakeTimers()
    link = FakeLink(ready=ready)
    frames = FrameTaker()
    expired: list[str] = []
    core = BindingCore(
        port,
        kind="test",
        task_prefix="t",
        settings=settings if settings is not None else Settings(),
        transitions=TABLE,
        timers=timers,
        clock=MonotonicClock(),
        link=link,
        deliver=frames.deliver,
        encode=encode_outbound,
        on_grace_expired=expired.append,
        reply_to="controller",
    )
    return Rig(core, port, timers, link, frames, expired)


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    rig = _rig()
    rig.core.move(LIVE)
    yield rig
    await rig.core.aclose("test over")


# -- lifecycle ------------------------------------------------------------------------------------------------------


async def test_a_legal_move_changes_the_state_and_wakes_a_waiter_for_live() -> None:
    lifecycle = BindingLifecycle("test", "s1", TABLE)
    assert lifecycle.state is NEW
    waiter = asyncio.create_task(lifecycle.wait_live())
    await asyncio.sleep(0)
    assert not waiter.done()
    lifecycle.move(LIVE)
    async with asyncio.timeout(5):
        await waiter
    assert not lifecycle.ended
    lifecycle.move(OVER)
    assert lifecycle.ended
    assert not lifecycle.closed


def test_an_illegal_move_raises_with_a_sentence_and_changes_nothing() -> None:
    lifecycle = BindingLifecycle("test", "s1", TABLE)
    with pytest.raises(RuntimeError, match=r"test binding of session 's1' cannot move from BindingState.NEW to .*OVER"):
        lifecycle.move(OVER)
    assert lifecycle.state is NEW


def test_closed_is_terminal() -> None:
    lifecycle = BindingLifecycle("test", "s1", TABLE)
    lifecycle.move(CLOSED)
    assert lifecycle.closed
    assert lifecycle.state in TERMINAL_BINDING_STATES
    for state in BindingState:
        with pytest.raises(RuntimeError, match="cannot move"):
            lifecycle.move(state)


def test_a_state_without_a_row_is_never_entered() -> None:
    lifecycle = BindingLifecycle("test", "s1", TABLE)
    with pytest.raises(RuntimeError, match="cannot move"):
        lifecycle.move(BindingState.JOINING)


def test_a_table_that_is_not_coherent_is_refused() -> None:
    with pytest.raises(ValueError, match="terminal state"):
        BindingLifecycle("test", "s1", {**TABLE, CLOSED: frozenset({LIVE})})
    with pytest.raises(ValueError, match="no row"):
        BindingLifecycle("test", "s1", {NEW: frozenset({LIVE})})
    with pytest.raises(ValueError, match="no row"):
        BindingLifecycle("test", "s1", {LIVE: frozenset({CLOSED}), CLOSED: frozenset()})


# -- tasks ----------------------------------------------------------------------------------------------------------


async def test_a_failed_task_is_logged_with_its_session_and_the_others_go_on(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    async def boom() -> None:
        raise ValueError("kaput")

    release = asyncio.Event()
    finished = asyncio.Event()

    async def steady() -> None:
        await release.wait()
        finished.set()

    with caplog.at_level(logging.ERROR, logger="transport.session.binding"):
        failing = rig.core.spawn(boom(), "boom")
        rig.core.spawn(steady(), "steady")
        await asyncio.wait([failing])
        await asyncio.sleep(0)  # the done callback runs on the next turn
    assert failing.get_name() == "t-boom:s1"
    (record,) = [r for r in caplog.records if "failed" in r.getMessage()]
    assert record.getMessage() == "session s1: task t-boom:s1 failed"
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], ValueError)
    assert rig.core.statistics().tasks == 1
    release.set()
    async with asyncio.timeout(5):
        await finished.wait()


async def test_close_cancels_and_awaits_every_task(rig: Rig) -> None:
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    task = rig.core.spawn(forever(), "forever")
    rig.core.start_serving()
    await asyncio.sleep(0)
    assert rig.core.statistics().tasks == 5
    assert await rig.core.aclose("detached")
    assert cancelled.is_set()
    assert task.cancelled()
    assert rig.core.statistics().tasks == 0
    assert rig.core.state is CLOSED


async def test_spawning_after_close_raises_and_closes_the_coroutine(rig: Rig) -> None:
    await rig.core.aclose("detached")

    async def late() -> None:
        await asyncio.sleep(0)

    coro = late()
    with pytest.raises(RuntimeError, match="is closed; not starting late"):
        rig.core.spawn(coro, "late")
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED


async def test_concurrent_closes_close_once() -> None:
    rig = _rig()
    rig.core.move(LIVE)
    rig.core.start_serving()
    results = await asyncio.gather(rig.core.aclose("one"), rig.core.aclose("two"))
    assert sorted(results) == [False, True]
    assert rig.core.state is CLOSED
    assert await rig.core.aclose("three") is False


# -- grace timer and the end of the client ---------------------------------------------------------------------------


async def test_grace_expiry_reaches_the_binding_with_its_reason(rig: Rig) -> None:
    rig.core.start_timer(5.0, "the client left")
    assert rig.core.statistics().timer_pending
    rig.timers.advance(5.0)
    assert rig.expired == ["the client left"]
    assert not rig.core.statistics().timer_pending


async def test_a_cancelled_grace_never_reaches_the_binding(rig: Rig) -> None:
    rig.core.start_timer(5.0, "the client left")
    rig.core.cancel_timer()
    rig.timers.advance(60.0)
    assert rig.expired == []


async def test_a_grace_that_expires_after_the_end_is_ignored(rig: Rig) -> None:
    rig.core.over("the room finished")
    rig.core.start_timer(5.0, "the client left")  # e.g. started by a late event
    rig.timers.advance(5.0)
    assert rig.expired == []


async def test_close_cancels_the_grace(rig: Rig) -> None:
    rig.core.start_timer(5.0, "the client left")
    await rig.core.aclose("detached")
    assert rig.timers.live == []
    rig.timers.advance(60.0)
    assert rig.expired == []


async def test_over_stops_the_grace_and_tells_the_session_once(rig: Rig) -> None:
    rig.core.start_timer(5.0, "the client left")
    rig.core.over("the room finished")
    rig.core.over("again")
    assert rig.core.state is OVER
    assert rig.port.gone == ["the room finished"]
    assert rig.timers.live == []


async def test_a_failing_client_gone_is_logged_and_the_binding_is_still_over(caplog: pytest.LogCaptureFixture) -> None:
    rig = _rig(FailingPort("s1"))
    rig.core.move(LIVE)
    with caplog.at_level(logging.ERROR, logger="transport.session.binding"):
        rig.core.over("the client left")
    assert rig.core.state is OVER
    assert rig.port.gone == ["the client left"]
    assert any(r.getMessage() == "session s1: client_gone failed" for r in caplog.records)
    assert await rig.core.aclose("detached")


# -- frames and status ----------------------------------------------------------------------------------------------


async def test_due_frames_go_to_deliver_or_count_as_unsent(rig: Rig) -> None:
    rig.frames.accept.extend([False, True])  # no connection for the first frame, one for the second
    rig.core.start_serving()
    rig.port.emit_chunk(make_chunk(0, first_frame_index=0, count=2, width=32, height=24, fps=50.0))
    frames = await rig.frames.wait_frames(2)
    stats = rig.core.statistics()
    assert [frame.frame_index for frame in frames] == [0, 1]
    assert (stats.frames_unsent, stats.frames_delivered) == (1, 1)
    assert stats.pacer.frames_sent == 2


async def test_idle_repeats_reach_the_connection_but_count_and_stamp_nothing() -> None:
    rig = _rig(settings=Settings(idle_frame_interval=0.02))
    rig.core.move(LIVE)
    try:
        rig.core.start_serving()
        rig.port.emit_chunk(make_chunk(0, first_frame_index=0, count=1, width=32, height=24, fps=50.0))
        rig.port.emit_status(ChunkStatus(0, 3, ("w",), {}))
        frames = await rig.frames.wait_frames(3)  # the frame, then repeats of it while nothing new comes
        assert [(frame.frame_index, frame.repeat) for frame in frames[:3]] == [(0, False), (0, True), (0, True)]
        stats = rig.core.statistics()
        assert (stats.frames_delivered, stats.frames_unsent, stats.pacer.frames_sent) == (1, 0, 1)
        assert stats.pacer.idle_frames_sent >= 2
        rig.port.emit_status(ChunkStatus(1, 4, ("a",), {}))  # held until chunk 1's first frame goes out
        rig.port.emit_chunk(make_chunk(1, first_frame_index=1, count=2, width=32, height=24, fps=50.0))
        statuses = await rig.link.wait_sent(2)
        first_of_1 = next(frame for frame in rig.frames.frames if frame.frame_index == 1)
        assert statuses[1] == ChunkStatus(1, 4, ("a",), {}, first_frame_pts=frame_pts(first_of_1, 50.0))
        first = frame_pts(frames[0], 50.0)
        assert statuses[0] == ChunkStatus(0, 3, ("w",), {}, first_frame_pts=first)
        repeats = [frame_pts(frame, 50.0) for frame in rig.frames.frames if frame.repeat]
        assert all(is_repeat_pts(pts, first, 50.0) for pts in repeats)
        async with asyncio.timeout(5):
            while not any(frame.frame_index == 2 for frame in rig.frames.frames):
                rig.frames.seen.clear()
                await rig.frames.seen.wait()
        assert rig.core.statistics().frames_delivered == 3
    finally:
        await rig.core.aclose("test over")


async def test_relayed_states_are_remembered_and_replies_go_to_the_controller(rig: Rig) -> None:
    rig.core.start_serving()
    assert rig.core.last_state is None
    rig.port.emit_status(StateStatus("running"))
    assert await rig.link.wait_sent(1) == [StateStatus("running")]
    assert rig.core.last_state == StateStatus("running")
    assert rig.link.sent[0].destination is None
    rig.core.reply(ErrorStatus("bad_message", "nope"))
    assert (await rig.link.wait_sent(2))[1] == ErrorStatus("bad_message", "nope")
    assert rig.link.sent[1].destination == "controller"
    assert rig.link.sent[1].reliable


async def test_close_lets_the_final_done_out_when_the_link_is_ready(rig: Rig) -> None:
    rig.core.start_serving()
    rig.port.emit_status(DoneStatus("closed"))  # published just before the session detaches
    assert await rig.core.aclose("closed")
    assert [decode_status(message.payload) for message in rig.link.sent] == [DoneStatus("closed")]


async def test_close_does_not_wait_for_a_link_that_is_down() -> None:
    rig = _rig(ready=False)
    rig.core.move(LIVE)
    rig.core.start_serving()
    rig.port.emit_status(DoneStatus("closed"))
    async with asyncio.timeout(Settings().status_flush_timeout / 2):  # no flush: well within the flush timeout
        assert await rig.core.aclose("closed")
    assert rig.link.sent == []


async def test_a_chunk_status_that_comes_after_its_first_frame_was_paced_is_still_stamped(rig: Rig) -> None:
    rig.core.start_serving()
    rig.port.emit_chunk(make_chunk(0, first_frame_index=0, count=1, width=32, height=24, fps=50.0))
    (frame,) = await rig.frames.wait_frames(1)  # paced at once: the relay had not seen the chunk's status yet
    rig.port.emit_status(ChunkStatus(0, 3, ("w",), {}))
    (status,) = await rig.link.wait_sent(1)
    assert status == ChunkStatus(0, 3, ("w",), {}, first_frame_pts=round(frame.media_index * 90000 / 50.0))


# -- progressive decode: a chunk's parts ahead of it ------------------------------------------------------------------


def _part(chunk: ChunkOutput, offset: int, count: int) -> ChunkPart:
    frames = chunk.frames[offset : offset + count]
    return ChunkPart(chunk.session_id, chunk.index, frames, chunk.fps, chunk.first_frame_index + offset, offset)


def test_the_part_feed_paces_each_frame_once_whatever_part_was_lost() -> None:
    chunk = make_chunk(1, first_frame_index=9, count=12, width=8, height=8)
    feed = PartFeed()
    first = feed.next(_part(chunk, 0, 4))
    assert first is not None
    assert first.first_frame_index == 9
    assert feed.next(_part(chunk, 0, 4)) is None  # the same part again
    assert feed.next(_part(chunk, 8, 4)) is None  # the part at 4 was lost: this one does not continue the chunk
    rest = feed.next(chunk)
    assert isinstance(rest, ChunkPart)
    assert (rest.offset, rest.first_frame_index, len(rest.frames)) == (4, 13, 8)
    assert np.array_equal(rest.frames, chunk.frames[4:])
    assert feed.next(_part(chunk, 4, 4)) is None  # late: the whole chunk brought it
    complete = make_chunk(2, first_frame_index=21, count=12, width=8, height=8)
    for offset in (0, 4, 8):
        assert feed.next(_part(complete, offset, 4)) is not None
    assert feed.next(complete) is None  # every frame came in parts
    whole = make_chunk(3, first_frame_index=33, count=12, width=8, height=8)
    assert feed.next(whole) is whole  # no parts: the whole chunk
    assert feed.next(_part(make_chunk(4, first_frame_index=45, count=12, width=8, height=8), 4, 4)) is None


async def test_a_chunks_first_part_is_paced_before_the_chunk_comes_and_its_status_is_stamped_with_it(rig: Rig) -> None:
    rig.core.start_serving()
    chunk = make_chunk(0, first_frame_index=0, count=6, width=32, height=24, fps=50.0)
    rig.port.emit_chunk(_part(chunk, 0, 2))
    frames = await rig.frames.wait_frames(2)  # paced while the rest of the chunk is still being decoded
    assert [frame.frame_index for frame in frames] == [0, 1]
    rig.port.emit_chunk(_part(chunk, 2, 2))
    rig.port.emit_chunk(chunk)
    rig.port.emit_status(ChunkStatus(0, 3, ("w",), {}))
    frames = await rig.frames.wait_frames(6)
    assert [frame.frame_index for frame in frames] == [0, 1, 2, 3, 4, 5]  # each once, in order
    assert rig.core.statistics().pacer.frames_in == 6
    (status,) = await rig.link.wait_sent(1)
    assert status == ChunkStatus(0, 3, ("w",), {}, first_frame_pts=round(frames[0].media_index * 90000 / 50.0))


async def test_the_port_is_told_each_chunk_whose_frames_all_left_the_pacer_sent_or_not(rig: Rig) -> None:
    rig.frames.accept.extend([False, False, True])  # no connection at first: the client's clock moves on anyway
    rig.core.start_serving()
    rig.port.emit_chunk(make_chunk(0, first_frame_index=0, count=2, width=32, height=24, fps=50.0))
    rig.port.emit_chunk(make_chunk(1, first_frame_index=2, count=2, width=32, height=24, fps=50.0))
    await rig.frames.wait_frames(4)
    await until(lambda: rig.port.deliveries == [0, 1], "both chunks reported delivered")
    assert rig.core.statistics().frames_unsent == 2
