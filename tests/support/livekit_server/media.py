"""The two peer connections of one participant (LiveKit's v0 signalling: publisher and subscriber), over aiortc.

The client offers on its **publisher** connection (its tracks and its `_reliable`/`_lossy` data channels) and the
stand-in answers; the stand-in offers on the **subscriber** connection (the room's tracks, relayed, and its own
`_reliable`/`_lossy` channels, which the client adopts by label) and the client answers. Candidates travel in the
SDP from here (aiortc gathers before it describes) and by trickle from the client.

What the measured gotchas ask for (../shared/research/livekit-signalling.md): `bundlePolicy=MAX_BUNDLE`; one
subscriber offer at a time, the next only after its answer and only once the connection is up (an answer applied
while DTLS is still connecting left aiortc's new RTP sender unstarted); a relayed track's stream id is
`<participant sid>|<track sid>` and its track id the track sid, which is how both SDKs find the publication.

Media is relayed by decoding and encoding again (aiortc has no RTP forwarding): fine at test sizes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from aiortc import (
    RTCConfiguration,
    RTCDataChannel,
    RTCPeerConnection,
    RTCRtpTransceiver,
    RTCSessionDescription,
)
from aiortc.contrib.media import MediaRelay
from aiortc.mediastreams import MediaStreamTrack
from aiortc.rtcconfiguration import RTCBundlePolicy
from aiortc.sdp import candidate_from_sdp
from livekit.protocol import rtc

__all__ = ["DATA_LABELS", "ParticipantMedia", "PublishedTrack"]

logger = logging.getLogger(__name__)

DATA_LABELS = ("_reliable", "_lossy")
"""The data channels LiveKit clients open on their publisher connection and adopt on their subscriber one."""

_ANSWER_TIMEOUT_S = 15.0
_CONNECTED_TIMEOUT_S = 15.0

SendSignal = Callable[[rtc.SignalResponse], None]
OnTrack = Callable[[MediaStreamTrack, str | None], None]  # the client's track, its transceiver's mid
OnData = Callable[[str, bytes], None]  # channel label, payload


@dataclass(slots=True)
class PublishedTrack:
    """A track the room relays: who publishes it and the relay its subscribers read from."""

    participant_sid: str
    track_sid: str
    source: MediaStreamTrack
    relay: MediaRelay


def _configuration() -> RTCConfiguration:
    return RTCConfiguration(iceServers=[], bundlePolicy=RTCBundlePolicy.MAX_BUNDLE)


class ParticipantMedia:
    """Both peer connections of one participant. `start()` opens the subscriber side; the rest follows signalling.

    Subscriber offers are serialised by one negotiation task: `subscribe()` asks for a renegotiation, which starts
    once the previous answer is in and (after the first) the connection is up. `close()` closes both connections
    and cancels that task.
    """

    def __init__(self, label: str, send: SendSignal, on_track: OnTrack, on_data: OnData) -> None:
        self._label = label
        self._send = send
        self._on_track = on_track
        self._on_data = on_data
        self.publisher: RTCPeerConnection | None = None
        self.subscriber = RTCPeerConnection(_configuration())
        self._channels: dict[str, RTCDataChannel] = {}
        self._wanted = asyncio.Event()
        self._answer: asyncio.Future[None] | None = None
        self._connected = asyncio.Event()
        self._negotiations = 0
        self._negotiator: asyncio.Task[None] | None = None
        self._closed = False
        self.subscribed: dict[str, RTCRtpTransceiver] = {}
        self._to_add: list[PublishedTrack] = []

        @self.subscriber.on("connectionstatechange")
        def _on_state() -> None:
            if self.subscriber.connectionState == "connected":
                self._connected.set()
            else:
                self._connected.clear()

    # -- subscriber side ------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Open the stand-in's data channels on the subscriber connection and send its first offer."""
        self._channels["_reliable"] = self.subscriber.createDataChannel("_reliable", ordered=True)
        self._channels["_lossy"] = self.subscriber.createDataChannel("_lossy", ordered=False, maxRetransmits=0)
        self._negotiator = asyncio.get_running_loop().create_task(self._negotiate(), name=f"negotiate {self._label}")
        self._wanted.set()

    def subscribe(self, track: PublishedTrack) -> None:
        """Relay `track` to this participant (a new send-only media section in the next offer) and renegotiate."""
        if self._closed or track.track_sid in self.subscribed or track in self._to_add:
            return
        self._to_add.append(track)
        self._wanted.set()

    def _add_tracks(self) -> None:
        # Only after the first offer (the data channels alone) was answered: aiortc, asked to bundle a media
        # section with a data channel created before it, discards the transport both share.
        for track in self._to_add:
            relayed = track.relay.subscribe(track.source, buffered=False)
            transceiver = self.subscriber.addTransceiver(relayed, "sendonly")
            # LiveKit's msid convention; aiortc has no API to name a sender's stream and track, so set what it writes.
            transceiver.sender._stream_id = f"{track.participant_sid}|{track.track_sid}"
            transceiver.sender._track_id = track.track_sid
            self.subscribed[track.track_sid] = transceiver
        self._to_add.clear()

    def unsubscribe(self, track_sid: str) -> None:
        """Stop relaying a track (its media section stays, idle; the client learned of the unpublish already)."""
        transceiver = self.subscribed.pop(track_sid, None)
        if transceiver is not None and transceiver.sender.track is not None:
            transceiver.sender.track.stop()

    async def _negotiate_once(self) -> None:
        if self._negotiations > 0:
            async with asyncio.timeout(_CONNECTED_TIMEOUT_S):
                await self._connected.wait()
            self._add_tracks()
        self._negotiations += 1
        await self.subscriber.setLocalDescription(await self.subscriber.createOffer())
        description = self.subscriber.localDescription
        self._answer = asyncio.get_running_loop().create_future()
        self._send(rtc.SignalResponse(offer=rtc.SessionDescription(type="offer", sdp=description.sdp)))
        async with asyncio.timeout(_ANSWER_TIMEOUT_S):
            await self._answer

    async def _negotiate(self) -> None:
        while not self._closed:
            await self._wanted.wait()
            self._wanted.clear()
            try:
                await self._negotiate_once()
                if self._to_add:
                    self._wanted.set()
            except TimeoutError:
                logger.warning("%s: subscriber negotiation timed out; trying again when asked", self._label)
            except Exception:
                logger.exception("%s: subscriber negotiation failed; trying again when asked", self._label)
            finally:
                self._answer = None

    async def apply_answer(self, sdp: str) -> None:
        """Apply the client's answer to the pending subscriber offer (ignored when none is pending). Applied here,
        on the signalling reader, so that the candidates the client trickles next find it in place."""
        pending = self._answer
        if pending is None or pending.done():
            return
        try:
            await self.subscriber.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))
        except Exception as exc:
            pending.set_exception(exc)
            return
        pending.set_result(None)

    def send_data(self, label: str, payload: bytes) -> bool:
        """Send on the subscriber connection's channel `label`; False when it is not open (the packet is lost)."""
        channel = self._channels.get(label)
        if channel is None or channel.readyState != "open":
            return False
        channel.send(payload)
        return True

    # -- publisher side -------------------------------------------------------------------------------------------

    async def answer_offer(self, sdp: str) -> str:
        """Answer the client's publisher offer (the first creates the connection; later ones renegotiate)."""
        if self.publisher is None:
            publisher = RTCPeerConnection(_configuration())
            self.publisher = publisher

            @publisher.on("track")
            def _on_track(track: MediaStreamTrack) -> None:
                mid = next((t.mid for t in publisher.getTransceivers() if t.receiver.track is track), None)
                self._on_track(track, mid)

            @publisher.on("datachannel")
            def _on_channel(channel: RTCDataChannel) -> None:
                label = channel.label

                @channel.on("message")
                def _on_message(message: bytes | str) -> None:
                    if isinstance(message, bytes):
                        self._on_data(label, message)

        await self.publisher.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        await self.publisher.setLocalDescription(await self.publisher.createAnswer())
        return self.publisher.localDescription.sdp

    async def add_candidate(self, trickle: rtc.TrickleRequest) -> None:
        """A candidate the client trickled, for the connection it names."""
        connection = self.subscriber if trickle.target == rtc.SignalTarget.SUBSCRIBER else self.publisher
        if connection is None or not trickle.candidateInit:
            return
        init = json.loads(trickle.candidateInit)
        line = str(init.get("candidate") or "")
        if not line:
            return  # end of candidates
        candidate = candidate_from_sdp(line.split(":", 1)[1] if line.startswith("candidate:") else line)
        candidate.sdpMid = init.get("sdpMid")
        candidate.sdpMLineIndex = init.get("sdpMLineIndex")
        with contextlib.suppress(Exception):  # a candidate for a section aiortc bundled away, an mDNS name
            await connection.addIceCandidate(candidate)

    # -- both -----------------------------------------------------------------------------------------------------

    @property
    def connection_states(self) -> dict[str, str]:
        states = {"subscriber": self.subscriber.connectionState}
        if self.publisher is not None:
            states["publisher"] = self.publisher.connectionState
        return states

    async def close(self) -> None:
        self._closed = True
        if self._negotiator is not None:
            self._negotiator.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._negotiator
        for transceiver in self.subscribed.values():
            if transceiver.sender.track is not None:
                transceiver.sender.track.stop()
        self.subscribed.clear()
        await self.subscriber.close()
        if self.publisher is not None:
            await self.publisher.close()
