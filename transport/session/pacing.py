"""Frame pacing: generated chunks in, one frame at a time out, on absolute deadlines.

Generation produces frames in bursts (a chunk of T frames at once); a video track wants them one by one at the
session's fps. `PacingCore` decides, without awaiting anything and on an injected clock, which frame goes out when:
frame slots sit on the absolute grid `t0 + n / fps` of a monotonic clock (no drift, no jitter from the time spent
sending), late frames are dropped instead of slowing the stream down, and a stalled stream re-anchors its grid.
Between generation and sending sits a small ring of pending frames with a latest-wins overflow policy. `FramePacer`
is the thin asyncio driver that sleeps until each deadline and hands frames to a sink.

Keep-warm: a stream that stops (nothing held, a paused session, generation behind) would send no frames at all, and
a receiver resynchronises after such a gap (a first press after a rest was seen to take about 1 s over a LiveKit
SFU). With `PacingConfig.idle_frame_interval` set, once no frame has gone out for that long the pacer sends the last
frame again (a *repeat*, `PacedFrame.repeat`), every interval, until real frames come again. A repeat takes the
slot of the wall time it goes out at (timestamps stay monotonic and follow wall time), never waits in the ring (it is
made when the ring is empty), and a real frame that comes while the stream repeats goes out at once. A repeat's
presentation timestamp is its slot's plus `REPEAT_PTS_OFFSET`: off the slot grid, so a receiver that knows the
stream's timestamps tells repeats from generated frames exactly (`frame_pts`, `is_repeat_pts`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipeline.bidirectional import ChunkOutput, ChunkPart
from pipeline.clock import Clock, MonotonicClock
from transport.errors import TransportConfigError

__all__ = [
    "REPEAT_PTS_OFFSET",
    "VIDEO_CLOCK_RATE",
    "FramePacer",
    "FrameSink",
    "PacedFrame",
    "PacerStatistics",
    "PacingConfig",
    "PacingCore",
    "SendFrame",
    "WaitUntil",
    "frame_pts",
    "grid_offset",
    "is_repeat_pts",
    "slot_pts",
]

logger = logging.getLogger(__name__)

VIDEO_CLOCK_RATE = 90_000
"""Ticks per second of presentation timestamps (the RTP video clock): slot `media_index` is at
`round(media_index * VIDEO_CLOCK_RATE / fps)`."""

REPEAT_PTS_OFFSET = 90
"""Ticks (1 ms) a repeated frame's presentation timestamp lies after its slot's: generated frames sit on the slot
grid (within a tick of rounding), repeats never do (a slot is at least 375 ticks, at 240 fps)."""

_SINK_ERROR_LOG_EVERY = 100  # a failing sink logs its first error and then every 100th


@dataclass(frozen=True, slots=True)
class PacingConfig:
    """How one session's frames are paced.

    `ring_frames` bounds the frames waiting between generation and sending (overflow drops the oldest: the
    viewer sees the newest generated frames, and control-to-output latency stays bounded). It should hold at least
    one chunk; a chunk bigger than the ring keeps its newest frames. `reanchor_after` is how late (in seconds) the
    sender may fall behind its grid, e.g. while the event loop was blocked, before the grid is re-anchored at the
    current time instead of being caught up. `idle_frame_interval` (seconds; 0: off) is how long the stream may go
    without a frame before the last one is sent again, and how often it is repeated while nothing new comes
    (keep-warm, see the module docstring).
    """

    fps: float
    width: int
    height: int
    ring_frames: int = 32
    reanchor_after: float = 0.5
    idle_frame_interval: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.fps) and 0 < self.fps <= 240):
            raise TransportConfigError(f"pacing fps must be in (0, 240], got {self.fps}")
        if self.width < 1 or self.height < 1:
            raise TransportConfigError(f"pacing frame size must be positive, got {self.width}x{self.height}")
        if self.ring_frames < 1:
            raise TransportConfigError(f"pacing ring_frames must be at least 1, got {self.ring_frames}")
        if not self.reanchor_after > 0:
            raise TransportConfigError(f"pacing reanchor_after must be positive, got {self.reanchor_after}")
        if not (math.isfinite(self.idle_frame_interval) and 0 <= self.idle_frame_interval <= 60):
            raise TransportConfigError(
                f"pacing idle_frame_interval must be in [0, 60] seconds (0: off), got {self.idle_frame_interval}"
            )


@dataclass(frozen=True, slots=True)
class PacedFrame:
    """One frame leaving the pacer.

    `image` is uint8 `[H, W, 3]` RGB. `frame_index` is the frame's index in the session's video; `media_index`
    its slot on the output timeline (one slot per 1/fps of wall time since the stream first started, so it only
    grows, and skips slots the stream missed): `frame_pts` turns it into the presentation timestamp. `deadline` is
    the slot's time on the pacer's monotonic clock. `repeat`: the frame is the last one sent again to keep an idle
    stream warm (its `frame_index` and `chunk_index` are the repeated frame's); it is no generated frame.
    """

    image: npt.NDArray[np.uint8]
    frame_index: int
    chunk_index: int
    media_index: int
    deadline: float
    repeat: bool = False


def slot_pts(media_index: int, fps: float) -> int:
    """The presentation timestamp (90 kHz) of slot `media_index` at `fps`."""
    return round(media_index * VIDEO_CLOCK_RATE / fps)


def frame_pts(frame: PacedFrame, fps: float) -> int:
    """A paced frame's presentation timestamp: its slot's, plus `REPEAT_PTS_OFFSET` for a repeat."""
    return slot_pts(frame.media_index, fps) + (REPEAT_PTS_OFFSET if frame.repeat else 0)


def grid_offset(pts: int, reference_pts: int, fps: float) -> int:
    """How many ticks `pts` lies off the slot grid through `reference_pts` (the timestamp of any generated frame of
    the same stream, e.g. a chunk's `first_frame_pts`), signed, within half a slot: 0 (within a tick of rounding)
    for a generated frame, `REPEAT_PTS_OFFSET` for a repeat. Working from a difference keeps it exact for receivers
    that only know timestamps up to a constant (RTP)."""
    ticks = VIDEO_CLOCK_RATE / fps
    delta = pts - reference_pts
    return delta - round(round(delta / ticks) * ticks)


def is_repeat_pts(pts: int, reference_pts: int, fps: float) -> bool:
    """Whether a frame presented at `pts` is a repeat (off the slot grid through `reference_pts`: `grid_offset`)."""
    return abs(grid_offset(pts, reference_pts, fps)) > 1


@dataclass(frozen=True, slots=True)
class SendFrame:
    """Send this frame now."""

    frame: PacedFrame


@dataclass(frozen=True, slots=True)
class WaitUntil:
    """Nothing to send yet: wait until `deadline` (monotonic seconds), or for new frames when it is None."""

    deadline: float | None


@dataclass(frozen=True, slots=True)
class PacerStatistics:
    """Counters of one pacer since it was created.

    `dropped_late`: frames whose slot passed while the sender was behind. `dropped_overflow`: frames pushed out
    of the ring by newer ones. `rejected_size`: frames whose shape or dtype did not match the session. `underruns`:
    times the ring was empty when a slot was due (generation slower than real time). `reanchors`: times the grid
    was moved to the current time (after an underrun or a stall). `max_lateness`: the largest delay, in seconds,
    of a sent frame behind its deadline. `idle_frames_sent`: repeats sent to keep an idle stream warm (never in
    `frames_sent`, which counts generated frames only).
    """

    frames_in: int
    frames_sent: int
    dropped_late: int
    dropped_overflow: int
    rejected_size: int
    underruns: int
    reanchors: int
    pending: int
    max_lateness: float
    idle_frames_sent: int = 0


@dataclass(slots=True)
class _Pending:
    image: npt.NDArray[np.uint8]
    frame_index: int
    chunk_index: int
    pushed_at: float


class PacingCore:
    """The pacing decisions: a bounded ring of pending frames and a deadline grid. No awaits, no threads.

    Call `push` (or `push_chunk`) when frames are generated and `poll(now)` whenever the driver wakes. `poll`
    returns `SendFrame` when a frame is due now, or `WaitUntil` with the next deadline (None: the ring is empty).

    The grid: the first frame anchors it (`t0 = now`, slot 0); slot n is due at `t0 + n / fps`. When `poll` runs
    late and slots have passed while frames were waiting, the frames of the missed slots are dropped (the newest
    waiting frame is always kept) and the stream stays on its grid; a stall longer than `reanchor_after`
    re-anchors the grid at `now`. When the ring was empty at a deadline (an underrun) and the next frame comes a
    whole slot or more after it, the grid re-anchors at the frame's arrival: generation was late, and those frames
    are not dropped.

    Keep-warm (`idle_frame_interval` > 0): with the ring empty, `poll` returns `WaitUntil` the time the last frame
    is due again, and then `SendFrame` of a repeat of it, on the slot of the current time (the grid keeps its
    anchor; the repeat takes the slot, so what follows comes later on the timeline). A frame pushed while the
    stream repeats goes out at the next `poll`, on a grid re-anchored there: repeats never delay generated frames.
    """

    def __init__(self, config: PacingConfig) -> None:
        self._config = config
        self._period = 1.0 / config.fps
        self._pending: deque[_Pending] = deque()
        self._anchored = False
        self._t0 = 0.0
        self._slot = 0
        self._media_base = 0
        self._frames_in = 0
        self._frames_sent = 0
        self._dropped_late = 0
        self._dropped_overflow = 0
        self._rejected_size = 0
        self._underruns = 0
        self._reanchors = 0
        self._max_lateness = 0.0
        self._idle_interval = config.idle_frame_interval
        self._last: _Pending | None = None  # the last frame sent: what a repeat shows
        self._repeat_due: float | None = None  # when the last frame goes out again (None: keep-warm off or idle)
        self._repeating = False  # repeats went out since the last generated frame
        self._idle_frames_sent = 0

    @property
    def config(self) -> PacingConfig:
        return self._config

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _fits(self, image: object) -> bool:
        return (
            isinstance(image, np.ndarray)
            and image.dtype == np.uint8
            and image.shape == (self._config.height, self._config.width, 3)
        )

    def push(self, image: npt.NDArray[np.uint8], *, frame_index: int, chunk_index: int, now: float) -> bool:
        """Queue one frame; False if it was rejected for its size or dtype (counted). Overflow drops the oldest."""
        self._frames_in += 1
        if not self._fits(image):
            self._rejected_size += 1
            return False
        if len(self._pending) >= self._config.ring_frames:
            self._pending.popleft()
            self._dropped_overflow += 1
        self._pending.append(_Pending(image, frame_index, chunk_index, now))
        return True

    def push_chunk(self, frames: npt.NDArray[np.uint8], *, first_frame_index: int, chunk_index: int, now: float) -> int:
        """Queue a chunk's frames (`[T, H, W, 3]` uint8); returns how many were accepted."""
        if not isinstance(frames, np.ndarray) or frames.ndim != 4:
            count = len(frames) if isinstance(frames, np.ndarray) and frames.ndim > 0 else 1
            self._frames_in += count
            self._rejected_size += count
            return 0
        accepted = 0
        for offset in range(frames.shape[0]):
            accepted += self.push(
                frames[offset], frame_index=first_frame_index + offset, chunk_index=chunk_index, now=now
            )
        return accepted

    def _anchor(self, now: float) -> None:
        if self._anchored:
            # Keep the media timeline continuous: it advances by the wall time elapsed on the old grid.
            elapsed = max(self._slot, math.floor((now - self._t0) * self._config.fps + 1e-9))
            self._media_base += elapsed
            self._reanchors += 1
        self._anchored = True
        self._t0 = now
        self._slot = 0

    def _send(self, now: float) -> SendFrame:
        item = self._pending.popleft()
        deadline = self._t0 + self._slot * self._period
        self._max_lateness = max(self._max_lateness, now - deadline)
        frame = PacedFrame(
            image=item.image,
            frame_index=item.frame_index,
            chunk_index=item.chunk_index,
            media_index=self._media_base + self._slot,
            deadline=deadline,
        )
        self._slot += 1
        self._frames_sent += 1
        self._last = item
        self._repeating = False
        self._repeat_due = now + self._idle_interval if self._idle_interval > 0 else None
        return SendFrame(frame)

    def _send_repeat(self, now: float, due: float) -> SendFrame:
        last = self._last
        assert last is not None
        # The slot of the current time, or the next free one: the timeline stays monotonic and follows wall time.
        slot = max(self._slot, math.floor((now - self._t0) * self._config.fps + 1e-9))
        frame = PacedFrame(
            image=last.image,
            frame_index=last.frame_index,
            chunk_index=last.chunk_index,
            media_index=self._media_base + slot,
            deadline=due,
            repeat=True,
        )
        self._slot = slot + 1
        self._repeating = True
        self._idle_frames_sent += 1
        following = due + self._idle_interval
        self._repeat_due = following if following > now else now + self._idle_interval
        return SendFrame(frame)

    @property
    def repeat_due(self) -> float | None:
        """When the last frame is sent again if nothing new comes (None: keep-warm off, or nothing sent yet)."""
        return self._repeat_due

    def poll(self, now: float) -> SendFrame | WaitUntil:
        if not self._pending:
            due = self._repeat_due
            if due is None:
                return WaitUntil(None)
            if now < due:
                return WaitUntil(due)
            return self._send_repeat(now, due)
        if not self._anchored:
            self._anchor(now)
            return self._send(now)
        if self._repeating:
            # The stream was idle and kept warm: a generated frame goes at once, on a grid anchored now (after the
            # slots the repeats took). Counted as an underrun when it came after its slot, as without repeats.
            if self._pending[0].pushed_at > self._t0 + self._slot * self._period:
                self._underruns += 1
            self._anchor(now)
            return self._send(now)
        deadline = self._t0 + self._slot * self._period
        if now < deadline:
            return WaitUntil(deadline)
        lateness = now - deadline
        if self._pending[0].pushed_at > deadline:
            # Underrun: nothing was waiting when the slot came due. Generation is behind, not the sender.
            self._underruns += 1
            if lateness >= self._period:
                self._anchor(now)
            return self._send(now)
        missed = math.floor(lateness * self._config.fps + 1e-9)
        if missed:
            drop = min(missed, len(self._pending) - 1)
            for _ in range(drop):
                self._pending.popleft()
            self._dropped_late += drop
            self._slot += missed
        if lateness > self._config.reanchor_after:
            self._anchor(now)
        return self._send(now)

    def holds_chunk(self, chunk_index: int) -> bool:
        """Whether a frame of chunk `chunk_index` waits in the ring (not yet sent)."""
        return any(item.chunk_index == chunk_index for item in self._pending)

    def clear(self) -> int:
        """Drop every pending frame (not counted as a drop); returns how many there were."""
        count = len(self._pending)
        self._pending.clear()
        return count

    def statistics(self) -> PacerStatistics:
        return PacerStatistics(
            frames_in=self._frames_in,
            frames_sent=self._frames_sent,
            dropped_late=self._dropped_late,
            dropped_overflow=self._dropped_overflow,
            rejected_size=self._rejected_size,
            underruns=self._underruns,
            reanchors=self._reanchors,
            pending=len(self._pending),
            max_lateness=self._max_lateness,
            idle_frames_sent=self._idle_frames_sent,
        )


FrameSink = Callable[[PacedFrame], None]
"""Receives each frame when it is due. It must not block: a slow sink makes the pacer drop frames."""


class FramePacer:
    """The asyncio driver of a `PacingCore`: `push_chunk` from the generation side, `run(sink)` on the send side.

    Example::

        pacer = FramePacer(PacingConfig(fps=16, width=416, height=240))
        async with asyncio.TaskGroup() as tg:
            tg.create_task(pacer.run(video_source_sink))
            async for chunk in port.chunks():
                pacer.push_chunk(chunk)

    `run` sleeps until each deadline and calls the sink once per due frame, on the event loop; while it waits to
    repeat the last frame (keep-warm) a push wakes it at once. Backpressure: none
    upstream; the ring drops its oldest frame on overflow (latest wins) and late frames are dropped (counted in
    `statistics()`). An exception from the sink is logged (rate-limited) and counted, and the stream goes on.
    Cancellation: cancelling `run` stops it between frames; pending frames stay queued for the next `run` (the
    same pacer may be run again, e.g. by a new connection after a rebind). `run` returns after `close()`.
    """

    def __init__(
        self,
        config: PacingConfig,
        *,
        clock: Clock | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self._core = PacingCore(config)
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        # `sleep` must wait `delay` seconds on `clock`; a test passes one that advances its fake clock.
        self._sleep = sleep if sleep is not None else asyncio.sleep
        self._wakeup = asyncio.Event()
        self._closed = False
        self._sink_errors = 0

    @property
    def config(self) -> PacingConfig:
        return self._core.config

    @property
    def sink_errors(self) -> int:
        return self._sink_errors

    def push_chunk(self, chunk: ChunkOutput | ChunkPart) -> int:
        accepted = self._core.push_chunk(
            chunk.frames, first_frame_index=chunk.first_frame_index, chunk_index=chunk.index, now=self._clock.now()
        )
        self._wakeup.set()
        return accepted

    def close(self) -> None:
        """End `run` and drop what is pending. Idempotent."""
        self._closed = True
        self._core.clear()
        self._wakeup.set()

    def statistics(self) -> PacerStatistics:
        return self._core.statistics()

    def holds_chunk(self, chunk_index: int) -> bool:
        return self._core.holds_chunk(chunk_index)

    async def run(self, sink: FrameSink) -> None:
        while not self._closed:
            decision = self._core.poll(self._clock.now())
            if isinstance(decision, SendFrame):
                try:
                    sink(decision.frame)
                except Exception:
                    self._sink_errors += 1
                    if self._sink_errors % _SINK_ERROR_LOG_EVERY == 1:
                        logger.exception("frame sink failed (%d failures so far)", self._sink_errors)
                continue
            if decision.deadline is None:
                await self._wakeup.wait()
                self._wakeup.clear()
            elif self._core.pending:
                await self._sleep(max(0.0, decision.deadline - self._clock.now()))
            else:
                # Waiting to repeat the last frame: a frame pushed meanwhile must not wait for that.
                await self._sleep_or_wakeup(max(0.0, decision.deadline - self._clock.now()))

    async def _sleep_or_wakeup(self, delay: float) -> None:
        self._wakeup.clear()
        if self._core.pending or self._closed:
            return
        sleeper = asyncio.ensure_future(self._sleep(delay))
        waker = asyncio.ensure_future(self._wakeup.wait())
        try:
            await asyncio.wait((sleeper, waker), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeper, waker):
                task.cancel()
            await asyncio.gather(sleeper, waker, return_exceptions=True)
