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

Reconnecting (embedded transport; `connect(..., reconnect=ReconnectPolicy())`, the default): when the replica
running the session dies, the stream joins the session again by itself, through the service (any replica routes
it), with the same session id and credential, and goes on: the same object, its frames' chunk labels continuing
(each connection labels its frames with a tracker of its own: RTP timestamps count from each connection's first
frame). Meanwhile `state` is `recovering` (a `state` status with a `detail` goes to the listeners), controls sent
are held (the newest snapshot, up to 16 other messages) and delivered on the new connection, and the held keys go
again as a fresh snapshot. When and how long it tries is `transport.client.reconnect`'s (the pure core, its
docstring has the rules); a session that ended meanwhile ends the stream with its reason (and its error), a budget
spent with `done` reading `connection lost: ...` and an `error` status `reconnect_timeout`.
`statistics().reconnects` counts the connections taken again.

Cancellation: `aclose()` closes the link (peer connection or room) and cancels and awaits its reader tasks, within
`close_timeout` seconds whatever state the link is in (a wedged peer connection's close is cut short with a warning,
its sockets closed all the same; a lost link the reconnect was closing is waited for as long); frames still buffered
stay readable until drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from pipeline.bidirectional import ControlMessage, ControlState, Pause, ResetPose, Resume, SetPrompt, Stop
from transport.base import ChunkStatus, DoneStatus, ErrorStatus, StateStatus, StatusMessage
from transport.client.api import ServiceClient, SessionInfo
from transport.client.errors import ClientError, ConnectError, ControlRefusedError
from transport.client.links import CommandLink, EmbeddedLink, Link, LiveKitLink, default_ice_addresses
from transport.client.reconnect import End, Join, Probe, Reconnector, ReconnectPhase, ReconnectPolicy, SessionView, Wait
from transport.client.tracker import ChunkTracker
from transport.protocol import MAX_SEQ, ProtocolError, decode_status, encode_control

__all__ = ["LiveStream", "ReceivedFrame", "StreamStatistics", "connect"]

logger = logging.getLogger(__name__)

_FRAME_BUFFER = 64
_CONNECT_TIMEOUT_S = 20.0
_CLOSE_TIMEOUT_S = 5.0
_LABEL_WAIT_S = 0.5  # how long a frame that overtook its chunk's status waits for it (LiveKit frame ids)
_HELD_CONTROLS = 16  # messages other than key snapshots kept while reconnecting (drop oldest)

_RECONNECT = ReconnectPolicy()

Rejoin = Callable[["LiveStream", SessionInfo], Awaitable[Link]]


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
    tracker: ChunkTracker | None = (
        None  # the tracker of the connection it came over (RTP timestamps are per connection)
    )


