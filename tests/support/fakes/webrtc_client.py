"""An aiortc peer that plays the browser of the embedded transport: a receive-only video transceiver and a
"control" data channel, offered to `EmbeddedTransport.answer`, host candidates on loopback only."""

from __future__ import annotations

import asyncio
import contextlib

import av
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from pipeline.bidirectional import ControlMessage
from tests.support.fakes.transport_port import frame_value
from transport.base import StatusMessage
from transport.embedded.rtc import ice_host_addresses
from transport.embedded.transport import EmbeddedTransport
from transport.protocol import ProtocolError, decode_status, encode_control

LOOPBACK = ("127.0.0.1",)
_WAIT = 10.0  # seconds a test waits for something that should happen promptly


def frame_index_of(frame: av.VideoFrame, first: int = 0, span: int = 50) -> int:
    """Which `make_frames` frame this decoded frame shows (flat grey levels 4 apart survive VP8 well)."""
    level = float(frame.to_ndarray(format="rgb24").mean()) - 3.5
    return min(range(first, first + span), key=lambda i: abs(frame_value(i) - level))


class BrowserPeer:
    def __init__(self, *, with_video: bool = True, label: str = "control") -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        if with_video:
            self.pc.addTransceiver("video", direction="recvonly")
        self.channel = self.pc.createDataChannel(label)
        self.frames: asyncio.Queue[av.VideoFrame] = asyncio.Queue()
        self.status: asyncio.Queue[StatusMessage | ProtocolError] = asyncio.Queue()
        self.opened = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self.channel.on("open", self.opened.set)
        self.channel.on("message", lambda message: self.status.put_nowait(decode_status(message)))
        self.pc.on("track", self._on_track)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "video":
            self._reader = asyncio.get_running_loop().create_task(self._read(track))

    async def _read(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                assert isinstance(frame, av.VideoFrame)
                self.frames.put_nowait(frame)

    async def offer(self) -> str:
        with ice_host_addresses(LOOPBACK):
            await self.pc.setLocalDescription(await self.pc.createOffer())
        local = self.pc.localDescription
        assert local is not None
        return local.sdp

    async def connect(self, transport: EmbeddedTransport, session_id: str) -> str:
        """Offer, apply the answer, wait for the control channel to open; returns the answer SDP."""
        async with asyncio.timeout(_WAIT):
            sdp, kind = await transport.answer(session_id, await self.offer(), "offer")
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type=kind))
            await self.opened.wait()
        return sdp

    def send(self, message: ControlMessage | str | bytes) -> None:
        if isinstance(message, str | bytes):
            self.channel.send(message)
        else:
            self.channel.send(encode_control(message).decode())

    async def next_frame(self) -> av.VideoFrame:
        async with asyncio.timeout(_WAIT):
            return await self.frames.get()

    async def next_status(self) -> StatusMessage | ProtocolError:
        async with asyncio.timeout(_WAIT):
            return await self.status.get()

    async def close(self) -> None:
        await self.pc.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
