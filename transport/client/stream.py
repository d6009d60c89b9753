"""The media half of the Python client: one live session joined over its transport, frames in, control out.

`LiveStream` is what a client holds while a session streams. It sends control protocol v1 (`send_keys` snapshots and
`send_prompt` prompts, each with its own increasing `seq`, `reset_pose`, `pause`, `resume`, `stop`), receives the
video as numpy RGB arrays (`ReceivedFrame`) and the status messages (`chunk`, `state`, `error`, `done`, and any
other the service sends, through the status listeners). It does not care how it is connected: a `Link` carries
bytes and frames, and there are two (`links.py`), chosen by the session's join details:

- `EmbeddedLink` (`kind: embedded`): an aiortc peer connection with a receive-only video transceiver and the
  `control` data channel, offered to the session's `offer_url` (candidates included, no trickle);
- `LiveKitLink` (`kind: livekit`): the `livekit` SDK joins the room with the controller token (or one the caller
  minted for the identity it named), subscribes to the service identity's video track and talks on the control and
  status topics. `livekit.rtc` (a native library) is imported only here, on first use.

Which chunk a frame shows (`ReceivedFrame.chunk`): a `chunk` status leaves the service with the chunk's first frame
and carries that frame's 90 kHz presentation timestamp (`first_frame_pts`; docs/control-protocol.md). On the
embedded transport a decoded frame carries its RTP timestamp counted from the first frame received, which is the
presentation timestamp minus one offset per connection; the service sends that offset in chunk statuses
(`stream_base_pts`) and `ChunkTracker` (`tracker.py`) labels each frame exactly as it is read (before the offset
arrives it fits one from when statuses and frames arrive, see its docstring). The LiveKit SDK does not expose RTP
timestamps, but it reads back LiveKit frame metadata: the service stamps each frame with its index in the session's
video (`frame_id`) and each `chunk` status with its first frame's (`first_frame_id`), so the tracker labels every
frame exactly there too (`ReceivedFrame.frame_id`). Only against a service that stamps no frames is a status given to
the next frame that arrives after it (within the jitter of two independent paths).

Keep-warm repeats (`ReceivedFrame.repeat`): while a session has nothing new to show (no key held, paused,
generation behind), the service sends its last frame again every `LINGSTREAM_IDLE_FRAME_INTERVAL_MS` so that the
receiver stays in step. A repeat is labelled like the frame it repeats (same chunk, never `first_of_chunk`); on the
embedded transport its presentation timestamp lies off the frame grid (`transport.session.pacing.REPEAT_PTS_OFFSET`), so
once the offset came from the service (`stream_base_pts`) `repeat` is exact; on LiveKit every frame carries its
frame id (frame metadata) and a repeat the id of the frame it repeats, so `repeat` is exact there too (an id already
received). Against a service that stamps no frames, LiveKit repeats cannot be told apart (`repeat` always False).

Frames wait in a bounded buffer (`frame_buffer`, default 64) whose overflow policy is *drop oldest* (counted in
`statistics().frames_dropped`): a consumer slower than the video loses old frames, never the newest.

A user's code cannot break a stream: a status listener that raises is logged (once per listener, with its
traceback; `statistics().listener_errors` counts every raise) and the stream goes on. Left to propagate, the
exception would escape into the SDK's task that delivered the message (aiortc's DTLS task), which kills the data
channel: the session then reads as "connection lost" and closing it hangs.

Cancellation: `aclose()` closes the link (peer connection or room) and cancels and awaits its reader tasks, within
`close_timeout` seconds whatever state the link is in (a wedged peer connection is abandoned with a warning, not
waited for); frames still buffered stay readable until drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from pipeline.bidirectional import ControlMessage, ControlState, Pause, ResetPose, Resume, SetPrompt, Stop
from transport.base import ChunkStatus, DoneStatus, ErrorStatus, StateStatus, StatusMessage
from transport.client.api import ServiceClient, SessionInfo
from transport.client.errors import ConnectError, ControlRefusedError
from transport.client.links import CommandLink, EmbeddedLink, Link, LiveKitLink, default_ice_addresses
from transport.client.tracker import ChunkTracker
from transport.protocol import MAX_SEQ, ProtocolError, decode_status, encode_control

__all__ = ["LiveStream", "ReceivedFrame", "StreamStatistics", "connect"]

logger = logging.getLogger(__name__)

_FRAME_BUFFER = 64
_CONNECT_TIMEOUT_S = 20.0
_CLOSE_TIMEOUT_S = 5.0
_LABEL_WAIT_S = 0.5  # how long a frame that overtook its chunk's status waits for it (LiveKit frame ids)


@dataclass(frozen=True, slots=True)
class ReceivedFrame:
    """One decoded video frame. `image`: `(height, width, 3)` uint8 RGB. `received_at`: `time.monotonic()` when it
    was decoded. `pts`: its presentation timestamp on the session's 90 kHz clock (embedded only, once the offset
    is known; None otherwise). `chunk`: the `chunk` status of the chunk it belongs to (None before the first);
    `first_of_chunk`: it is that chunk's first frame received. `repeat`: a keep-warm repeat of the frame before it,
    not a generated frame (see the module docstring). `frame_id`: the frame's index in the session's video, from
    LiveKit frame metadata (None on the embedded transport, or from a service that does not stamp frames)."""

    image: npt.NDArray[np.uint8]
    received_at: float
    pts: int | None
    chunk: ChunkStatus | None
    first_of_chunk: bool
    repeat: bool = False
    frame_id: int | None = None


@dataclass(frozen=True, slots=True)
class _Arrived:
    image: npt.NDArray[np.uint8]
    at: float
    rtp: int | None
    chunk: ChunkStatus | None  # the arrival-order label (no RTP timestamp, no frame id)
    first: bool
    frame_id: int | None = None
    repeat: bool = False  # judged on arrival (frame ids only)


@dataclass(frozen=True, slots=True)
class StreamStatistics:
    frames_received: int
    frames_dropped: int
    chunks: int
    errors: int
    controls_sent: int
    listener_errors: int = 0  # raises of status listeners (each logged once per listener, then ignored)


class LiveStream:
    """A joined session: control out, frames and status in. Made by `connect`; see the module docstring.

    `send_keys(keys)` sends a `control_state` snapshot with the next `seq` (the first is the wall clock in
    milliseconds, as docs/control-protocol.md suggests, then one more per snapshot) and returns it; `sent_at(seq)`
    is when (monotonic). `next_frame()` / `frames()` read the video; `last_chunk`, `errors` and `done` hold the
    status messages; `stop()` asks the session to end and waits for `done`."""

    def __init__(
        self, info: SessionInfo, *, frame_buffer: int = _FRAME_BUFFER, close_timeout: float = _CLOSE_TIMEOUT_S
    ) -> None:
        if frame_buffer < 1:
            raise ValueError(f"frame_buffer must be at least 1, got {frame_buffer}")
        if close_timeout <= 0:
            raise ValueError(f"close_timeout must be positive, got {close_timeout}")
        self.info = info
        self._close_timeout = close_timeout
        self._link: Link | None = None
        self._frames: deque[_Arrived] = deque()
        self._frame_buffer = frame_buffer
        self._frame_arrived = asyncio.Event()
        self._status_arrived = asyncio.Event()  # a chunk status (or the end) came: a frame waiting for its label
        self._tracker = ChunkTracker(info.fps)
        self._seq = time.time_ns() // 1_000_000
        self._prompt_seq = self._seq  # prompts count on their own (the service keeps the newest of each kind)
        self._sent: dict[int, float] = {}
        self._sent_order: deque[int] = deque()
        self.state: str | None = None
        self.last_chunk: ChunkStatus | None = None
        self.errors: list[ErrorStatus] = []
        self.done: DoneStatus | None = None
        self._done_event = asyncio.Event()
        self._status_listeners: list[Callable[[StatusMessage], None]] = []
        self._failed_listeners: list[Callable[[StatusMessage], None]] = []  # logged already
        self._listener_errors = 0
        self._frames_received = 0
        self._frames_dropped = 0
        self._chunks = 0
        self._controls_sent = 0

    # -- wiring (called by the link) ------------------------------------------------------------------------------

    def attach_link(self, link: Link) -> None:
        self._link = link

    @property
    def link(self) -> Link | None:
        """The link the stream talks over (a `LiveKitLink` holds the SDK room, for calls of your own); None once
        closed."""
        return self._link

    def on_frame(self, image: npt.NDArray[np.uint8], rtp: int | None, frame_id: int | None = None) -> None:
        now = time.monotonic()
        if frame_id is not None:
            arrived = _Arrived(image, now, None, None, False, frame_id, self._tracker.frame_id(frame_id))
        else:
            chunk, first = self._tracker.frame(rtp, now)
            arrived = _Arrived(image, now, rtp, chunk, first)
        if len(self._frames) >= self._frame_buffer:
            self._frames.popleft()
            self._frames_dropped += 1
        self._frames.append(arrived)
        self._frames_received += 1
        self._frame_arrived.set()

    def on_status(self, data: bytes | str) -> None:
        message = decode_status(data)
        if isinstance(message, ProtocolError):
            logger.warning("a status message from the service was not understood: %s", message.message)
            return
        match message:
            case ChunkStatus():
                self.last_chunk = message
                self._chunks += 1
                self._tracker.status(message, time.monotonic())
                self._status_arrived.set()
            case StateStatus(state=state):
                self.state = state
            case ErrorStatus():
                self.errors.append(message)
            case DoneStatus():
                self.done = message
                self._done_event.set()
                self._frame_arrived.set()  # a reader waiting for frames learns that none will come
                self._status_arrived.set()
        self._notify(message)

    def on_link_lost(self, why: str) -> None:
        """The link ended for good (the room or peer connection closed); readers stop waiting."""
        logger.info("session %s: the connection ended: %s", self.info.id, why)
        if self.done is not None:
            return
        self.done = DoneStatus(f"connection lost: {why}")
        self._done_event.set()
        self._frame_arrived.set()
        self._notify(self.done)

    def _notify(self, message: StatusMessage) -> None:
        """Every listener, each isolated: this runs inside the SDK's task that delivered the message."""
        for listener in tuple(self._status_listeners):
            try:
                listener(message)
            except Exception:
                self._listener_errors += 1
                if any(failed is listener for failed in self._failed_listeners):
                    continue
                self._failed_listeners.append(listener)
                logger.exception(
                    "session %s: status listener %r raised on a %s status; the stream goes on (logged once per "
                    "listener, counted in statistics().listener_errors)",
                    self.info.id,
                    listener,
                    type(message).__name__,
                )

    @property
    def ended(self) -> bool:
        """The session sent `done`, or the connection ended for good."""
        return self.done is not None

    def add_status_listener(self, listener: Callable[[StatusMessage], None]) -> None:
        """Call `listener` with every status message from now on (on the event loop; it must not block), and with
        the `done` that stands for a connection that ended. An exception it raises is logged once and counted
        (`statistics().listener_errors`); the stream and the other listeners go on."""
        self._status_listeners.append(listener)

    def remove_status_listener(self, listener: Callable[[StatusMessage], None]) -> None:
        if listener in self._status_listeners:
            self._status_listeners.remove(listener)

    # -- control ------------------------------------------------------------------------------------------------

    async def send(self, message: ControlMessage, *, reliable: bool = True) -> None:
        if self._link is None:
            raise ConnectError("the stream is not connected")
        await self._link.send(encode_control(message), reliable=reliable)
        self._controls_sent += 1

    async def send_keys(self, keys: Iterable[str], *, reliable: bool = True) -> int:
        """Send the held keys (`w a s d i j k l`, arrows as aliases) as a new snapshot; returns its `seq`."""
        self._seq = min(self._seq + 1, MAX_SEQ)
        seq = self._seq
        now = time.monotonic()
        await self.send(ControlState(seq, frozenset(keys)), reliable=reliable)
        self._sent[seq] = now
        self._sent_order.append(seq)
        if len(self._sent_order) > 4096:  # bounded memory for long sessions: forget the oldest send times
            self._sent.pop(self._sent_order.popleft(), None)
        return seq

    def sent_at(self, seq: int) -> float | None:
        """When (monotonic) the snapshot `seq` was sent by this stream; None for unknown or forgotten ones."""
        return self._sent.get(seq)

    async def command(self, message: ControlMessage) -> str | None:
        """Send a discrete command (`Pause`, `Resume`, `ResetPose`, `Stop`, `SetPrompt`). On LiveKit it is an RPC
        call (docs/livekit.md) and returns the session's state after it; a refusal is recorded in `errors` (and
        told to the status listeners) as an `error` status would be, and raised as `ControlRefusedError`. On the
        embedded transport it is a packet: None, and a refusal comes later as an `error` status."""
        link: object = self._link  # `object`: mypy reads isinstance of another Protocol as unreachable otherwise
        if not isinstance(link, CommandLink):
            await self.send(message)
            return None
        try:
            state = await link.command(message)
        except ControlRefusedError as exc:
            refusal = ErrorStatus(exc.code, exc.message)
            self.errors.append(refusal)
            self._notify(refusal)
            raise
        self._controls_sent += 1
        if state is not None:
            self.state = state
        return state

    async def send_prompt(self, text: str) -> int:
        """Replace the session's text prompt from the next chunk on; returns the prompt's `seq` (a chunk status
        reports `prompt` and `prompt_seq` once a chunk was generated from it). The service bounds the text
        (`prompt_too_large`) and may rate-limit prompts (`rate_limited`): an `error` status, and on LiveKit a
        `ControlRefusedError` as well (see `command`)."""
        self._prompt_seq = min(self._prompt_seq + 1, MAX_SEQ)
        seq = self._prompt_seq
        await self.command(SetPrompt(seq, text))
        return seq

    async def reset_pose(self) -> str | None:
        """Back to the start pose from the next chunk on; the session's state on LiveKit (see `command`)."""
        return await self.command(ResetPose())

    async def pause(self) -> str | None:
        """Generate nothing more until `resume()` (the chunk in progress is still delivered); on LiveKit the
        session's state after it (`paused`, see `command`)."""
        return await self.command(Pause())

    async def resume(self) -> str | None:
        return await self.command(Resume())

    async def stop(self) -> DoneStatus:
        """Send `stop` and wait for `done` (the chunk in progress is delivered first). Bound it with
        `asyncio.timeout`."""
        if self.done is None:
            await self.command(Stop())
        return await self.wait_done()

    async def wait_done(self) -> DoneStatus:
        """The session's `done` (or the end of the connection, as a `done` whose reason says so)."""
        await self._done_event.wait()
        assert self.done is not None
        return self.done

    # -- frames -------------------------------------------------------------------------------------------------

    async def next_frame(self) -> ReceivedFrame | None:
        """The oldest buffered frame, waiting for one (bound it with `asyncio.timeout`); None once the session is
        done and every frame was read."""
        while not self._frames:
            if self.done is not None:
                return None
            self._frame_arrived.clear()
            await self._frame_arrived.wait()
        arrived = self._frames.popleft()
        if arrived.frame_id is not None:
            # Labelled as it is read, exactly: statuses that came after the frame count too. A frame that overtook
            # its chunk's status (video and data travel apart) waits a moment for it, never taking the previous
            # chunk's label; past `_LABEL_WAIT_S` (the status was lost) it is labelled None.
            if self._tracker.awaits_status(arrived.frame_id) and self.done is None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_LABEL_WAIT_S):
                        while self._tracker.awaits_status(arrived.frame_id) and self.done is None:
                            self._status_arrived.clear()
                            await self._status_arrived.wait()
            chunk, first = self._tracker.label_id(arrived.frame_id)
            return ReceivedFrame(
                arrived.image, arrived.at, None, chunk, first and not arrived.repeat, arrived.repeat, arrived.frame_id
            )
        if arrived.rtp is None:
            return ReceivedFrame(arrived.image, arrived.at, None, arrived.chunk, arrived.first)
        # Labelled as it is read: statuses that came after the frame, and a better fitted offset, count too.
        chunk, first, pts = self._tracker.label(arrived.rtp)
        repeat = pts is not None and self._tracker.is_repeat(pts, self.info.fps)
        return ReceivedFrame(arrived.image, arrived.at, pts, chunk, first, repeat)

    async def frames(self) -> AsyncIterator[ReceivedFrame]:
        """Every frame until the session is done (then the buffered rest)."""
        while (frame := await self.next_frame()) is not None:
            yield frame

    def statistics(self) -> StreamStatistics:
        return StreamStatistics(
            frames_received=self._frames_received,
            frames_dropped=self._frames_dropped,
            chunks=self._chunks,
            errors=len(self.errors),
            controls_sent=self._controls_sent,
            listener_errors=self._listener_errors,
        )

    async def aclose(self) -> None:
        """Close the link within `close_timeout` seconds, whatever its state: a link still closing then is
        abandoned (logged), not waited for. A stream closed before its `done` reads `done` as closed by the
        client. Idempotent."""
        link, self._link = self._link, None
        try:
            if link is not None:
                try:
                    async with asyncio.timeout(self._close_timeout):
                        await link.aclose()
                except TimeoutError:
                    logger.warning(
                        "session %s: the connection did not close within %g s; abandoned",
                        self.info.id,
                        self._close_timeout,
                    )
        finally:
            if self.done is None:
                self.done = DoneStatus("connection closed by the client")
            self._done_event.set()
            self._frame_arrived.set()

    async def __aenter__(self) -> LiveStream:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()


