"""The viewers of one embedded session: receive-only peer connections beside the controller's, none of them steering.

Each viewer has its own peer connection, video track and data channel. The session's frames are offered to every
connected viewer's track as the pacer releases them (the same frames the controller gets, at the same instants);
its status messages reach each viewer from the moment the viewer's data channel opens (the current state first),
as the controller gets them: the binding hands every status it relays to `relay`, after holding a chunk status
until the chunk's first frame went out and stamping it with that frame's `first_frame_pts` (a page learns the RTP
offset of its frames from that, and so tells keep-warm repeats from generated frames), and each viewer's copy
carries its own track's `stream_base_pts`. Nothing a viewer sends is applied: its first message on a channel is
answered with an `error` status `viewer_cannot_control`, every message is counted.

A slow viewer never slows the controller or the other viewers: offering a frame never waits (a viewer's track keeps
`TRACK_QUEUE` frames, the oldest is dropped and counted when its sender is behind), and a status message that would
pile up more than `status_buffer_bytes` unsent in a viewer's data channel is dropped and counted instead of sent.

A viewer holds its place (`ViewerSeats`) from its credential until its peer connection fails or closes; an offer
with the same credential replaces the viewer's peer connection (a rebind, same place). Cancellation: `aclose()`
closes every viewer's peer connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

from aiortc import RTCConfiguration, RTCDataChannel, RTCPeerConnection

from transport.base import ChunkStatus, ErrorStatus, SessionPort, StateStatus, StatusMessage
from transport.embedded.config import EmbeddedConfig
from transport.embedded.rtc import PacedVideoTrack, ice_host_addresses, negotiate
from transport.errors import SessionNotAttachedError, SignalingError
from transport.session.outbox import encode_outbound
from transport.session.pacing import PacedFrame
from transport.session.viewers import ViewerSeats, ViewerStatistics

__all__ = ["VIEWER_CANNOT_CONTROL", "EmbeddedViewers", "EmbeddedViewersStatistics"]

logger = logging.getLogger(__name__)

VIEWER_CANNOT_CONTROL = "viewer_cannot_control"
"""The `error` status code a viewer gets for the first message it sends on a data channel."""

Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None]"]


@dataclass(slots=True)
class _ViewerPeer:
    viewer_id: str
    pc: RTCPeerConnection
    track: PacedVideoTrack
    channel: RTCDataChannel | None = None
    hears: bool = False  # its channel opened and was told the current state: it gets every status from here on


@dataclass(frozen=True, slots=True)
class EmbeddedViewersStatistics:
    """`frames_offered`: frames handed to viewers' tracks (one per viewer per frame); `frames_dropped`: frames a
    viewer's track dropped because its sender was behind; `status_sent`/`status_dropped`: status messages sent to
    viewers or dropped for a congested data channel; `controls_refused`: messages viewers sent (never applied)."""

    seats: ViewerStatistics
    offers: int
    offers_rejected: int
    frames_offered: int
    frames_dropped: int
    status_sent: int
    status_dropped: int
    controls_refused: int


class EmbeddedViewers:
    """The viewer peer connections of one session (see the module docstring)."""

    def __init__(
        self,
        port: SessionPort,
        *,
        config: EmbeddedConfig,
        rtc_config: RTCConfiguration,
        spawn: Spawn,
        current_state: Callable[[], StateStatus | None],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._port = port
        self._current_state = current_state
        self._config = config
        self._rtc_config = rtc_config
        self._spawn = spawn
        self._wall = wall
        self.seats = ViewerSeats(port.session_id, config.max_viewers)
        self._peers: dict[str, _ViewerPeer] = {}
        self._lock = asyncio.Lock()
        self._closed = False
        self._offers = 0
        self._offers_rejected = 0
        self._frames_offered = 0
        self._frames_dropped = 0
        self._status_sent = 0
        self._status_dropped = 0
        self._controls_refused = 0

    @property
    def session_id(self) -> str:
        return self._port.session_id

    def peer_connection(self, viewer_id: str) -> RTCPeerConnection | None:
        peer = self._peers.get(viewer_id)
        return peer.pc if peer is not None else None

    async def answer(self, viewer_id: str, offer_sdp: str) -> tuple[str, str]:
        """Answer a viewer's offer (its credential already verified). Raises `TooManyViewersError` when the viewer
        holds no place and none is free, `SignalingError` for an offer that cannot be answered."""
        async with self._lock:
            if self._closed:
                raise SessionNotAttachedError(self.session_id)
            joined = self.seats.join(viewer_id, self._wall())
            peer = _ViewerPeer(viewer_id, RTCPeerConnection(self._rtc_config), PacedVideoTrack(self._port.fps))
            self._register(peer)
            try:
                async with asyncio.timeout(self._config.answer_timeout):
                    with ice_host_addresses(self._config.ice_host_addresses):
                        local = await negotiate(peer.pc, peer.track, offer_sdp)
            except BaseException as exc:
                self._offers_rejected += 1
                await self._close_peer(peer)
                if joined:
                    self.seats.leave(viewer_id)
                if isinstance(exc, SignalingError | asyncio.CancelledError):
                    raise
                if isinstance(exc, TimeoutError):
                    raise SignalingError(f"answering the offer took over {self._config.answer_timeout} s") from exc
                if isinstance(exc, Exception):  # aiortc raises assorted errors for a malformed SDP
                    raise SignalingError(f"the offer could not be answered: {type(exc).__name__}: {exc}") from exc
                raise
            if self._is_closed():  # read again after the awaits: closed while negotiating
                await self._close_peer(peer)
                raise SessionNotAttachedError(self.session_id)
            previous = self._peers.get(viewer_id)
            self._peers[viewer_id] = peer
            self._offers += 1
            if previous is not None:
                logger.info("session %s: viewer %s rebinds to a new peer connection", self.session_id, viewer_id)
                await self._close_peer(previous)
            else:
                logger.info("session %s: viewer %s joined", self.session_id, viewer_id)
            return local.sdp, local.type

    def _is_closed(self) -> bool:
        return self._closed

    def _register(self, peer: _ViewerPeer) -> None:
        def current() -> bool:
            return self._peers.get(peer.viewer_id) is peer and not self._closed

        def on_datachannel(channel: RTCDataChannel) -> None:
            replied = False

            def on_message(_message: bytes | str) -> None:
                nonlocal replied
                self._controls_refused += 1
                if not replied and current() and channel.readyState == "open":
                    replied = True
                    self._send(channel, ErrorStatus(VIEWER_CANNOT_CONTROL, "a viewer cannot control the session"))

            def on_open() -> None:
                if current() and peer.channel is channel and not peer.hears:
                    peer.hears = True
                    state = self._current_state()
                    if state is not None:
                        self._send(channel, state)

            if peer.channel is not None:
                self._controls_refused += 1  # one status channel per viewer; another is ignored
                return
            peer.channel = channel
            channel.on("message", on_message)
            channel.on("open", on_open)
            if channel.readyState == "open":
                on_open()

        def on_connection_state() -> None:
            if peer.pc.connectionState in ("failed", "closed") and current():
                self._peers.pop(peer.viewer_id, None)
                self.seats.leave(peer.viewer_id)
                logger.info("session %s: viewer %s left (%s)", self.session_id, peer.viewer_id, peer.pc.connectionState)
                self._try_spawn(self._close_peer(peer), f"viewer-close-{peer.viewer_id}")

        peer.pc.on("datachannel", on_datachannel)
        peer.pc.on("connectionstatechange", on_connection_state)

    def _try_spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None] | None:
        # From an aiortc callback: the binding may be closing (its core spawns nothing then; close() cleans up).
        try:
            return self._spawn(coro, name)
        except RuntimeError:
            return None

    def relay(self, message: StatusMessage) -> None:
        """A status the binding relays to its controller (held and stamped as for it): to every viewer that hears."""
        for peer in self._peers.values():
            channel = peer.channel
            if not peer.hears or channel is None or channel.readyState != "open":
                continue
            base = peer.track.first_pts
            if isinstance(message, ChunkStatus) and base is not None:
                self._send(channel, replace(message, stream_base_pts=base))
            else:
                self._send(channel, message)

    def _send(self, channel: RTCDataChannel, message: StatusMessage) -> None:
        payload = encode_outbound(message, max_bytes=self._config.status_max_bytes).payload
        if channel.bufferedAmount + len(payload) > self._config.status_buffer_bytes:
            self._status_dropped += 1
            return
        channel.send(payload.decode("ascii"))
        self._status_sent += 1

    def deliver(self, frame: PacedFrame) -> None:
        """Offer a due frame to every connected viewer (never waits; a viewer behind drops its oldest frame)."""
        for peer in self._peers.values():
            if peer.pc.connectionState == "connected":
                peer.track.offer(frame)
                self._frames_offered += 1

    async def _close_peer(self, peer: _ViewerPeer) -> None:
        peer.track.stop()
        self._frames_dropped += peer.track.dropped
        peer.track.dropped = 0
        try:
            # Shielded: aiortc's close ends by resolving a future its other closers wait on; cancelling a waiter
            # (the binding closing meanwhile) would cancel that future under aiortc.
            await asyncio.shield(peer.pc.close())
        except Exception:
            logger.warning("session %s: closing a viewer's peer connection failed", self.session_id, exc_info=True)

    async def aclose(self) -> None:
        """Close every viewer's peer connection (the session is detached). Idempotent."""
        async with self._lock:
            self._closed = True
            peers, self._peers = list(self._peers.values()), {}
        for peer in peers:
            self.seats.leave(peer.viewer_id)
            await self._close_peer(peer)

    def statistics(self) -> EmbeddedViewersStatistics:
        return EmbeddedViewersStatistics(
            seats=self.seats.statistics(self._wall()),
            offers=self._offers,
            offers_rejected=self._offers_rejected,
            frames_offered=self._frames_offered,
            frames_dropped=self._frames_dropped + sum(peer.track.dropped for peer in self._peers.values()),
            status_sent=self._status_sent,
            status_dropped=self._status_dropped,
            controls_refused=self._controls_refused,
        )
