"""The media half of the Python client: one live session joined over its transport, frames in, control out.

`LiveStream` is what a client holds while a session streams. It sends control protocol v1 (`send_keys` snapshots and
`send_prompt` prompts, each with its own increasing `seq`, `reset_pose`, `pause`, `resume`, `stop`), receives the
video as numpy RGB arrays (`ReceivedFrame`) and the status messages (`chunk`, `state`, `error`, `done`, and any
other the service sends, through the status listeners). It does not care how it is connected: a `Link` carries
bytes and frames, and there are two, chosen by the session's join details:

- `EmbeddedLink` (`kind: embedded`): an aiortc peer connection with a receive-only video transceiver and the
  `control` data channel, offered to the session's `offer_url` (candidates included, no trickle);
- `LiveKitLink` (`kind: livekit`): the `livekit` SDK joins the room with the controller token (or one the caller
  minted for the identity it named), subscribes to the service identity's video track and talks on the control and
  status topics. `livekit.rtc` (a native library) is imported only here, on first use.

Which chunk a frame shows (`ReceivedFrame.chunk`): a `chunk` status leaves the service with the chunk's first frame
and carries that frame's 90 kHz presentation timestamp (`first_frame_pts`; docs/control-protocol.md). On the
embedded transport a decoded frame carries its RTP timestamp counted from the first frame received, which is the
presentation timestamp minus one offset per connection; the service sends that offset in chunk statuses
(`stream_base_pts`) and `ChunkTracker` labels each frame exactly as it is read (before the offset arrives it fits
one from when statuses and frames arrive, see its docstring). The LiveKit
SDK does not expose RTP timestamps, so there a status is given to the next frame that arrives after it (within the
jitter of two independent paths).

Keep-warm repeats (`ReceivedFrame.repeat`): while a session has nothing new to show (no key held, paused,
generation behind), the service sends its last frame again every `LINGSTREAM_IDLE_FRAME_INTERVAL_MS` so that the
receiver stays in step. A repeat is labelled like the frame it repeats (same chunk, never `first_of_chunk`); on the
embedded transport its presentation timestamp lies off the frame grid (`transport.session.pacing.REPEAT_PTS_OFFSET`), so
once the offset came from the service (`stream_base_pts`) `repeat` is exact; on LiveKit (no timestamps) repeats
cannot be told apart and `repeat` is always False.

Frames wait in a bounded buffer (`frame_buffer`, default 64) whose overflow policy is *drop oldest* (counted in
`statistics().frames_dropped`): a consumer slower than the video loses old frames, never the newest.

Cancellation: `aclose()` closes the link (peer connection or room) and cancels and awaits its reader tasks; frames
still buffered stay readable until drained.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import ipaddress
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

import av
import numpy as np
import numpy.typing as npt
from aiortc import RTCConfiguration, RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from pipeline.bidirectional import ControlMessage, ControlState, Pause, ResetPose, Resume, SetPrompt, Stop
from transport.base import ChunkStatus, DoneStatus, ErrorStatus, StateStatus, StatusMessage
from transport.client.api import ServiceClient, SessionInfo
from transport.client.errors import ConnectError
from transport.embedded.rtc import ice_host_addresses
from transport.protocol import MAX_SEQ, ProtocolError, decode_status, encode_control
from transport.session.pacing import REPEAT_PTS_OFFSET, grid_offset, is_repeat_pts

__all__ = [
    "ChunkTracker",
    "EmbeddedLink",
    "Link",
    "LiveKitLink",
    "LiveStream",
    "ReceivedFrame",
    "StreamStatistics",
    "connect",
    "default_ice_addresses",
]

logger = logging.getLogger(__name__)

_FRAME_BUFFER = 64
_CONNECT_TIMEOUT_S = 20.0
_PENDING_LIMIT = 64  # stamped statuses waiting for their frame; more means frames are lost, the oldest go
_KEPT_STATUSES = 512  # stamped statuses kept to label frames read later (a few hundred chunks back)
_FIT_STATUSES = 32  # the recent statuses the RTP offset is fitted over
_FIT_FRAMES = 128  # the recent frames it is fitted over
_EARLY_S = 0.005  # a frame may come this much before its status and still count as after it (clock jitter)
_PAIR_WINDOW_S = 1.0  # how long after its status a frame may come to be considered its frame


@dataclass(frozen=True, slots=True)
class ReceivedFrame:
    """One decoded video frame. `image`: `(height, width, 3)` uint8 RGB. `received_at`: `time.monotonic()` when it
    was decoded. `pts`: its presentation timestamp on the session's 90 kHz clock (embedded only, once the offset
    is known; None otherwise). `chunk`: the `chunk` status of the chunk it belongs to (None before the first);
    `first_of_chunk`: it is that chunk's first frame received. `repeat`: a keep-warm repeat of the frame before it,
    not a generated frame (see the module docstring: embedded only)."""

    image: npt.NDArray[np.uint8]
    received_at: float
    pts: int | None
    chunk: ChunkStatus | None
    first_of_chunk: bool
    repeat: bool = False


@dataclass(frozen=True, slots=True)
class _Arrived:
    image: npt.NDArray[np.uint8]
    at: float
    rtp: int | None
    chunk: ChunkStatus | None  # the arrival-order label (no RTP timestamp)
    first: bool


@dataclass(frozen=True, slots=True)
class StreamStatistics:
    frames_received: int
    frames_dropped: int
    chunks: int
    errors: int
    controls_sent: int


class ChunkTracker:
    """Which chunk a received frame shows (see the module docstring). Pure: times are given, nothing is read.

    With RTP timestamps (the embedded transport), `status(chunk, at)` and `frame(rtp, at)` record what arrived when,
    and `label(rtp)` names the chunk a frame shows, any time later (a status that comes after its frame still labels
    it). aiortc hands out a frame's RTP timestamp counted from the first frame received, so a frame's presentation
    timestamp is its RTP timestamp plus one offset per connection: the presentation timestamp of that first frame,
    which the service sends in chunk statuses (`stream_base_pts`) once the frame went out. Until then (and with a
    service that does not send it) the offset is fitted over the recent statuses and frames: each candidate pairs a
    status with a frame that arrived near it; a candidate is refused when more than a tenth of the statuses it pairs
    with a frame would have been overtaken by that frame (a chunk's first frame leaves the service with its status
    and takes the longer way: encoding, RTP, decoding); of the rest, the one whose frames follow their statuses most
    closely (smallest median delay) wins. Under a load that delays every frame by more than a frame interval behind
    its status, a fitted offset can be a frame off. A keep-warm repeat sent just before a chunk's first frame may
    arrive after its status and pair with it more closely than the chunk's frame does; with the session's `fps`
    known, a candidate under which a recent frame lies `REPEAT_PTS_OFFSET` *before* the statuses' grid is refused
    (nothing lies there: generated frames are on the grid, repeats after it; it is what pairing a status with a
    repeat makes of the generated frames).

    Without RTP timestamps (LiveKit), `frame(None, at)` gives each status, in order, to the next frame that arrives.
    """

    __slots__ = (
        "_by_pts",
        "_current",
        "_exact",
        "_fits",
        "_fps",
        "_fresh",
        "_offset",
        "_pending",
        "_recent_frames",
        "_recent_statuses",
        "_sorted",
    )

    def __init__(self, fps: float | None = None) -> None:
        self._fps = fps  # the session's frame rate: lets the fit refuse an offset fitted on a repeat
        self._by_pts: dict[int, ChunkStatus] = {}
        self._sorted: list[int] = []
        self._recent_statuses: deque[tuple[int, float]] = deque(maxlen=_FIT_STATUSES)
        self._recent_frames: deque[tuple[int, float]] = deque(maxlen=_FIT_FRAMES)
        self._offset: int | None = None
        self._exact = False  # the offset came from the service (`stream_base_pts`), not from a fit
        self._fits = 0
        self._pending: deque[ChunkStatus] = deque()  # without timestamps: statuses waiting for the next frame
        self._current: ChunkStatus | None = None
        self._fresh = False

    @property
    def offset(self) -> int | None:
        """A frame's presentation timestamp minus its RTP timestamp, once fitted."""
        return self._offset

    @property
    def exact(self) -> bool:
        """The offset came from the service (`stream_base_pts`), not from a fit."""
        return self._exact

    def is_repeat(self, pts: int, fps: float) -> bool:
        """Whether the frame presented at `pts` is a keep-warm repeat: off the grid of the stamped chunk statuses'
        first frames. Judged only with the service's offset (a fitted one may have been fitted on a repeat)."""
        if not self._exact or not self._sorted:
            return False
        return is_repeat_pts(pts, self._sorted[-1], fps)

    def status(self, chunk: ChunkStatus, at: float) -> None:
        pts = chunk.first_frame_pts
        if pts is None:
            return  # no frame was stamped for it (none left to pace, or it went out early): it labels no frame
        if len(self._pending) >= _PENDING_LIMIT:
            self._pending.popleft()
        self._pending.append(chunk)
        if pts not in self._by_pts:
            bisect.insort(self._sorted, pts)
            if len(self._sorted) > _KEPT_STATUSES:
                del self._by_pts[self._sorted.pop(0)]
        self._by_pts[pts] = chunk
        if chunk.stream_base_pts is not None:
            self._offset, self._exact = chunk.stream_base_pts, True
        if self._exact:
            return
        self._recent_statuses.append((pts, at))
        self._fits += 1
        if self._fits <= _FIT_STATUSES or self._fits % 8 == 0:
            self._fit()

    def frame(self, rtp: int | None, at: float) -> tuple[ChunkStatus | None, bool]:
        """Record a frame's arrival. Without a timestamp, its label by arrival order (chunk, first of it)."""
        if rtp is not None:
            if not self._exact:
                self._recent_frames.append((rtp, at))
                if self._offset is None and self._recent_statuses:
                    self._fit()
            return None, False
        if self._pending:
            self._current, self._fresh = self._pending.popleft(), True
        first, self._fresh = self._fresh, False
        return self._current, first

    def label(self, rtp: int) -> tuple[ChunkStatus | None, bool, int | None]:
        """The chunk a frame with this RTP timestamp shows, whether it is that chunk's first frame, and the frame's
        presentation timestamp (all None/False until the offset is known)."""
        if self._offset is None:
            return None, False, None
        pts = rtp + self._offset
        # One tick of slack: the track and the status round the same slot's timestamp separately.
        at = bisect.bisect_right(self._sorted, pts + 1) - 1
        if at < 0:
            return None, False, pts
        first_pts = self._sorted[at]
        return self._by_pts[first_pts], abs(first_pts - pts) <= 1, pts

    def _fit(self) -> None:
        arrivals = dict(self._recent_frames)
        statuses = tuple(self._recent_statuses)
        candidates = {
            pts - rtp
            for pts, status_at in statuses
            for rtp, frame_at in self._recent_frames
            if -_EARLY_S <= frame_at - status_at <= _PAIR_WINDOW_S
        }
        ranked: list[tuple[float, int, int]] = []  # (median delay, -pairs, offset)
        for offset in candidates:
            delays = sorted(
                arrivals[pts - offset] - status_at for pts, status_at in statuses if pts - offset in arrivals
            )
            overtaken = sum(1 for delay in delays if delay < -_EARLY_S)
            if not delays or overtaken * 10 > len(delays):
                continue
            ranked.append((delays[len(delays) // 2], -len(delays), offset))
        for _, _, offset in sorted(ranked):
            if not self._fitted_on_a_repeat(offset, statuses[-1][0]):
                self._offset = offset
                return

    def _fitted_on_a_repeat(self, offset: int, reference_pts: int) -> bool:
        fps = self._fps
        if fps is None:
            return False
        return any(
            abs(grid_offset(rtp + offset, reference_pts, fps) + REPEAT_PTS_OFFSET) <= 1
            for rtp, _ in self._recent_frames
        )


class Link(Protocol):
    """How a `LiveStream` is connected: it sends control bytes and is closed; frames and status bytes reach the
    stream through the callbacks it was opened with."""

    async def send(self, payload: bytes, *, reliable: bool) -> None: ...

    async def aclose(self) -> None: ...


FrameCallback = Callable[[npt.NDArray[np.uint8], int | None], None]
StatusCallback = Callable[[bytes | str], None]


class LiveStream:
    """A joined session: control out, frames and status in. Made by `connect`; see the module docstring.

    `send_keys(keys)` sends a `control_state` snapshot with the next `seq` (the first is the wall clock in
    milliseconds, as docs/control-protocol.md suggests, then one more per snapshot) and returns it; `sent_at(seq)`
    is when (monotonic). `next_frame()` / `frames()` read the video; `last_chunk`, `errors` and `done` hold the
    status messages; `stop()` asks the session to end and waits for `done`."""

    def __init__(self, info: SessionInfo, *, frame_buffer: int = _FRAME_BUFFER) -> None:
        if frame_buffer < 1:
            raise ValueError(f"frame_buffer must be at least 1, got {frame_buffer}")
        self.info = info
        self._link: Link | None = None
        self._frames: deque[_Arrived] = deque()
        self._frame_buffer = frame_buffer
        self._frame_arrived = asyncio.Event()
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
        self._frames_received = 0
        self._frames_dropped = 0
        self._chunks = 0
        self._controls_sent = 0

    # -- wiring (called by the link) ------------------------------------------------------------------------------

    def attach_link(self, link: Link) -> None:
        self._link = link

    def on_frame(self, image: npt.NDArray[np.uint8], rtp: int | None) -> None:
        now = time.monotonic()
        chunk, first = self._tracker.frame(rtp, now)
        if len(self._frames) >= self._frame_buffer:
            self._frames.popleft()
            self._frames_dropped += 1
        self._frames.append(_Arrived(image, now, rtp, chunk, first))
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
            case StateStatus(state=state):
                self.state = state
            case ErrorStatus():
                self.errors.append(message)
            case DoneStatus():
                self.done = message
                self._done_event.set()
                self._frame_arrived.set()  # a reader waiting for frames learns that none will come
        for listener in tuple(self._status_listeners):
            listener(message)

    def on_link_lost(self, why: str) -> None:
        """The link ended for good (the room or peer connection closed); readers stop waiting."""
        logger.info("session %s: the connection ended: %s", self.info.id, why)
        if self.done is not None:
            return
        self.done = DoneStatus(f"connection lost: {why}")
        self._done_event.set()
        self._frame_arrived.set()
        for listener in tuple(self._status_listeners):
            listener(self.done)

    @property
    def ended(self) -> bool:
        """The session sent `done`, or the connection ended for good."""
        return self.done is not None

    def add_status_listener(self, listener: Callable[[StatusMessage], None]) -> None:
        """Call `listener` with every status message from now on (on the event loop; it must not block), and with
        the `done` that stands for a connection that ended."""
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

    async def send_prompt(self, text: str) -> int:
        """Replace the session's text prompt from the next chunk on; returns the prompt's `seq` (a chunk status
        reports `prompt` and `prompt_seq` once a chunk was generated from it). The service bounds the text
        (`prompt_too_large`) and may rate-limit prompts (`rate_limited` error statuses)."""
        self._prompt_seq = min(self._prompt_seq + 1, MAX_SEQ)
        seq = self._prompt_seq
        await self.send(SetPrompt(seq, text))
        return seq

    async def reset_pose(self) -> None:
        await self.send(ResetPose())

    async def pause(self) -> None:
        """Generate nothing more until `resume()` (the chunk in progress is still delivered)."""
        await self.send(Pause())

    async def resume(self) -> None:
        await self.send(Resume())

    async def stop(self) -> DoneStatus:
        """Send `stop` and wait for `done` (the chunk in progress is delivered first). Bound it with
        `asyncio.timeout`."""
        if self.done is None:
            await self.send(Stop())
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
        )

    async def aclose(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            await link.aclose()
        self._done_event.set()
        self._frame_arrived.set()

    async def __aenter__(self) -> LiveStream:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()


# -- embedded WebRTC ----------------------------------------------------------------------------------------------


def default_ice_addresses(url: str) -> tuple[str, ...] | None:
    """Where a client of the service at `url` gathers ICE host candidates: loopback for a loopback service
    (aioice skips loopback otherwise, and a service bound to 127.0.0.1 offers nothing else), else aioice's
    default (every interface but loopback)."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return ("127.0.0.1",)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return (str(address),) if address.is_loopback else None


class EmbeddedLink:
    """The embedded transport's side of a client: one aiortc peer connection. `open` offers it to the session's
    `offer_url` and waits for the control channel to open (`ConnectError` otherwise)."""

    def __init__(self, stream: LiveStream) -> None:
        self._stream = stream
        self._pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self._channel: RTCDataChannel | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    async def open(
        cls,
        service: ServiceClient,
        stream: LiveStream,
        details: Mapping[str, Any],
        *,
        host_addresses: Sequence[str] | None,
        within: float,
    ) -> EmbeddedLink:
        link = cls(stream)
        try:
            await link._negotiate(service, details, host_addresses, within)
        except BaseException:
            await link.aclose()
            raise
        return link

    async def _negotiate(
        self, service: ServiceClient, details: Mapping[str, Any], host_addresses: Sequence[str] | None, within: float
    ) -> None:
        pc = self._pc
        pc.addTransceiver("video", direction="recvonly")
        channel = pc.createDataChannel(str(details.get("data_channel") or "control"))
        self._channel = channel
        opened = asyncio.Event()
        channel.on("open", opened.set)
        channel.on("message", self._stream.on_status)
        channel.on("close", lambda: self._lost("the data channel closed"))
        pc.on("track", self._on_track)
        pc.on("connectionstatechange", self._on_state)
        with ice_host_addresses(host_addresses):
            await pc.setLocalDescription(await pc.createOffer())
        local = pc.localDescription
        answer = await service.request(
            "POST", str(details["offer_url"]), json={"sdp": local.sdp, "type": local.type}, timeout=within
        )
        body = answer.json()
        await pc.setRemoteDescription(RTCSessionDescription(sdp=body["sdp"], type=body["type"]))
        try:
            async with asyncio.timeout(within):
                await opened.wait()
        except TimeoutError:
            raise ConnectError(f"the control channel did not open within {within:g} s") from None

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "video" and self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(self._read(track), name="client-video")

    async def _read(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                if not isinstance(frame, av.VideoFrame):
                    continue
                image = np.asarray(frame.to_ndarray(format="rgb24"), dtype=np.uint8)
                self._stream.on_frame(image, None if frame.pts is None else int(frame.pts))

    def _on_state(self) -> None:
        if self._pc.connectionState in ("failed", "closed"):
            self._lost(f"the peer connection {self._pc.connectionState}")

    def _lost(self, why: str) -> None:
        if not self._closed:
            self._stream.on_link_lost(why)

    async def send(self, payload: bytes, *, reliable: bool) -> None:
        channel = self._channel
        if channel is None or channel.readyState != "open":
            raise ConnectError("the control channel is not open")
        channel.send(payload.decode("ascii"))

    async def aclose(self) -> None:
        self._closed = True
        reader, self._reader = self._reader, None
        await self._pc.close()
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)


# -- LiveKit ------------------------------------------------------------------------------------------------------


class LiveKitLink:
    """The LiveKit side of a client: the `livekit` SDK in the session's room. `open` joins with `token` (the
    controller token from the join details unless the caller minted its own), waits for the service identity's
    video track and reads it as RGB24; `ConnectError` when the room cannot be joined or no track comes in time."""

    def __init__(self, stream: LiveStream, details: Mapping[str, Any]) -> None:
        from livekit import rtc

        self._rtc = rtc
        self._stream = stream
        self._room = rtc.Room()
        self._service_identity = str(details.get("service_identity") or "")
        self._control_topic = str(details.get("control_topic") or "lingstream.control")
        self._status_topic = str(details.get("status_topic") or "lingstream.status")
        self._video: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._track_ready = asyncio.Event()
        self._closed = False

    @classmethod
    async def open(
        cls, stream: LiveStream, details: Mapping[str, Any], *, token: str | None, within: float
    ) -> LiveKitLink:
        link = cls(stream, details)
        try:
            await link._join(
                str(details["url"]), token if token is not None else str(details.get("token") or ""), within
            )
        except BaseException:
            await link.aclose()
            raise
        return link

    async def _join(self, url: str, token: str, within: float) -> None:
        rtc = self._rtc
        room = self._room
        room.on("data_received", self._on_data)
        room.on("track_subscribed", self._on_track)
        room.on("disconnected", lambda reason: self._lost(f"disconnected ({reason})"))
        if not token:
            raise ConnectError("no LiveKit token: the session names its own controller identity; pass its token")
        try:
            # The SDK bounds each signal attempt but retries a failed ICE connection on its own: bound the whole.
            async with asyncio.timeout(2 * within):
                await room.connect(url, token, rtc.RoomOptions(auto_subscribe=True, connect_timeout=within))
        except rtc.ConnectError as exc:
            raise ConnectError(f"joining the LiveKit room failed: {exc.message}") from exc
        except TimeoutError:
            raise ConnectError(f"joining the LiveKit room took over {2 * within:g} s") from None
        try:
            async with asyncio.timeout(within):
                await self._track_ready.wait()
        except TimeoutError:
            raise ConnectError(f"no video track from {self._service_identity} within {within:g} s") from None

    def _on_data(self, packet: Any) -> None:
        if packet.topic == self._status_topic:
            participant = packet.participant
            if participant is None or participant.identity == self._service_identity:
                self._stream.on_status(bytes(packet.data))

    def _on_track(self, track: Any, _publication: Any, participant: Any) -> None:
        rtc = self._rtc
        if participant.identity != self._service_identity or track.kind != rtc.TrackKind.KIND_VIDEO:
            return
        if self._reader is not None:
            return
        self._video = rtc.VideoStream(track, format=rtc.VideoBufferType.RGB24)
        self._reader = asyncio.get_running_loop().create_task(self._read(self._video), name="client-livekit-video")
        self._track_ready.set()

    async def _read(self, video: Any) -> None:
        async for event in video:
            frame = event.frame
            image = np.frombuffer(bytes(frame.data), np.uint8).reshape(frame.height, frame.width, 3)
            self._stream.on_frame(image, None)

    def _lost(self, why: str) -> None:
        if not self._closed:
            self._stream.on_link_lost(why)

    async def send(self, payload: bytes, *, reliable: bool) -> None:
        await self._room.local_participant.publish_data(payload, reliable=reliable, topic=self._control_topic)

    async def aclose(self) -> None:
        # Streams first, then the room: the SDK's native side may abort at exit otherwise.
        self._closed = True
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        video, self._video = self._video, None
        if video is not None:
            await video.aclose()
        await self._room.disconnect()


async def connect(
    service: ServiceClient,
    info: SessionInfo,
    *,
    ice_addresses: Sequence[str] | Literal["auto"] | None = "auto",
    livekit_token: str | None = None,
    frame_buffer: int = _FRAME_BUFFER,
    connect_timeout: float = _CONNECT_TIMEOUT_S,
) -> LiveStream:
    """Join a streaming session (`info` from `ServiceClient.wait_streaming`) over the transport its details name.

    `ice_addresses` (embedded): the host candidate addresses; "auto" picks `default_ice_addresses(service.url)`,
    None gathers on every interface but loopback. `livekit_token`: a token the caller minted for the identity it
    named in the create (`livekit.controller_identity`); by default the controller token of the details.
    Raises `ConnectError`, or the `ApiError` of a refused offer."""
    details = info.transport
    if details is None:
        raise ConnectError(f"session {info.id} has no join details (status {info.status})")
    stream = LiveStream(info, frame_buffer=frame_buffer)
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
