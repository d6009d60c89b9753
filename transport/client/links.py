"""How a `LiveStream` is connected (`Link`): it sends control bytes and is closed; frames and status bytes reach the
stream through its `on_frame`, `on_status` and `on_link_lost`. Two links, chosen by the session's join details:

- `EmbeddedLink` (`kind: embedded`): an aiortc peer connection with a receive-only video transceiver and the
  `control` data channel, offered to the session's `offer_url` (candidates included, no trickle);
- `LiveKitLink` (`kind: livekit`): the `livekit` SDK in the session's room. `livekit.rtc` (a native library) is
  imported only here, when a link is made, so that importing `transport.client` loads no LiveKit. It is also a
  `CommandLink`: the discrete commands go as RPC calls to the service participant and return the session's state
  (a service without the RPC methods gets the packet instead).

Cancellation: `aclose()` closes the peer connection or the room and cancels and awaits the link's reader task.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

import av
import numpy as np
from aiortc import RTCConfiguration, RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.stats import RTCRemoteOutboundRtpStreamStats

from transport.base import StateStatus
from transport.client.api import ServiceClient
from transport.client.errors import ConnectError, ControlRefusedError
from transport.embedded.rtc import ice_host_addresses
from transport.protocol import control_type, decode_status, encode_control

if TYPE_CHECKING:
    from pipeline.bidirectional import ControlMessage
    from transport.client.stream import LiveStream

__all__ = ["CommandLink", "EmbeddedLink", "Link", "LiveKitLink", "default_ice_addresses"]

logger = logging.getLogger(__name__)

# LiveKit's RPC errors after which the command goes as a packet instead: a method the service participant does not
# have (an older service), a server without RPC, no acknowledgement in time (the call never arrived). Sending the
# packet then is safe: every command is idempotent or deduplicated by its `seq`.
_PACKET_INSTEAD = frozenset({1400, 1403, 1501})
# LiveKit's RPC error when the callee left the room before its answer arrived (the SDK learns of the departure by
# signalling, which can overtake the answer's data packet): after a `stop`, the session is over, as asked.
_RECIPIENT_DISCONNECTED = 1503
KNOWN_WITHIN_S = 3.0
"""How long a LiveKit link's first control packet waits for the service to show it knows this participant (its
`state` status on our joining): a packet sent before the service's SDK learnt of its sender is dropped there."""
_REPORT_POLL_S = 0.5  # how often an embedded link reads its receiver's statistics for the service's RTCP reports


class Link(Protocol):
    """How a `LiveStream` is connected: it sends control bytes and is closed; frames and status bytes reach the
    stream through the callbacks it was opened with."""

    async def send(self, payload: bytes, *, reliable: bool) -> None: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class CommandLink(Protocol):
    """A link that sends a discrete command (`Pause`, `Resume`, `ResetPose`, `Stop`, `SetPrompt`) as a call with an
    answer: the session's state after it, or None when the command went as a packet after all (no answer). Raises
    `ControlRefusedError` when the session refuses it."""

    async def command(self, message: ControlMessage) -> str | None: ...


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
        self._reports: asyncio.Task[None] | None = None
        self._ice: list[Any] = []  # aioice connections of the peer connection's ICE transports
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
        # Every ICE connection the offer gathers on (before the answer's BUNDLE group leaves one unused)
        self._ice = _ice_connections(pc)
        with ice_host_addresses(host_addresses):
            await pc.setLocalDescription(await pc.createOffer())
        local = pc.localDescription
        answer = await service.answer_offer(str(details["offer_url"]), local.sdp, within=within)
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        try:
            async with asyncio.timeout(within):
                await opened.wait()
        except TimeoutError:
            raise ConnectError(f"the control channel did not open within {within:g} s") from None
        self._reports = asyncio.get_running_loop().create_task(self._sender_reports(), name="client-sender-reports")

    async def _sender_reports(self) -> None:
        """Tell the stream each time an RTCP sender report of the service arrived: its video sender sends one every
        0.5-1.5 s as long as the peer connection lives, frames or not (a paused session, a model resting while no
        key is held), so a stream that hears none for seconds has lost its service (the automatic reconnect's
        liveness; `LiveStream.on_alive`). aiortc has no event for an RTCP packet: its receiver's statistics are
        read every `_REPORT_POLL_S`, the arrival time of the newest report in them."""
        newest: object = None
        while True:
            await asyncio.sleep(_REPORT_POLL_S)
            try:
                reports = [await receiver.getStats() for receiver in self._pc.getReceivers()]
            except Exception as exc:  # aiortc's statistics of a closing connection: stop listening, frames remain
                logger.debug("the service's sender reports cannot be read any more: %r", exc)
                return
            for report in reports:
                for stats in report.values():
                    if isinstance(stats, RTCRemoteOutboundRtpStreamStats) and stats.timestamp != newest:
                        newest = stats.timestamp
                        self._stream.on_alive()

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
            self._lost(f"the peer connection {self._pc.connectionState}", failed=self._pc.connectionState == "failed")

    def _lost(self, why: str, *, failed: bool = False) -> None:
        if not self._closed:
            self._stream.on_link_lost(why, failed=failed)

    async def send(self, payload: bytes, *, reliable: bool) -> None:
        channel = self._channel
        if channel is None or channel.readyState != "open":
            raise ConnectError("the control channel is not open")
        channel.send(payload.decode("ascii"))

    async def aclose(self) -> None:
        self._closed = True
        reader, self._reader = self._reader, None
        reports, self._reports = self._reports, None
        try:
            if reports is not None:
                reports.cancel()
                await asyncio.gather(reports, return_exceptions=True)
            await self._pc.close()
        finally:
            # What the peer connection's close did not reach, because it was cut short (cancelled: the stream's
            # close bound) or never had it: the UDP sockets are closed here, not left to the garbage collector.
            _close_sockets(self._ice)
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)


