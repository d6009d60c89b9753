"""A scripted `SessionPort`: the test feeds chunks and status messages, and reads what the transport pushed back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping

import numpy as np
import numpy.typing as npt

from pipeline.bidirectional import ChunkItem, ChunkOutput, ChunkPart, ControlMessage, Pause, Resume, Stop
from transport.base import CallerRoom, ResumedRoom, StatusMessage
from transport.errors import ControlRejectedError

_END = object()


def frame_value(frame_index: int) -> int:
    """The grey level of frame `frame_index` in `make_chunk` chunks (distinct for 50 consecutive frames, mid-range
    so codecs keep it within a few levels)."""
    return 30 + (frame_index * 4) % 200


def make_frames(first_frame_index: int, count: int, width: int, height: int) -> npt.NDArray[np.uint8]:
    """Frames of one flat grey level each (see `frame_value`), with a small gradient so they are not trivial."""
    frames = np.empty((count, height, width, 3), dtype=np.uint8)
    ramp = (np.arange(width, dtype=np.int32) * 8 // max(1, width))[None, :, None]
    for offset in range(count):
        base = frame_value(first_frame_index + offset)
        frames[offset] = np.clip(base + ramp, 0, 255).astype(np.uint8)
    return frames


def make_chunk(
    index: int,
    *,
    first_frame_index: int,
    count: int,
    width: int,
    height: int,
    fps: float = 16.0,
    applied_seq: int = -1,
    keys: Iterable[str] = (),
    session_id: str = "s1",
    timings: Mapping[str, float] | None = None,
) -> ChunkOutput:
    return ChunkOutput(
        session_id=session_id,
        index=index,
        frames=make_frames(first_frame_index, count, width, height),
        fps=fps,
        first_frame_index=first_frame_index,
        applied_seq=applied_seq,
        keys=frozenset(keys),
        timings=dict(timings or {}),
    )


class FakeSessionPort:
    """Implements `transport.base.SessionPort`. `chunks()` and `status()` may each be iterated once at a time;
    the counters say how often a transport opened them (a rebind must not reopen them)."""

    def __init__(
        self,
        session_id: str = "s1",
        *,
        width: int = 32,
        height: int = 24,
        fps: float = 16.0,
        caller_room: CallerRoom | None = None,
        ends_at: float | None = None,
    ) -> None:
        self._session_id = session_id
        self._caller_room = caller_room
        self.resumed_room_value: ResumedRoom | None = None  # what `resumed_room` says (a test may set it)
        self.handed_off = False  # what `handed_off` says (a test sets it before the detach of a hand-off)
        self.ends_at_value = ends_at  # what `ends_at` says (a test may change it)
        self._width = width
        self._height = height
        self._fps = fps
        self._chunks: asyncio.Queue[object] = asyncio.Queue()
        self._status: asyncio.Queue[object] = asyncio.Queue()
        self.controls: list[ControlMessage] = []
        self._control_changed = asyncio.Event()
        self.gone: list[str] = []
        self.deliveries: list[int] = []  # every `delivered` report, in order
        self.gone_event = asyncio.Event()
        self.chunks_opened = 0
        self.status_opened = 0
        self.refuse_control = False
        self.reject_control: ControlRejectedError | None = None
        """When set, `push_control` raises it (the service's port refusing a message in the session's state)."""
        self.state = "running"
        """The session's state (`SessionPort.state`); `Pause`, `Resume` and `Stop` move it as the service's would."""

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def caller_room(self) -> CallerRoom | None:
        return self._caller_room

    @property
    def resumed_room(self) -> ResumedRoom | None:
        return self.resumed_room_value

    @property
    def ends_at(self) -> float | None:
        return self.ends_at_value

    @property
    def width(self) -> int:
        return self._width

    @property
    def height(self) -> int:
        return self._height

    @property
    def fps(self) -> float:
        return self._fps

    def push_control(self, message: ControlMessage) -> None:
        if self.refuse_control:
            raise KeyError(self._session_id)
        if self.reject_control is not None:
            raise self.reject_control
        self.controls.append(message)
        match message:
            case Pause():
                self.state = "paused"
            case Resume():
                self.state = "running"
            case Stop():
                self.state = "draining"
        self._control_changed.set()

    async def wait_controls(self, count: int) -> list[ControlMessage]:
        while len(self.controls) < count:
            self._control_changed.clear()
            await self._control_changed.wait()
        return self.controls

    def client_gone(self, reason: str) -> None:
        self.gone.append(reason)
        self.gone_event.set()

    def delivered(self, chunk_index: int) -> None:
        self.deliveries.append(chunk_index)

    def emit_chunk(self, chunk: ChunkItem) -> None:
        self._chunks.put_nowait(chunk)

    def emit_status(self, message: StatusMessage) -> None:
        self._status.put_nowait(message)

    def finish(self) -> None:
        self._chunks.put_nowait(_END)
        self._status.put_nowait(_END)

    async def chunks(self) -> AsyncIterator[ChunkItem]:
        self.chunks_opened += 1
        while True:
            item = await self._chunks.get()
            if item is _END:
                return
            assert isinstance(item, ChunkOutput | ChunkPart)
            yield item

    async def status(self) -> AsyncIterator[StatusMessage]:
        self.status_opened += 1
        while True:
            item = await self._status.get()
            if item is _END:
                return
            yield item  # type: ignore[misc]
