"""The room seam: the little of a LiveKit room the binding uses, and the real adapter over `livekit.rtc.Room`.

`Room` is our own protocol, so the binding's reconnect, departure and data logic is tested against a scripted fake
(`tests/support/fakes/livekit.py`) through the same seam the real SDK sits behind. The adapter `LiveKitRoom` translates
the SDK's events into plain values (identities, reason names, bytes) and registers only plain-function callbacks
(the SDK refuses coroutines).

`livekit.rtc` loads a native FFI library that must never be loaded before a fork: this module imports it only
inside the functions that run on the event loop, so importing `transport` from a service that may fork is safe.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from transport.errors import LinkLostError, RoomJoinError, TransportConfigError
from transport.redaction import redact_tokens
from transport.session.pacing import PacedFrame

if TYPE_CHECKING:
    from livekit import rtc

__all__ = [
    "OVER_DISCONNECT_REASONS",
    "LiveKitRoom",
    "LiveKitVideo",
    "LocalParticipantHandle",
    "LocalVideo",
    "Room",
    "RoomConnectionState",
    "RoomEventName",
    "RoomFactory",
    "RoomJoinOptions",
    "RpcFailure",
    "RpcHandler",
    "VideoPublishOptions",
    "livekit_room_factory",
]

logger = logging.getLogger(__name__)

RoomEventName = Literal[
    "participant_connected",  # callback(identity: str)
    "participant_disconnected",  # callback(identity: str)
    "data_received",  # callback(payload: bytes, identity: str | None, topic: str)
    "reconnecting",  # callback()
    "reconnected",  # callback()
    "disconnected",  # callback(reason: str), a livekit DisconnectReason name such as "ROOM_DELETED"
    "connection_state_changed",  # callback(state: RoomConnectionState)
    "local_track_subscribed",  # callback(track_sid: str): the first subscription to a track we published
]

OVER_DISCONNECT_REASONS: frozenset[str] = frozenset(
    {"ROOM_DELETED", "ROOM_CLOSED", "PARTICIPANT_REMOVED", "DUPLICATE_IDENTITY"}
)
"""Disconnect reasons after which rejoining is pointless or wrong: the session's room connection is over."""


_FRAME_ID_MASK = 0xFFFFFFFF  # LiveKit's frame_id is 32 bits: 8.5 years of frames at 16 fps before it wraps


class RoomConnectionState(enum.Enum):
    DISCONNECTED = "disconnected"
    CONNECTED = "connected"
    RECONNECTING = "reconnecting"


@dataclass(frozen=True, slots=True)
class RoomJoinOptions:
    """`auto_subscribe` is off for the service: it publishes and never watches. `connect_timeout` in seconds."""

    auto_subscribe: bool = False
    connect_timeout: float | None = 10.0


@dataclass(frozen=True, slots=True)
class VideoPublishOptions:
    """How the one video track is published: a single layer (no simulcast), an explicit encoding. `frame_metadata`:
    every frame carries LiveKit frame metadata (its `frame_id` and a `user_timestamp`, see `LiveKitVideo.capture`),
    which subscribers read back (`VideoFrameEvent.metadata` in the Python SDK)."""

    codec: Literal["vp8", "h264"] = "vp8"
    max_bitrate: int = 1_500_000
    max_framerate: float = 16.0
    simulcast: bool = False
    frame_metadata: bool = True

    def __post_init__(self) -> None:
        if self.codec not in ("vp8", "h264"):
            raise TransportConfigError(f"video codec must be 'vp8' or 'h264', got {self.codec!r}")
        if self.max_bitrate < 10_000:
            raise TransportConfigError(f"max_bitrate must be at least 10 kbit/s, got {self.max_bitrate}")
        if not self.max_framerate > 0:
            raise TransportConfigError(f"max_framerate must be positive, got {self.max_framerate}")


@dataclass(frozen=True, slots=True)
class RpcFailure:
    """How an RPC handler refuses a call: the caller's SDK raises `RpcError(code, message, data)`. `code` is ours
    (not 1001-1999, which LiveKit reserves), `data` the stable string code (`transport.livekit.rpc`)."""

    code: int
    message: str
    data: str | None = None


RpcHandler = Callable[[str, str], "str | RpcFailure"]
"""An RPC method's handler: `(caller_identity, payload)` → the response payload, or an `RpcFailure`. Plain and
synchronous: it runs on the event loop and must not block."""


class LocalVideo(Protocol):
    """A local video source and its track: frames in (RGB `[H, W, 3]` uint8), one track to publish."""

    def capture(self, frame: PacedFrame) -> None: ...

    async def aclose(self) -> None: ...


