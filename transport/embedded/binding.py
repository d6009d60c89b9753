"""One session's embedded binding: the peer connections of its controller that come and go, its status stream, its
viewers (`EmbeddedTransport`, `transport.embedded.transport`, makes one per session and answers the offers).

Every offer for the same session *rebinds*: a new peer connection takes over the same pacer, control intake and
status stream, and the previous one is closed; the session (pose, chunk index, sequence numbers) never notices. A
peer connection that fails or closes starts the `reconnect_grace` timer; a new offer that connects within it
resumes, expiry ends the session.

Lifecycle (`BindingState`, shared with the LiveKit binding), with this binding's transitions in `_TRANSITIONS`:

    NEW → LIVE                (start(): served from then on; peer connections come and go through `answer`)
    LIVE → OVER               (client_gone was called; waiting for the service to detach)
    any → CLOSED              (detached; terminal)

The tasks, the grace timer, the status outbox and the steps of closing live in the composed `BindingCore`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from aiortc import RTCConfiguration, RTCDataChannel, RTCIceServer, RTCPeerConnection

from pipeline.clock import Clock
from transport.base import (
    ChunkStatus,
    SessionPort,
    StateStatus,
    StatusMessage,
)
from transport.embedded.config import EmbeddedConfig
from transport.embedded.rtc import PacedVideoTrack, ice_host_addresses, negotiate
from transport.embedded.viewers import EmbeddedViewers, EmbeddedViewersStatistics
from transport.errors import (
    SessionNotAttachedError,
    SignalingError,
)
from transport.session.binding import TERMINAL_BINDING_STATES, BindingCore, BindingState, TransitionTable
from transport.session.control import ControlStatistics
from transport.session.outbox import Outbound, OutboxStatistics, encode_outbound
from transport.session.pacing import PacedFrame, PacerStatistics
from transport.session.timers import Timers

__all__ = ["EmbeddedBindingStatistics", "EmbeddedSessionBinding", "PeerPresence"]

logger = logging.getLogger(__name__)

# The embedded binding never joins anything: it serves from start() on, and its peer connections come and go
# through `answer` without changing the binding's state (they are `PeerPresence`).
_TRANSITIONS: TransitionTable = {
    BindingState.NEW: frozenset({BindingState.LIVE, BindingState.CLOSED}),
    BindingState.LIVE: frozenset({BindingState.OVER, BindingState.CLOSED}),
    BindingState.OVER: frozenset({BindingState.CLOSED}),
    BindingState.CLOSED: frozenset(),
}


class PeerPresence(enum.Enum):
    EXPECTED = "expected"  # no peer connection has connected yet; the initial join timer runs
    CONNECTED = "connected"  # the current peer connection is connected
    AWAY = "away"  # the current peer connection failed or closed; the reconnect grace timer runs
    GONE = "gone"  # nobody came back in time (client_gone was called)


@dataclass(slots=True)
class _Peer:
    pc: RTCPeerConnection
    track: PacedVideoTrack
    generation: int
    channel: RTCDataChannel | None = None


@dataclass(frozen=True, slots=True)
class EmbeddedBindingStatistics:
    """`offers`: answered offers (each one a bind or rebind). `frames_offered`: frames handed to a track;
    `frames_unsent`: frames the pacer released with no peer to take them; `track_dropped`: frames a track's
    queue dropped because its sender was behind. `status_dropped_congested`: status messages dropped because the
    client left over `status_buffer_bytes` unconsumed in the data channel. `tasks`: the binding's background tasks
    running now (none once closed)."""

    state: BindingState
    presence: PeerPresence
    offers: int
    offers_rejected: int
    peers_failed: int
    peer_returns: int
    frames_offered: int
    frames_unsent: int
    track_dropped: int
    status_dropped_congested: int
    tasks: int
    control: ControlStatistics
    pacer: PacerStatistics
    outbox: OutboxStatistics
    viewers: EmbeddedViewersStatistics


class EmbeddedSessionBinding:
    """One session served over direct WebRTC; successive peer connections rebind to it.

    Cancellation contract: `aclose()` first lets the last status messages out (the session's final `done`, bounded
    by `status_flush_timeout`), then cancels and awaits the binding's tasks (feeding the pacer, pacing, relaying
    and sending status) and closes the current peer connection. An `answer` in flight when `aclose` runs fails
    with `SessionNotAttachedError` and its peer connection is closed.
    """

    def __init__(
        self,
        port: SessionPort,
        *,
        config: EmbeddedConfig,
        timers: Timers,
        clock: Clock | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._port = port
        self._config = config
        self._core = BindingCore(
            port,
            kind="embedded",
            task_prefix="rtc",
            settings=config,
            transitions=_TRANSITIONS,
            timers=timers,
            clock=clock,
            link=self,
            deliver=self._deliver,
            encode=self._encode_status,
            on_grace_expired=self._grace_expired,
        )
        self._rtc_config = RTCConfiguration(iceServers=[RTCIceServer(urls=url) for url in config.ice_servers])
        self.viewers = EmbeddedViewers(
            port,
            config=config,
            rtc_config=self._rtc_config,
            spawn=self._core.spawn,
            current_state=lambda: self._core.last_state,
            wall=wall,
        )
        self._peer: _Peer | None = None
        self._generation = 0
        self._answer_lock = asyncio.Lock()
        self._channel_open = asyncio.Event()
        self._ever_connected = asyncio.Event()  # a peer connection of this binding connected once: `wait_connected`
        self._presence = PeerPresence.EXPECTED
        self._greeted: object | None = None  # the data channel that was sent the current state first
        self._offers = 0
        self._offers_rejected = 0
        self._peers_failed = 0
        self._peer_returns = 0
        self._track_dropped = 0
        self._status_dropped_congested = 0

    @property
    def session_id(self) -> str:
        return self._port.session_id

    @property
    def presence(self) -> PeerPresence:
        return self._presence

    @property
    def state(self) -> BindingState:
        return self._core.state

    @property
    def closed(self) -> bool:
        return self._core.closed

    @property
    def peer_connection(self) -> RTCPeerConnection | None:
        return self._peer.pc if self._peer is not None else None

    def start(self) -> None:
        self._core.move(BindingState.LIVE)
        self._core.start_timer(self._config.initial_join_timeout, "the client never connected")
        self._core.start_serving()

    # -- signalling -----------------------------------------------------------------------------------------------

    async def answer(self, offer_sdp: str) -> tuple[str, str]:
        """Answer an offer with a new peer connection that replaces the current one. Raises `SignalingError`."""
        async with self._answer_lock:
            if self.closed:
                raise SessionNotAttachedError(self.session_id)
            self._generation += 1
            peer = _Peer(
                pc=RTCPeerConnection(self._rtc_config),
                track=PacedVideoTrack(self._port.fps),
                generation=self._generation,
            )
            self._register(peer)
            try:
                async with asyncio.timeout(self._config.answer_timeout):
                    with ice_host_addresses(self._config.ice_host_addresses):
                        local = await negotiate(peer.pc, peer.track, offer_sdp)
            except (SignalingError, asyncio.CancelledError):
                await self._reject(peer)
                raise
            except TimeoutError as exc:
                await self._reject(peer)
                raise SignalingError(f"answering the offer took over {self._config.answer_timeout} s") from exc
            except Exception as exc:  # aiortc raises assorted errors for a malformed SDP
                await self._reject(peer)
                raise SignalingError(f"the offer could not be answered: {type(exc).__name__}: {exc}") from exc
            if self.state in TERMINAL_BINDING_STATES:  # read again after the awaits: closed while negotiating
                await self._close_peer(peer)
                raise SessionNotAttachedError(self.session_id)
            previous, self._peer = self._peer, peer
            self._channel_open.clear()
            self._offers += 1
            # Until the new peer connection connects, the client is between connections: it has a whole grace
            # period to finish connecting (a rebind that never connects must not keep the session forever).
            if self._presence is PeerPresence.CONNECTED:
                self._presence = PeerPresence.AWAY
            if self._presence is not PeerPresence.GONE:
                first = self._presence is PeerPresence.EXPECTED
                reason = "the client never connected" if first else "the client did not reconnect"
                self._core.start_timer(self._config.reconnect_grace, reason)
            if previous is not None:
                logger.info("session %s: rebinding to a new peer connection", self.session_id)
                await self._close_peer(previous)
            return local.sdp, local.type

    async def _reject(self, peer: _Peer) -> None:
        self._offers_rejected += 1
        await self._close_peer(peer)

    def _register(self, peer: _Peer) -> None:
        pc = peer.pc

        def current() -> bool:
            return self._peer is peer and not self.closed

        def on_datachannel(channel: RTCDataChannel) -> None:
            if channel.label != self._config.control_label:
                self._core.intake.ignore()
                return

            def on_message(message: bytes | str) -> None:
                if current() and peer.channel is channel:
                    self._core.intake.receive(message)

            def on_open() -> None:
                if current() and peer.channel is channel:
                    self._channel_opened()

            def on_close() -> None:
                if peer.channel is channel:
                    peer.channel = None
                    if current():
                        self._channel_open.clear()

            peer.channel = channel
            channel.on("message", on_message)
            channel.on("open", on_open)
            channel.on("close", on_close)
            if channel.readyState == "open" and current():
                self._channel_opened()

        def on_connection_state() -> None:
            if not current():
                return
            state = pc.connectionState
            if state == "connected":
                self._connected()
                if peer.channel is not None and peer.channel.readyState == "open":
                    self._channel_open.set()
            elif state in ("failed", "closed"):
                self._lost(peer, state)

        pc.on("datachannel", on_datachannel)
        pc.on("connectionstatechange", on_connection_state)

    def _connected(self) -> None:
        if self._presence is PeerPresence.GONE:
            return
        self._core.cancel_timer()
        if self._presence is PeerPresence.AWAY:
            self._peer_returns += 1
            logger.info("session %s: the client is back within the grace", self.session_id)
        self._presence = PeerPresence.CONNECTED
        self._ever_connected.set()

    async def wait_connected(self) -> None:
        """Return once a peer connection of this binding has connected (at once if one has)."""
        await self._ever_connected.wait()

    def _lost(self, peer: _Peer, state: str) -> None:
        self._channel_open.clear()
        if state == "failed":
            self._peers_failed += 1
            self._core.spawn(self._close_peer(peer), "close-failed")
        if self._presence is PeerPresence.CONNECTED:
            self._presence = PeerPresence.AWAY
            logger.info(
                "session %s: peer connection %s; %.1f s to reconnect",
                self.session_id,
                state,
                self._config.reconnect_grace,
            )
            self._core.start_timer(self._config.reconnect_grace, "the client left")

    def _grace_expired(self, reason: str) -> None:
        # Called by the core only while the binding has not ended.
        if self._presence not in (PeerPresence.EXPECTED, PeerPresence.AWAY):
            return
        self._presence = PeerPresence.GONE
        self._core.over(reason)

    async def _close_peer(self, peer: _Peer) -> None:
        peer.track.stop()
        self._track_dropped += peer.track.dropped
        peer.track.dropped = 0
        try:
            # Shielded, as a viewer's: a close cancelled part-way (the binding's caller cancelled) would stop aiortc
            # before its ICE transports and leave their UDP sockets to the garbage collector.
            await asyncio.shield(peer.pc.close())
        except Exception:
            logger.warning("session %s: closing a peer connection failed", self.session_id, exc_info=True)

    # -- frames and status ----------------------------------------------------------------------------------------

    def _deliver(self, frame: PacedFrame) -> bool:
        self.viewers.deliver(frame)
        peer = self._peer
        if peer is None or peer.pc.connectionState != "connected":
            return False
        peer.track.offer(frame)
        return True

    def _encode_status(self, message: StatusMessage) -> Outbound:
        self.viewers.relay(message)  # every status the core relays passes here, held and stamped as it goes out
        # "Lossy" in the outbox's sense: dropped while no channel is open (they would be stale by then), sent on the
        # ordered, reliable data channel otherwise. That covers chunk statuses and states (the current state is
        # sent again on every channel that opens); errors and `done` wait for a channel.
        peer = self._peer
        if isinstance(message, ChunkStatus) and peer is not None and peer.track.first_pts is not None:
            # An aiortc receiver counts frame timestamps from the first frame its connection received: with the
            # pts of that frame a Python client maps its frames onto `first_frame_pts` exactly.
            message = replace(message, stream_base_pts=peer.track.first_pts)
        encoded = encode_outbound(message, max_bytes=self._config.status_max_bytes)
        if isinstance(message, StateStatus | ChunkStatus):
            return Outbound(encoded.payload, reliable=False)
        return encoded

    def _channel_opened(self) -> None:
        # A new channel hears the current state before any chunk status: the state goes to the head of the outbox,
        # and the link counts as ready only from here on (a chunk queued earlier is dropped as offline, not sent
        # ahead of the state).
        self._greeted = self._peer.channel if self._peer is not None else None
        last_state = self._core.last_state
        if last_state is not None:
            self._core.outbox.put_first(self._core.encode_reply(last_state))
        self._channel_open.set()

    @property
    def link_ready(self) -> bool:
        peer = self._peer
        channel = peer.channel if peer is not None else None
        return channel is not None and channel is self._greeted and channel.readyState == "open"

    async def wait_link_ready(self) -> None:
        while not self.link_ready:
            self._channel_open.clear()
            await self._channel_open.wait()

    async def send_status(self, message: Outbound) -> None:
        peer = self._peer
        channel = peer.channel if peer is not None else None
        if channel is None or channel.readyState != "open":
            raise RuntimeError("the control data channel is not open")
        # aiortc buffers whatever the peer has not acknowledged without a bound: a client that stops consuming
        # (frozen, or withholding SCTP acknowledgements) must not make the service hold its status stream forever.
        if channel.bufferedAmount + len(message.payload) > self._config.status_buffer_bytes:
            self._status_dropped_congested += 1
            return
        channel.send(message.payload.decode("ascii"))

    # -- closing --------------------------------------------------------------------------------------------------

    async def aclose(self, reason: str = "detached") -> None:
        """Stop serving the session and close its peer connection. Idempotent."""
        if not await self._core.aclose(reason):
            return
        async with self._answer_lock:
            peer, self._peer = self._peer, None
        if peer is not None:
            await self._close_peer(peer)
        await self.viewers.aclose()

    def statistics(self) -> EmbeddedBindingStatistics:
        peer = self._peer
        core = self._core.statistics()
        return EmbeddedBindingStatistics(
            state=core.state,
            presence=self._presence,
            offers=self._offers,
            offers_rejected=self._offers_rejected,
            peers_failed=self._peers_failed,
            peer_returns=self._peer_returns,
            frames_offered=core.frames_delivered,
            frames_unsent=core.frames_unsent,
            track_dropped=self._track_dropped + (peer.track.dropped if peer is not None else 0),
            status_dropped_congested=self._status_dropped_congested,
            tasks=core.tasks,
            control=core.control,
            pacer=core.pacer,
            outbox=core.outbox,
            viewers=self.viewers.statistics(),
        )