async def connect(
    service: ServiceClient,
    info: SessionInfo,
    *,
    ice_addresses: Sequence[str] | Literal["auto"] | None = "auto",
    livekit_token: str | None = None,
    frame_buffer: int = _FRAME_BUFFER,
    connect_timeout: float = _CONNECT_TIMEOUT_S,
    close_timeout: float = _CLOSE_TIMEOUT_S,
) -> LiveStream:
    """Join a streaming session (`info` from `ServiceClient.wait_streaming`) over the transport its details name.

    `ice_addresses` (embedded): the host candidate addresses; "auto" picks `default_ice_addresses(service.url)`,
    None gathers on every interface but loopback. `livekit_token`: a token the caller minted for the identity it
    named in the create (`livekit.controller_identity`); by default the controller token of the details.
    `close_timeout` bounds the stream's `aclose()`. Raises `ConnectError`, or the `ApiError` of a refused offer."""
    details = info.transport
    if details is None:
        raise ConnectError(f"session {info.id} has no join details (status {info.status})")
    stream = LiveStream(info, frame_buffer=frame_buffer, close_timeout=close_timeout)
    kind = details.get("kind")
    link: Link
    if kind == "embedded":
        addresses = default_ice_addresses(service.url) if ice_addresses == "auto" else ice_addresses
        link = await EmbeddedLink.open(service, stream, details, host_addresses=addresses, within=connect_timeout)
    elif kind == "livekit":
        link = await LiveKitLink.open(stream, details, token=livekit_token, within=connect_timeout)
    else:
        raise ConnectError(f"unknown transport kind {kind!r}")
    stream.attach_link(link)
    return stream