class LocalParticipantHandle(Protocol):
    @property
    def identity(self) -> str: ...

    async def publish_track(self, video: LocalVideo, options: VideoPublishOptions) -> None: ...

    async def publish_data(
        self, payload: bytes, *, reliable: bool, topic: str, destination_identities: Sequence[str] = ()
    ) -> None: ...

    def register_rpc_method(self, method: str, handler: RpcHandler) -> None:
        """Answer calls of `method` with `handler` (after `connect`; a new room registers again)."""
        ...

    async def set_attributes(self, attributes: Mapping[str, str]) -> None:
        """Set (merge) the participant's attributes; needs the token's canUpdateOwnMetadata grant. Raises
        `LinkLostError` when the server did not take them."""
        ...


class Room(Protocol):
    """One connection of one participant to one room. Create a new one per (re)join."""

    @property
    def connection_state(self) -> RoomConnectionState: ...

    @property
    def local_participant(self) -> LocalParticipantHandle: ...

    @property
    def remote_identities(self) -> frozenset[str]: ...

    def remote_attributes(self) -> Mapping[str, Mapping[str, str]]:
        """The attributes of every remote participant in the room now, by identity."""
        ...

    def on(self, event: RoomEventName, callback: Callable[..., None]) -> None:
        """Register a plain (non-async) callback; see `RoomEventName` for each event's arguments."""
        ...

    async def connect(self, url: str, token: str, options: RoomJoinOptions) -> None:
        """Join; raises `RoomJoinError` when the server refuses or cannot be reached."""
        ...

    async def disconnect(self) -> None: ...

    def create_video(self, name: str, width: int, height: int) -> LocalVideo: ...


RoomFactory = Callable[[], Room]


