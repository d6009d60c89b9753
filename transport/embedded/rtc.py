"""The aiortc pieces the embedded transport's peer connections share: the paced video track, where ICE host
candidates are gathered, and answering an offer with a track.

Host candidates: aioice gathers on every interface except loopback and has no setting to change that.
`ice_host_addresses(...)` limits gathering to the given addresses for the peer connections negotiated inside it,
by wrapping aioice's address lookup once (the wrapper reads a context variable and otherwise defers to aioice).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import fractions
from collections import deque
from collections.abc import Iterator, Sequence

import aioice.ice
import av
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from transport.errors import SignalingError
from transport.session.pacing import VIDEO_CLOCK_RATE, PacedFrame, frame_pts

__all__ = ["TRACK_QUEUE", "PacedVideoTrack", "ice_host_addresses", "install_host_address_hook", "negotiate"]

TRACK_QUEUE = 3  # frames waiting in a track for the RTP sender; the pacer already paces, this only absorbs jitter

_HOST_ADDRESSES: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "lingstream_ice_host_addresses", default=None
)


class _HostAddressHook:
    """Installs, once per process, a wrapper around `aioice.ice.get_host_addresses` that honours
    `_HOST_ADDRESSES` and otherwise calls the original."""

    installed = False

    @classmethod
    def install(cls) -> None:
        if cls.installed:
            return
        original = aioice.ice.get_host_addresses

        def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
            chosen = _HOST_ADDRESSES.get()
            if chosen is None:
                return original(use_ipv4, use_ipv6)
            return [address for address in chosen if (use_ipv6 if ":" in address else use_ipv4)]

        aioice.ice.get_host_addresses = host_addresses
        cls.installed = True


@contextlib.contextmanager
def ice_host_addresses(addresses: Sequence[str] | None) -> Iterator[None]:
    """Gather ICE host candidates only on `addresses` for peer connections whose local description is set inside
    this block (None: aioice's default). Context-local: other tasks are not affected."""
    _HostAddressHook.install()
    token = _HOST_ADDRESSES.set(tuple(addresses) if addresses is not None else None)
    try:
        yield
    finally:
        _HOST_ADDRESSES.reset(token)


class PacedVideoTrack(MediaStreamTrack):
    """A video track fed by the frame pacer: `offer(frame)` from the pacer's sink, `recv()` by aiortc's sender.

    The pacer already releases frames on their deadlines, so `recv` only waits for the next one. Between the two
    sits a queue of `TRACK_QUEUE` frames, latest wins (the oldest is dropped, counted). Presentation timestamps
    are the frame's slot on the output timeline at 90 kHz (`transport.session.pacing.frame_pts`: a keep-warm repeat's is
    off the slot grid), so they advance with wall time even when frames are dropped. A generated frame offered while
    repeats still wait in the queue replaces them (not counted as dropped): a repeat never goes out ahead of it.
    `stop()` ends a pending `recv` with `MediaStreamError`, which ends aiortc's sender loop.
    """

    kind = "video"

    def __init__(self, fps: float) -> None:
        super().__init__()
        self._fps = fps
        self._frames: deque[PacedFrame] = deque()
        self._available = asyncio.Event()
        self.dropped = 0
        self.delivered = 0
        self.first_pts: int | None = None  # the pts of the first frame handed to the sender: a receiver's zero

    def offer(self, frame: PacedFrame) -> None:
        if self.readyState != "live":
            return
        if not frame.repeat and self._frames and self._frames[-1].repeat:
            self._frames = deque(queued for queued in self._frames if not queued.repeat)
        if len(self._frames) >= TRACK_QUEUE:
            self._frames.popleft()
            self.dropped += 1
        self._frames.append(frame)
        self._available.set()

    async def recv(self) -> av.VideoFrame:
        while not self._frames:
            if self.readyState != "live":
                raise MediaStreamError
            self._available.clear()
            await self._available.wait()
        if self.readyState != "live":
            raise MediaStreamError
        frame = self._frames.popleft()
        video = av.VideoFrame.from_ndarray(frame.image, format="rgb24")
        video.pts = frame_pts(frame, self._fps)
        video.time_base = fractions.Fraction(1, VIDEO_CLOCK_RATE)
        if self.first_pts is None:
            self.first_pts = video.pts
        self.delivered += 1
        return video

    def stop(self) -> None:
        super().stop()
        self._frames.clear()
        self._available.set()


def install_host_address_hook() -> None:
    """Install the wrapper behind `ice_host_addresses` (once per process; idempotent)."""
    _HostAddressHook.install()


async def negotiate(pc: RTCPeerConnection, track: PacedVideoTrack, offer_sdp: str) -> RTCSessionDescription:
    """Apply a browser's offer to `pc`, send `track` on its video section and return the answer (candidates
    included: aiortc gathers before answering). Raises `SignalingError` for an offer without a video section;
    aiortc's own errors for a malformed SDP pass through (the caller translates them)."""
    await pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
    if not any(transceiver.kind == "video" for transceiver in pc.getTransceivers()):
        raise SignalingError("the offer has no video media section (add a recvonly video transceiver)")
    pc.addTrack(track)
    await pc.setLocalDescription(await pc.createAnswer())
    local = pc.localDescription
    if local is None:
        raise SignalingError("aiortc produced no local description")
    return local