def _ice_connections(pc: RTCPeerConnection) -> list[Any]:
    """The aioice connections under `pc`'s ICE transports (media and data), each once."""
    transports = [transceiver.receiver.transport for transceiver in pc.getTransceivers()]
    if pc.sctp is not None:
        transports.append(pc.sctp.transport)
    connections: list[Any] = []
    for dtls in transports:
        connection = getattr(dtls.transport, "_connection", None)  # aiortc's RTCIceTransport keeps its aioice one
        if connection is not None and all(connection is not known for known in connections):
            connections.append(connection)
    return connections


def _close_sockets(connections: Sequence[Any]) -> None:
    """Close the UDP transports the aioice `connections` still hold (synchronous, idempotent)."""
    for connection in connections:
        for protocol in list(getattr(connection, "_protocols", ())):
            transport = getattr(protocol, "transport", None)
            if transport is not None and not transport.is_closing():
                transport.close()


def is_source_placeholder(image: np.ndarray, frame_id: int | None, *, stamped: bool) -> bool:
    """Whether a LiveKit frame is the SDK's placeholder rather than the session's: a native `VideoSource` sends an
    all-zero frame every 100 ms until it is given its first one (measured, docs/testing.md), so a subscriber can read
    black frames before the service captured anything, and after the first chunk status on a loaded machine. The
    service stamps every frame it captures with its frame id, so once a stamped frame came on the link (`stamped`),
    a frame with no id is a placeholder whatever it shows; before, a frame with no id and nothing in it is (a service
    that stamps nothing sends no ids at all). An adopter's new source sends its own placeholders after the old
    track's stamped frames (issue #33: measured, six 8x8 black frames without an id over 150 ms, 2 s after the
    SIGKILL; taken for frames, they were labelled by arrival with old chunks and a follower's chunks went back)."""
    return frame_id is None and (stamped or not image.any())


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
        self._retiring: set[asyncio.Task[None]] = set()  # replaced tracks' readers being closed
        self._stamped = False  # a frame with the service's frame id came (on any track): the service stamps them all
        self._track_ready = asyncio.Event()
        self._known = asyncio.Event()  # the service told us its state since we joined: it knows us (`send`)
        self._closed = False
        self.track_switches = 0  # video tracks of the service identity that replaced the one read before

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

    @property
    def room(self) -> Any:
        """The SDK's `rtc.Room` this link joined (for calls of a caller's own: RPC, data on other topics)."""
        return self._room

    @property
    def service_identity(self) -> str:
        return self._service_identity

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
                data = bytes(packet.data)
                if not self._known.is_set() and isinstance(decode_status(data), StateStatus):
                    self._known.set()
                self._stream.on_status(data)

    def _on_track(self, track: Any, _publication: Any, participant: Any) -> None:
        """The service identity's video track, read from now on. A later one replaces it: the session was adopted
        by another replica, which joined the room again as the same identity and published anew
        (docs/continuity.md); the frames go on in the same stream, their frame ids continuing the session's."""
        rtc = self._rtc
        if participant.identity != self._service_identity or track.kind != rtc.TrackKind.KIND_VIDEO:
            return
        previous = (self._reader, self._video)
        self._video = rtc.VideoStream(track, format=rtc.VideoBufferType.RGB24)
        self._reader = asyncio.get_running_loop().create_task(self._read(self._video), name="client-livekit-video")
        self._track_ready.set()
        if previous[0] is not None:
            self.track_switches += 1
            retire = asyncio.get_running_loop().create_task(self._retire(*previous), name="client-livekit-retire")
            self._retiring.add(retire)
            retire.add_done_callback(self._retiring.discard)

    @staticmethod
    async def _retire(reader: asyncio.Task[None] | None, video: Any) -> None:
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        if video is not None:
            await video.aclose()

    async def _read(self, video: Any) -> None:
        async for event in video:
            frame = event.frame
            image = np.frombuffer(bytes(frame.data), np.uint8).reshape(frame.height, frame.width, 3)
            metadata = event.metadata  # the service stamps every frame with its frame id (LiveKit frame metadata)
            frame_id = int(metadata.frame_id) if metadata is not None and metadata.HasField("frame_id") else None
            if is_source_placeholder(image, frame_id, stamped=self._stamped):
                continue
            self._stamped = self._stamped or frame_id is not None
            self._stream.on_frame(image, None, frame_id)

    def _lost(self, why: str) -> None:
        if not self._closed:
            self._stream.on_link_lost(why)

    async def send(self, payload: bytes, *, reliable: bool) -> None:
        """Publish a control packet to the room. The first waits (up to `KNOWN_WITHIN_S`) until the service has
        shown that it knows this participant: a packet that reaches the service participant before its SDK has
        learnt of the sender (the packet takes the data channel, the join notice the signalling connection) comes
        with no sender there and is dropped as foreign, and the LiveKit SDK does not pass the sender's identity on
        (docs/livekit.md). The sign is the `state` status the service sends a controller when it sees it join; a
        service that sends none (it had no state yet) costs the first packet that wait, once."""
        if not self._known.is_set():
            try:
                async with asyncio.timeout(KNOWN_WITHIN_S):
                    await self._known.wait()
            except TimeoutError:
                logger.info(
                    "no state from %s within %g s of joining; sending anyway", self._service_identity, KNOWN_WITHIN_S
                )
                self._known.set()
        await self._room.local_participant.publish_data(payload, reliable=reliable, topic=self._control_topic)

    async def command(self, message: ControlMessage) -> str | None:
        """`message` as the RPC method `lingstream.<type>` of the service participant (docs/livekit.md); the
        session's state from the answer. A service without the method (LiveKit's 1400), a server without RPC (1403)
        or a call never acknowledged (1501) gets the packet instead, and None."""
        rtc = self._rtc
        method = f"lingstream.{control_type(message)}"
        payload = encode_control(message).decode("ascii")
        try:
            answer = await self._room.local_participant.perform_rpc(
                destination_identity=self._service_identity, method=method, payload=payload
            )
        except rtc.RpcError as exc:
            if exc.code in _PACKET_INSTEAD:
                await self.send(encode_control(message), reliable=True)
                return None
            if exc.code == _RECIPIENT_DISCONNECTED and control_type(message) == "stop":
                return None  # the service left the room (the session ended) before its answer reached us
            raise ControlRefusedError(exc.data or f"rpc_{exc.code}", exc.message, exc.code) from exc
        state = json.loads(answer).get("state")
        return state if isinstance(state, str) else None

    async def aclose(self) -> None:
        # Streams first, then the room: the SDK's native side may abort at exit otherwise.
        self._closed = True
        await asyncio.gather(*self._retiring, return_exceptions=True)
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        video, self._video = self._video, None
        if video is not None:
            await video.aclose()
        await self._room.disconnect()