@dataclass(frozen=True, slots=True)
class StreamStatistics:
    frames_received: int
    frames_dropped: int
    chunks: int
    errors: int
    controls_sent: int
    listener_errors: int = 0  # raises of status listeners (each logged once per listener, then ignored)
    reconnects: int = 0  # connections taken again by the automatic reconnect
    last_recovery_s: float | None = None  # from giving the last lost connection up to joining again


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
        self._reconnector: Reconnector | None = None
        self._service: ServiceClient | None = None
        self._rejoin: Rejoin | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Future[None]] = set()  # links being closed (`_close_link`)
        self._wake = asyncio.Event()
        self._held_keys: ControlState | None = None  # the newest snapshot sent or held (sent again after a rejoin)
        self._held: deque[ControlMessage] = deque(maxlen=_HELD_CONTROLS)
        self._told_recovering = False

    # -- wiring (called by the link) ------------------------------------------------------------------------------

    def attach_link(self, link: Link) -> None:
        self._link = link

    @property
    def link(self) -> Link | None:
        """The link the stream talks over (a `LiveKitLink` holds the SDK room, for calls of your own); None once
        closed."""
        return self._link

    def reconnect_with(self, policy: ReconnectPolicy, service: ServiceClient, rejoin: Rejoin) -> None:
        """Join the session again by itself when its connection is lost (module docstring): `rejoin(stream, info)`
        opens a new link from the session's latest details. `connect` calls it; it starts the watcher task, which
        `aclose()` ends."""
        if self._watcher is not None:
            raise RuntimeError("the stream reconnects already")
        self._reconnector = Reconnector(policy, time.monotonic())
        self._service = service
        self._rejoin = rejoin
        self._watcher = asyncio.get_running_loop().create_task(self._watch(), name=f"client-reconnect-{self.info.id}")

    def on_frame(self, image: npt.NDArray[np.uint8], rtp: int | None, frame_id: int | None = None) -> None:
        now = time.monotonic()
        if self._reconnector is not None:
            self._reconnector.activity(now)
        if frame_id is not None:
            arrived = _Arrived(image, now, None, None, False, frame_id, self._tracker.frame_id(frame_id), self._tracker)
        else:
            chunk, first = self._tracker.frame(rtp, now)
            arrived = _Arrived(image, now, rtp, chunk, first, tracker=self._tracker)
        if len(self._frames) >= self._frame_buffer:
            self._frames.popleft()
            self._frames_dropped += 1
        self._frames.append(arrived)
        self._frames_received += 1
        self._frame_arrived.set()

    def on_alive(self) -> None:
        """A sign of life from the service other than a frame or a status (an RTCP sender report, embedded)."""
        if self._reconnector is not None:
            self._reconnector.activity(time.monotonic())

    def on_status(self, data: bytes | str) -> None:
        message = decode_status(data)
        if isinstance(message, ProtocolError):
            logger.warning("a status message from the service was not understood: %s", message.message)
            return
        if self._reconnector is not None:
            self._reconnector.activity(time.monotonic())
        match message:
            case ChunkStatus():
                self.last_chunk = message
                self._chunks += 1
                self._tracker.status(message, time.monotonic())
                self._status_arrived.set()
            case StateStatus(state=state):
                self.state = state
                if self._reconnector is not None:
                    self._reconnector.told(state)
            case ErrorStatus():
                self.errors.append(message)
            case DoneStatus():
                self.done = message
                if self._reconnector is not None:
                    self._reconnector.ended(message.reason)
                    self._wake.set()
                self._done_event.set()
                self._frame_arrived.set()  # a reader waiting for frames learns that none will come
                self._status_arrived.set()
        self._notify(message)

    def on_link_lost(self, why: str, *, failed: bool = False) -> None:
        """The link ended (the room or peer connection closed, or `failed`). Without the automatic reconnect, for
        good: readers stop waiting. With it, the reconnect decides (module docstring)."""
        logger.info("session %s: the connection ended: %s", self.info.id, why)
        if self.done is not None:
            return
        reconnector = self._reconnector
        if reconnector is not None and reconnector.phase is not ReconnectPhase.ENDED:
            reconnector.link_lost(time.monotonic(), why, failed=failed)
            self._wake.set()
            return
        self.done = DoneStatus(f"connection lost: {why}")
        self._done_event.set()
        self._frame_arrived.set()
        self._notify(self.done)

    # -- the automatic reconnect (transport.client.reconnect decides, this does) ---------------------------------

    async def _watch(self) -> None:
        reconnector = self._reconnector
        assert reconnector is not None
        latest = self.info
        while True:
            now = time.monotonic()
            step = reconnector.next_step(now)
            if reconnector.phase is ReconnectPhase.RECOVERING and not self._told_recovering:
                self._told_recovering = True
                self._set_state(StateStatus("recovering", f"reconnecting: {reconnector.lost_why}"))
            match step:
                case Wait(until=until):
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(max(0.0, until - now)):
                            await self._wake.wait()
                case Probe():
                    try:
                        latest = await self._probe()
                    except ClientError as exc:
                        reconnector.probe_failed(time.monotonic(), str(exc))
                    else:
                        view = SessionView(latest.status, latest.reason, latest.error, latest.streaming)
                        reconnector.probed(time.monotonic(), view)
                case Join():
                    await self._join_again(reconnector, latest)
                case End(reason=reason, error=error):
                    await self._end_reconnect(reason, error)
                    return

    async def _probe(self) -> SessionInfo:
        assert self._service is not None
        async with asyncio.timeout(self._close_timeout + 5.0):
            try:
                return await self._service.get(self.info.id)
            except TimeoutError as exc:
                raise ConnectError("the service did not answer in time") from exc

    async def _drop_link(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            await self._close_link(link, "the lost connection")

    async def _close_link(self, link: Link, what: str) -> None:
        """Close `link` within `close_timeout`. The close runs as a task of its own: cancelling the caller (`aclose`
        cancels the watcher, which may be dropping a lost link) does not cut it short, and `aclose` waits for it;
        a close cut short would leave the peer connection's sockets to the garbage collector. A close still running
        after the bound is cancelled (a link frees what it holds when cancelled) and logged."""
        task = asyncio.ensure_future(link.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        try:
            async with asyncio.timeout(self._close_timeout):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            logger.warning(
                "session %s: %s did not close within %g s; cut short", self.info.id, what, self._close_timeout
            )

    async def _join_again(self, reconnector: Reconnector, latest: SessionInfo) -> None:
        assert self._rejoin is not None
        await self._drop_link()
        self._tracker = ChunkTracker(self.info.fps)  # RTP timestamps count from the new connection's first frame
        try:
            link = await self._rejoin(self, latest)
        except ClientError as exc:
            logger.info("session %s: joining again failed: %s", self.info.id, exc)
            reconnector.join_failed(time.monotonic(), str(exc))
            return
        self._link = link
        reconnector.joined(time.monotonic())
        self._told_recovering = False
        logger.info(
            "session %s: joined again after %.2f s (reconnect %d)",
            self.info.id,
            reconnector.last_recovery_s or 0.0,
            reconnector.reconnects,
        )
        self._set_state(StateStatus(latest.status, "reconnected"))
        held, self._held = list(self._held), deque(maxlen=_HELD_CONTROLS)
        try:
            if self._held_keys is not None:  # the keys held now, as a snapshot newer than any the checkpoint has
                await self.send_keys(self._held_keys.keys)
            for message in held:
                await self.send(message)
        except ConnectError as exc:
            logger.info("session %s: the held controls could not be sent yet: %s", self.info.id, exc)

    async def _end_reconnect(self, reason: str, error: tuple[str, str] | None) -> None:
        await self._drop_link()
        if self.done is not None:
            return
        if error is not None:
            failure = ErrorStatus(*error)
            self.errors.append(failure)
            self._notify(failure)
        self.done = DoneStatus(reason)
        self._done_event.set()
        self._frame_arrived.set()
        self._status_arrived.set()
        self._notify(self.done)

    def _set_state(self, status: StateStatus) -> None:
        self.state = status.state
        self._notify(status)

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
        """Send one control message. While the stream reconnects it is held and sent on the new connection (key
        snapshots: the newest one only)."""
        if isinstance(message, ControlState):
            self._held_keys = message
        reconnector = self._reconnector
        if reconnector is not None and reconnector.phase is ReconnectPhase.RECOVERING and self.done is None:
            if not isinstance(message, ControlState):
                self._held.append(message)
            return
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
            tracker = arrived.tracker or self._tracker
            if tracker.awaits_status(arrived.frame_id) and self.done is None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_LABEL_WAIT_S):
                        while tracker.awaits_status(arrived.frame_id) and self.done is None:
                            self._status_arrived.clear()
                            await self._status_arrived.wait()
            chunk, first = tracker.label_id(arrived.frame_id)
            return ReceivedFrame(
                arrived.image, arrived.at, None, chunk, first and not arrived.repeat, arrived.repeat, arrived.frame_id
            )
        if arrived.rtp is None:
            return ReceivedFrame(arrived.image, arrived.at, None, arrived.chunk, arrived.first)
        # Labelled as it is read: statuses that came after the frame, and a better fitted offset, count too.
        tracker = arrived.tracker or self._tracker
        chunk, first, pts = tracker.label(arrived.rtp)
        repeat = pts is not None and tracker.is_repeat(pts, self.info.fps)
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
            reconnects=0 if self._reconnector is None else self._reconnector.reconnects,
            last_recovery_s=None if self._reconnector is None else self._reconnector.last_recovery_s,
        )

    async def aclose(self) -> None:
        """Close the link within `close_timeout` seconds, whatever its state: a link still closing then is cut
        short (logged; an embedded link still closes its sockets), not waited for; a lost link the reconnect was
        closing is waited for as long. A stream closed before its `done` reads `done` as closed by the client.
        Idempotent."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        if self._reconnector is not None:
            self._reconnector.ended("connection closed by the client")
        link, self._link = self._link, None
        try:
            if link is not None:
                await self._close_link(link, "the connection")
            closing = list(self._closing)  # a lost link the cancelled watcher was closing
            if closing:
                _, pending = await asyncio.wait(closing, timeout=self._close_timeout)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*closing, return_exceptions=True)
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
    reconnect: ReconnectPolicy | None = _RECONNECT,
) -> LiveStream:
    """Join a streaming session (`info` from `ServiceClient.wait_streaming`) over the transport its details name.

    `ice_addresses` (embedded): the host candidate addresses; "auto" picks `default_ice_addresses(service.url)`,
    None gathers on every interface but loopback. `livekit_token`: a token the caller minted for the identity it
    named in the create (`livekit.controller_identity`); by default the controller token of the details.
    `close_timeout` bounds the stream's `aclose()`. `reconnect` (embedded): the bounds of the automatic reconnect
    after a lost connection (module docstring); None: a lost connection ends the stream. Raises `ConnectError`, or
    the `ApiError` of a refused offer."""
    details = info.transport
    if details is None:
        raise ConnectError(f"session {info.id} has no join details (status {info.status})")
    stream = LiveStream(info, frame_buffer=frame_buffer, close_timeout=close_timeout)
    kind = details.get("kind")
    link: Link
    if kind == "embedded":
        addresses = default_ice_addresses(service.url) if ice_addresses == "auto" else ice_addresses
        link = await EmbeddedLink.open(service, stream, details, host_addresses=addresses, within=connect_timeout)
        if reconnect is not None:

            async def rejoin(stream: LiveStream, latest: SessionInfo) -> Link:
                again = latest.transport if latest.transport is not None else details
                return await EmbeddedLink.open(service, stream, again, host_addresses=addresses, within=connect_timeout)

            stream.attach_link(link)
            stream.reconnect_with(reconnect, service, rejoin)
            return stream
    elif kind == "livekit":
        link = await LiveKitLink.open(stream, details, token=livekit_token, within=connect_timeout)
    else:
        raise ConnectError(f"unknown transport kind {kind!r}")
    stream.attach_link(link)
    return stream
