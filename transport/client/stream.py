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
embedded transport a decoded frame keeps its RTP timestamp, which is the presentation timestamp plus an offset the
sender picked: `ChunkTracker` learns the offset from the first frame after the first stamped status and then
assigns every frame exactly (the first chunk after connecting may be off by one frame if its frame overtook its
status). The LiveKit SDK does not expose RTP timestamps, so there a status is assigned to the next frame that
arrives after it (within the jitter of two independent paths).

Frames wait in a bounded buffer (`frame_buffer`, default 64) whose overflow policy is *drop oldest* (counted in
`statistics().frames_dropped`): a consumer slower than the video loses old frames, never the newest.

Cancellation: `aclose()` closes the link (peer connection or room) and cancels and awaits its reader tasks; frames
still buffered stay readable until drained.
"""

from __future__ import annotations

import asyncio
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
from transport.embedded import ice_host_addresses
from transport.protocol import MAX_SEQ, ProtocolError, decode_status, encode_control

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

_WRAP = 1 << 32  # RTP timestamps are 32-bit
_FRAME_BUFFER = 64
_CONNECT_TIMEOUT_S = 20.0
_PENDING_LIMIT = 64  # stamped statuses waiting for their frame; more means frames are lost, the oldest go


@dataclass(frozen=True, slots=True)
class ReceivedFrame:
    """One decoded video frame. `image`: `(height, width, 3)` uint8 RGB. `received_at`: `time.monotonic()` when it
    was decoded. `pts`: its presentation timestamp on the session's 90 kHz clock (embedded only, once the offset
    is known; None otherwise). `chunk`: the `chunk` status of the chunk it belongs to (None before the first);
    `first_of_chunk`: it is that chunk's first frame received."""

    image: npt.NDArray[np.uint8]
    received_at: float
    pts: int | None
    chunk: ChunkStatus | None
    first_of_chunk: bool


@dataclass(frozen=True, slots=True)
class StreamStatistics:
    frames_received: int
    frames_dropped: int
    chunks: int
    errors: int
    controls_sent: int


class ChunkTracker:
    """Assigns received frames to chunk statuses (see the module docstring). Pure: no clock, no I/O.

    `status(chunk)` records a chunk status as it arrives; `frame(rtp)` says which chunk the next received frame
    shows, given its RTP timestamp (None where the transport does not expose one), and whether it is that chunk's
    first frame. Returns the frame's presentation timestamp too (None until the offset is known)."""

    __slots__ = ("_current", "_fresh", "_origin", "_pending")

    def __init__(self) -> None:
        self._pending: deque[ChunkStatus] = deque()
        self._current: ChunkStatus | None = None
        self._fresh = False
        self._origin: int | None = None

    @property
    def current(self) -> ChunkStatus | None:
        return self._current

    def status(self, chunk: ChunkStatus) -> None:
        if chunk.first_frame_pts is None:
            # No frame was paced for it (it ended before): it never shows; only its metadata is news.
            return
        if len(self._pending) >= _PENDING_LIMIT:
            self._pending.popleft()
        self._pending.append(chunk)

    def frame(self, rtp: int | None) -> tuple[ChunkStatus | None, bool, int | None]:
        if rtp is None:
            if self._pending:
                self._current, self._fresh = self._pending.popleft(), True
            first, self._fresh = self._fresh, False
            return self._current, first, None
        if self._origin is None:
            if not self._pending:
                return self._current, False, None
            first_pts = self._pending[0].first_frame_pts
            assert first_pts is not None
            self._origin = (rtp - first_pts) % _WRAP
        pts = (rtp - self._origin) % _WRAP
        while self._pending:
            head_pts = self._pending[0].first_frame_pts
            assert head_pts is not None
            ahead = ((pts - head_pts + _WRAP // 2) % _WRAP) - _WRAP // 2  # signed, modulo 2^32
            if ahead < 0:
                break
            self._current, self._fresh = self._pending.popleft(), True
        first, self._fresh = self._fresh, False
        return self._current, first, pts


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
        self._frames: deque[ReceivedFrame] = deque()
        self._frame_buffer = frame_buffer
        self._frame_arrived = asyncio.Event()
        self._tracker = ChunkTracker()
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
        chunk, first, pts = self._tracker.frame(rtp)
        if len(self._frames) >= self._frame_buffer:
            self._frames.popleft()
            self._frames_dropped += 1
        self._frames.append(ReceivedFrame(image, time.monotonic(), pts, chunk, first))
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
                self._tracker.status(message)
            case StateStatus(state=state):
                self.state = state
            case ErrorStatus():
                self.errors.append(message)
            case DoneStatus():
                self.done = message
                self._done_event.set()
                self._frame_arrived.set()  # a reader waiting for frames learns that none will come
        for listener in self._status_listeners:
            listener(message)

    def on_link_lost(self, why: str) -> None:
        """The link ended for good (the room or peer connection closed); readers stop waiting."""
        logger.info("session %s: the connection ended: %s", self.info.id, why)
        if self.done is None:
            self.done = DoneStatus(f"connection lost: {why}")
        self._done_event.set()
        self._frame_arrived.set()

    @property
    def ended(self) -> bool:
        """The session sent `done`, or the connection ended for good."""
        return self.done is not None

    def add_status_listener(self, listener: Callable[[StatusMessage], None]) -> None:
        """Call `listener` with every status message from now on (on the event loop; it must not block)."""
        self._status_listeners.append(listener)

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
        return self._frames.popleft()

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
            await room.connect(url, token, rtc.RoomOptions(auto_subscribe=True, connect_timeout=within))
        except rtc.ConnectError as exc:
            raise ConnectError(f"joining the LiveKit room failed: {exc.message}") from exc
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