class LiveKitVideo:
    """`rtc.VideoSource` + `rtc.LocalVideoTrack`. `capture` checks the frame's size itself: the SDK's
    `capture_frame` reads `width * height * 3` bytes from whatever buffer it is given.

    Every frame is stamped with LiveKit frame metadata (sent only when the track was published with its features,
    `VideoPublishOptions.frame_metadata`): `frame_id` is the frame's index in the session's video
    (`PacedFrame.frame_index`, the id `chunk` statuses name in `first_frame_id`); a keep-warm repeat carries the id of
    the frame it repeats, so a receiver knows a repeat as an id it has already seen. `user_timestamp` is the wall
    clock (microseconds since the epoch) when the frame was handed to the source: when it left the pacer for the
    encoder."""

    def __init__(self, name: str, width: int, height: int) -> None:
        from livekit import rtc

        self._width = width
        self._height = height
        self._source = rtc.VideoSource(width, height)
        self.track = rtc.LocalVideoTrack.create_video_track(name, self._source)
        self._closed = False

    @property
    def source(self) -> rtc.VideoSource:
        return self._source

    def capture(self, frame: PacedFrame) -> None:
        from livekit import rtc

        if self._closed:
            return
        image = frame.image
        if image.dtype != np.uint8 or image.shape != (self._height, self._width, 3):
            raise ValueError(
                f"frame {frame.frame_index} is {image.shape} {image.dtype}; "
                f"the source takes {self._height}x{self._width}x3 uint8"
            )
        data = np.ascontiguousarray(image).tobytes()
        if len(data) != self._width * self._height * 3:  # the SDK would read past the buffer otherwise
            raise ValueError(
                f"frame {frame.frame_index} has {len(data)} bytes, expected {self._width * self._height * 3}"
            )
        metadata = rtc.FrameMetadata(frame_id=frame.frame_index & _FRAME_ID_MASK, user_timestamp=time.time_ns() // 1000)
        self._source.capture_frame(
            rtc.VideoFrame(self._width, self._height, rtc.VideoBufferType.RGB24, data), metadata=metadata
        )

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._source.aclose()


class _LiveKitParticipant:
    def __init__(self, participant: rtc.LocalParticipant) -> None:
        self._participant = participant

    @property
    def identity(self) -> str:
        return self._participant.identity

    async def publish_track(self, video: LocalVideo, options: VideoPublishOptions) -> None:
        from livekit import rtc

        if not isinstance(video, LiveKitVideo):
            raise TypeError("LiveKitRoom publishes only LiveKitVideo tracks")
        codec = rtc.VideoCodec.VP8 if options.codec == "vp8" else rtc.VideoCodec.H264
        features = (
            [rtc.FrameMetadataFeature.FMF_FRAME_ID, rtc.FrameMetadataFeature.FMF_USER_TIMESTAMP]
            if options.frame_metadata
            else []
        )
        publish = rtc.TrackPublishOptions(
            source=rtc.TrackSource.SOURCE_CAMERA,
            simulcast=options.simulcast,
            video_codec=codec,
            video_encoding=rtc.VideoEncoding(
                max_bitrate=options.max_bitrate, max_framerate=float(options.max_framerate)
            ),
            frame_metadata_features=features,
        )
        await self._participant.publish_track(video.track, publish)

    async def publish_data(
        self, payload: bytes, *, reliable: bool, topic: str, destination_identities: Sequence[str] = ()
    ) -> None:
        from livekit.rtc.participant import PublishDataError

        try:
            await self._participant.publish_data(
                payload, reliable=reliable, topic=topic, destination_identities=list(destination_identities)
            )
        except PublishDataError as exc:
            raise LinkLostError(f"data not published: {exc}") from exc

    def register_rpc_method(self, method: str, handler: RpcHandler) -> None:
        from livekit import rtc

        # A plain function: the SDK awaits coroutine handlers under the caller's timeout, but ours never wait.
        def invoke(call: rtc.RpcInvocationData) -> str:
            answer = handler(call.caller_identity, call.payload)
            if isinstance(answer, RpcFailure):
                raise rtc.RpcError(answer.code, answer.message, answer.data)
            return answer

        self._participant.register_rpc_method(method, invoke)

    async def set_attributes(self, attributes: Mapping[str, str]) -> None:
        try:
            await self._participant.set_attributes(dict(attributes))
        except Exception as exc:  # the SDK raises its FFI errors untyped
            raise LinkLostError(f"attributes not set: {type(exc).__name__}: {exc}") from exc


class LiveKitRoom:
    """The real `Room`: a `livekit.rtc.Room` created on the running loop."""

    def __init__(self) -> None:
        from livekit import rtc

        self._room = rtc.Room()
        self._callbacks: dict[str, list[Callable[..., None]]] = {}
        self._install()

    def _emit(self, event: RoomEventName, *args: object) -> None:
        for callback in tuple(self._callbacks.get(event, ())):
            try:
                callback(*args)
            except Exception:
                logger.exception("room callback for %s failed", event)

    def _install(self) -> None:
        from livekit import rtc

        # Plain functions only: the SDK's EventEmitter rejects coroutine functions.
        def on_connected(participant: rtc.RemoteParticipant) -> None:
            self._emit("participant_connected", participant.identity)

        def on_disconnected(participant: rtc.RemoteParticipant) -> None:
            self._emit("participant_disconnected", participant.identity)

        def on_data(packet: rtc.DataPacket) -> None:
            identity = packet.participant.identity if packet.participant is not None else None
            self._emit("data_received", bytes(packet.data), identity, packet.topic or "")

        def on_reconnecting() -> None:
            self._emit("reconnecting")

        def on_reconnected() -> None:
            self._emit("reconnected")

        def on_room_disconnected(reason: int) -> None:
            try:
                name = rtc.DisconnectReason.Name(reason)  # type: ignore[arg-type]
            except ValueError:
                name = "UNKNOWN_REASON"
            self._emit("disconnected", name)

        def on_state(state: int) -> None:
            self._emit("connection_state_changed", _state_from_sdk(state))

        def on_local_track_subscribed(track: rtc.Track) -> None:
            self._emit("local_track_subscribed", track.sid)

        self._room.on("participant_connected", on_connected)
        self._room.on("participant_disconnected", on_disconnected)
        self._room.on("data_received", on_data)
        self._room.on("reconnecting", on_reconnecting)
        self._room.on("reconnected", on_reconnected)
        self._room.on("disconnected", on_room_disconnected)
        self._room.on("connection_state_changed", on_state)
        self._room.on("local_track_subscribed", on_local_track_subscribed)

    @property
    def sdk_room(self) -> rtc.Room:
        return self._room

    @property
    def connection_state(self) -> RoomConnectionState:
        return _state_from_sdk(self._room.connection_state)

    @property
    def local_participant(self) -> LocalParticipantHandle:
        return _LiveKitParticipant(self._room.local_participant)

    @property
    def remote_identities(self) -> frozenset[str]:
        return frozenset(self._room.remote_participants)

    def remote_attributes(self) -> Mapping[str, Mapping[str, str]]:
        return {identity: p.attributes for identity, p in self._room.remote_participants.items()}

    def on(self, event: RoomEventName, callback: Callable[..., None]) -> None:
        self._callbacks.setdefault(event, []).append(callback)

    async def connect(self, url: str, token: str, options: RoomJoinOptions) -> None:
        from livekit import rtc

        try:
            await self._room.connect(
                url,
                token,
                rtc.RoomOptions(auto_subscribe=options.auto_subscribe, connect_timeout=options.connect_timeout),
            )
        except rtc.ConnectError as exc:
            # Not chained: the SDK's message quotes the token of a refused join (redacted here, not in `exc`).
            raise RoomJoinError(f"{redact_tokens(exc.message)} (server {url})") from None

    async def disconnect(self) -> None:
        await self._room.disconnect()

    def create_video(self, name: str, width: int, height: int) -> LocalVideo:
        return LiveKitVideo(name, width, height)


def _state_from_sdk(state: int) -> RoomConnectionState:
    from livekit import rtc

    if state == rtc.ConnectionState.CONN_CONNECTED:
        return RoomConnectionState.CONNECTED
    if state == rtc.ConnectionState.CONN_RECONNECTING:
        return RoomConnectionState.RECONNECTING
    return RoomConnectionState.DISCONNECTED


def livekit_room_factory() -> Room:
    return LiveKitRoom()
