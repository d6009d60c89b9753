"""One session bound to its LiveKit room: the service participant that publishes the video and talks control.

`LiveKitSessionBinding` joins the session's room as the service participant (auto-subscribe off), publishes one
camera video track fed from the session's chunks through the frame pacer, takes control messages as data from the
controller identity only (and the discrete commands as RPC methods too: `transport.livekit.rpc`), and publishes
status messages on its own topic. It owns the reconnect rules:

- the SDK resuming by itself (`reconnecting` → `reconnected`): generation goes on, nothing is republished; the
  participants the SDK drops and re-adds while it reconnects (a full reconnect re-joins the room) are not the
  controller leaving: presence is read from the room once the SDK has reconnected;
- the room connection lost for a reason that is not final (`disconnected` with e.g. SIGNAL_CLOSE): rejoin with a
  fresh token as the same identity (a rebind; the session, its pacer and sequence state are untouched);
- a final reason (room deleted or closed, participant removed, duplicate identity) or the room finishing: the
  client is gone for good (`SessionPort.client_gone`); a duplicate identity is the session's adopter joining as
  this participant (`replaced`: the room is the adopter's now, the transport does not delete it);
- the controller leaving: a `reconnect_grace` timer; its return within the grace resumes, expiry ends the session.
  The same applies, with `initial_join_timeout`, to a controller that never joins.

It joins with a token it mints (the service's own project) or with the one a caller minted for it (`caller_token`,
the avatar-provider pattern; a rejoin reuses it, so it must stay valid for as long as the session may need to
rejoin). Its participant attributes carry the session (`transport.livekit.attributes`): set in full on every
(re)join, then changed with the session's state, rate-bounded by an `AttributeCoalescer`.

Lifecycle (`BindingState`, shared with the embedded binding), with this binding's transitions in `_TRANSITIONS`;
the tasks, the grace timer, the status outbox and the steps of closing live in the composed `BindingCore`:

    NEW → JOINING → LIVE ⇄ REJOINING
    LIVE | REJOINING → OVER   (client_gone was called; waiting for the service to detach)
    any → CLOSED              (detached; terminal)
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from dataclasses import dataclass

from pipeline.clock import Clock
from transport.base import SessionPort, StateStatus, StatusMessage
from transport.errors import CallerTokenRefusedError, LinkLostError, RoomJoinError
from transport.livekit.attributes import (
    CONTROLLER_ATTRIBUTE,
    ENDS_AT_ATTRIBUTE,
    PUBLISH_ON_BEHALF_ATTRIBUTE,
    SESSION_ID_ATTRIBUTE,
    STATE_ATTRIBUTE,
    AttributeCoalescer,
    AttributeStatistics,
)
from transport.livekit.caller_tokens import CallerToken
from transport.livekit.config import LiveKitConfig
from transport.livekit.events import ParticipantJoined, ParticipantLeft, RoomEvent, RoomFinished
from transport.livekit.room import (
    OVER_DISCONNECT_REASONS,
    LocalVideo,
    Room,
    RoomConnectionState,
    RoomFactory,
    RoomJoinOptions,
    RpcFailure,
    VideoPublishOptions,
)
from transport.livekit.rpc import RPC_METHODS, ControlRpc
from transport.livekit.tokens import ParticipantRole, TokenIssuer
from transport.redaction import redact_tokens
from transport.session.binding import BindingCore, BindingState, TransitionTable
from transport.session.control import ControlStatistics
from transport.session.outbox import Outbound, OutboxStatistics, encode_outbound
from transport.session.pacing import PacedFrame, PacerStatistics
from transport.session.timers import TimerHandle, Timers
from transport.session.viewers import ViewerSeats, ViewerStatistics

__all__ = [
    "LAST_FRAME_LINGER_S",
    "SUBSCRIBED_SETTLE_S",
    "BindingState",
    "ControllerPresence",
    "LiveKitBindingStatistics",
    "LiveKitSessionBinding",
]

logger = logging.getLogger(__name__)

_VIEWER_PREFIX = f"{ParticipantRole.VIEWER.value}-"

_MAX_REJOIN_BACKOFF = 5.0

SUBSCRIBED_SETTLE_S = 0.2
"""After the server said someone subscribed to the track (`wait_subscribed`), how long the subscriber takes to be
ready for its media. Measured (docs/continuity.md, the drain hand-off over the real server): the client's own
`track_subscribed` came 6-36 ms after the server's word; with no wait the adopter's first frame was lost 1 run in
7, with 0.1 s none in 4, with 0.2 s none in 6 (and later 4 in 24, each time an SDK placeholder frame sent within
12 ms of it: a race in the SDK's source this wait cannot help)."""

LAST_FRAME_LINGER_S = 0.15
"""How long the room is kept after the last frame was captured before it is left (`aclose`). Left at once, the
frame in the source's encoder came to the client black and without its frame id (the last frame of a hand-off, 13
runs of 14); kept 0.15 s, it came whole (3 of 3)."""


# LIVE: in the room and publishing (the SDK may be resuming underneath: still live). CLOSED: tasks stopped, room
# left, video source closed.
_TRANSITIONS: TransitionTable = {
    BindingState.NEW: frozenset({BindingState.JOINING, BindingState.CLOSED}),
    BindingState.JOINING: frozenset({BindingState.LIVE, BindingState.CLOSED}),
    BindingState.LIVE: frozenset({BindingState.REJOINING, BindingState.OVER, BindingState.CLOSED}),
    BindingState.REJOINING: frozenset({BindingState.LIVE, BindingState.OVER, BindingState.CLOSED}),
    BindingState.OVER: frozenset({BindingState.CLOSED}),
    BindingState.CLOSED: frozenset(),
}


class ControllerPresence(enum.Enum):
    EXPECTED = "expected"  # not joined yet; the initial join timer runs
    PRESENT = "present"  # in the room
    AWAY = "away"  # left; the reconnect grace timer runs
    GONE = "gone"  # did not come, or did not come back in time


@dataclass(frozen=True, slots=True)
class LiveKitBindingStatistics:
    """`rejoins`: successful rejoins after a lost connection. `sdk_reconnects`: resumes the SDK did by itself.
    `data_foreign`: data packets on the control topic from someone other than the controller (ignored).
    `data_other_topic`: data on other topics (ignored). `rpc_foreign`: RPC calls from someone other than the
    controller (refused `not_controller`; the calls themselves are in `control.calls`). `frames_captured`: frames
    handed to the video source; `frames_unsent`: frames the pacer released while no room was connected. `tasks`:
    the binding's background tasks running now (none once closed)."""

    state: BindingState
    controller: ControllerPresence
    rejoins: int
    rejoin_failures: int
    sdk_reconnects: int
    controller_departures: int
    controller_returns: int
    data_foreign: int
    data_other_topic: int
    rpc_foreign: int
    frames_captured: int
    frames_unsent: int
    tasks: int
    control: ControlStatistics
    pacer: PacerStatistics
    outbox: OutboxStatistics
    viewers: ViewerStatistics
    attributes: AttributeStatistics
    attribute_failures: int


class LiveKitSessionBinding:
    """The service participant of one session. `start()` joins and publishes (raises `RoomJoinError`), then
    serves until `aclose()`; `handle_room_event` takes the same events from webhooks.

    Cancellation contract: `aclose()` first lets the last status messages out (the session's final `done`, bounded
    by `status_flush_timeout`), then cancels and awaits every task the binding started (feeding the pacer,
    pacing, relaying status, sending, rejoining), leaves the room and closes the video source. Frames pending in
    the pacer are dropped.
    """

    def __init__(
        self,
        port: SessionPort,
        *,
        config: LiveKitConfig,
        room_name: str,
        controller_identity: str,
        service_identity: str,
        tokens: TokenIssuer | None,
        room_factory: RoomFactory,
        timers: Timers,
        clock: Clock | None = None,
        caller_token: CallerToken | None = None,
        agent_identity: str | None = None,
    ) -> None:
        if (tokens is None) == (caller_token is None):
            raise ValueError("a LiveKit binding joins with minted tokens or with a caller's token: give one")
        self._port = port
        self._config = config
        self._room_name = room_name
        self._controller = controller_identity
        self._service_identity = service_identity
        self._tokens = tokens
        self._caller_token = caller_token
        self._agent_identity = agent_identity
        self._room_factory = room_factory
        self._timers = timers
        self._clock = clock
        self._attributes = AttributeCoalescer(burst=config.attribute_burst, interval=config.attribute_interval)
        self._attribute_lock = asyncio.Lock()  # FIFO: updates reach the server in the order they were taken
        self._attribute_timer: TimerHandle | None = None
        self._attribute_failures = 0
        self._core = BindingCore(
            port,
            kind="LiveKit",
            task_prefix="lk",
            settings=config,
            transitions=_TRANSITIONS,
            timers=timers,
            clock=clock,
            link=self,
            deliver=self._deliver,
            encode=self._encode_status,
            on_grace_expired=self._grace_expired,
            reply_to=controller_identity,
        )
        self._rpc = ControlRpc(self._core.intake, controller_identity)
        self._video_options = VideoPublishOptions(
            codec=config.codec, max_bitrate=config.max_bitrate, max_framerate=port.fps
        )
        self._join_options = RoomJoinOptions(auto_subscribe=False, connect_timeout=config.connect_timeout)
        self._presence = ControllerPresence.EXPECTED
        self._welcome_due = False  # the controller (re)joined and has not been told the state yet (`_welcome`)
        self._room: Room | None = None
        self._video: LocalVideo | None = None
        self._subscribed = asyncio.Event()  # someone subscribed to the track the current room connection published
        self._last_capture: float | None = None  # time.monotonic() of the last frame given to the source
        self._generation = 0
        self._sdk_reconnecting = False  # between the SDK's `reconnecting` and `reconnected`
        self._rejoins = 0
        self._replaced = False
        self._rejoin_failures = 0
        self._sdk_reconnects = 0
        self._departures = 0
        self._returns = 0
        self._data_foreign = 0
        self._data_other_topic = 0
        self.viewer_seats = ViewerSeats(port.session_id, config.max_viewers)
        """The session's viewer places: taken when a viewer token is minted, kept while the viewer is in the room."""

    @property
    def session_id(self) -> str:
        return self._port.session_id

    @property
    def port(self) -> SessionPort:
        """The session this binding serves."""
        return self._port

    @property
    def replaced(self) -> bool:
        """The server dropped this participant for another that joined with its identity (`DUPLICATE_IDENTITY`):
        the session's adopter (identities are the session's own), which holds the room now."""
        return self._replaced

    @property
    def room_name(self) -> str:
        return self._room_name

    @property
    def controller_identity(self) -> str:
        return self._controller

    @property
    def service_identity(self) -> str:
        return self._service_identity

    @property
    def state(self) -> BindingState:
        return self._core.state

    @property
    def presence(self) -> ControllerPresence:
        return self._presence

    # -- joining --------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Join the room and publish the video track, then start serving. Raises `RoomJoinError`."""
        self._core.move(BindingState.JOINING)
        try:
            await self._join()
        except BaseException:
            await self._leave_room()
            self._core.move(BindingState.CLOSED)
            raise
        self._core.move(BindingState.LIVE)
        self._core.start_timer(self._config.initial_join_timeout, "the controller never joined")
        self._reconcile_presence()
        self._core.start_serving()

    async def _join(self) -> None:
        """One join: a new room object, a fresh token for our identity, connect, publish the track."""
        room = self._room_factory()
        self._generation += 1
        self._sdk_reconnecting = False
        self._subscribed.clear()  # this join publishes a new track
        self._register(room, self._generation)
        self._room = room
        url, token = self._credentials()
        try:
            await room.connect(url, token, self._join_options)
        except RoomJoinError as exc:
            raise self._join_error(exc.detail) from exc
        except Exception as exc:  # anything else the SDK raises is a failed join too (and worth a retry)
            raise self._join_error(f"{type(exc).__name__}: {exc}") from exc
        self._register_rpc(room)
        await self._set_attributes(room, {**self._attributes.published, **self._joined_attributes()})
        video = room.create_video(self._config.track_name, self._port.width, self._port.height)
        self._video = video
        try:
            await room.local_participant.publish_track(video, self._video_options)
        except Exception as exc:
            raise RoomJoinError(f"publishing the video track failed: {exc}", self._room_name) from exc
        if room.connection_state is RoomConnectionState.DISCONNECTED:
            # Its `disconnected` event came while we were still joining, when it is not acted on.
            raise RoomJoinError("the connection dropped while joining", self._room_name)

    def _credentials(self) -> tuple[str, str]:
        if self._caller_token is not None:
            return self._caller_token.url, self._caller_token.token
        assert self._tokens is not None  # one of the two, checked on construction
        token = self._tokens.service(self.session_id, self._room_name, identity=self._service_identity)
        return self._config.url, token.token

    def _join_error(self, detail: str) -> RoomJoinError:
        """The error of a failed join; with a caller's token, a refusal of that token is told apart (the caller's
        doing: `CallerTokenRefusedError`). The SDK's message never holds the token."""
        detail = redact_tokens(detail)
        if self._caller_token is not None and _refuses_token(detail):
            return CallerTokenRefusedError(detail, self._room_name)
        return RoomJoinError(detail, self._room_name)

    def remote_attributes(self) -> dict[str, dict[str, str]]:
        """The attributes of everyone else in the room now, by identity (empty while not in the room)."""
        room = self._room
        if room is None:
            return {}
        return {identity: dict(attributes) for identity, attributes in room.remote_attributes().items()}

    # -- attributes -----------------------------------------------------------------------------------------------

    def _joined_attributes(self) -> dict[str, str]:
        """What the participant carries from its (re)join on, whatever the rate bound."""
        attributes = {
            SESSION_ID_ATTRIBUTE: self.session_id,
            CONTROLLER_ATTRIBUTE: self._controller,
            ENDS_AT_ATTRIBUTE: _ends_at_text(self._port.ends_at),
        }
        if self._agent_identity is not None:
            attributes[PUBLISH_ON_BEHALF_ATTRIBUTE] = self._agent_identity
        self._attributes.joined(attributes)
        return attributes

    async def _set_attributes(self, room: Room, attributes: dict[str, str]) -> None:
        async with self._attribute_lock:
            try:
                await room.local_participant.set_attributes(attributes)
            except LinkLostError as exc:
                # Not fatal: the video and the data path work without them; late joiners learn less.
                self._attribute_failures += 1
                logger.warning("session %s: participant attributes not set: %s", self.session_id, exc)

    def _offer_attributes(self, state: str) -> None:
        if state in _TRANSIENT_STATES:
            return  # the binding is attached while the session is admitted; running follows at once
        changes = {STATE_ATTRIBUTE: state, ENDS_AT_ATTRIBUTE: _ends_at_text(self._port.ends_at)}
        self._attributes.offer(changes, self._now())
        self._flush_attributes()

    def _now(self) -> float:
        return self._clock.now() if self._clock is not None else time.monotonic()

    def _flush_attributes(self) -> None:
        if self._core.closed:
            return
        now = self._now()
        update = self._attributes.take(now)
        room = self._room
        if update is not None and room is not None:
            self._core.spawn(self._set_attributes(room, update), "attributes")
            return
        next_at = self._attributes.next_at(now)
        if next_at is not None and self._attribute_timer is None:
            self._attribute_timer = self._timers.call_later(next_at - now, self._attribute_timer_fired)

    def _attribute_timer_fired(self) -> None:
        self._attribute_timer = None
        self._flush_attributes()

    async def _leave_room(self) -> None:
        room, video = self._room, self._video
        self._room = None
        self._video = None
        self._generation += 1  # events of the room being left are stale from now on
        if room is not None:
            try:
                await room.disconnect()
            except Exception:
                logger.warning("session %s: leaving room %s failed", self.session_id, self._room_name, exc_info=True)
        if video is not None:
            try:
                await video.aclose()
            except Exception:
                logger.warning("session %s: closing the video source failed", self.session_id, exc_info=True)

    def _rejoining(self) -> bool:
        # A method, not an inline test: the state changes across the awaits of the rejoin loop.
        return self._core.state is BindingState.REJOINING

    async def _rejoin(self) -> None:
        await self._leave_room()
        delay = self._config.rejoin_backoff
        for attempt in range(1, self._config.rejoin_attempts + 1):
            if not self._rejoining():
                return
            try:
                await self._join()
            except RoomJoinError as exc:
                self._rejoin_failures += 1
                logger.warning(
                    "session %s: rejoin %d/%d failed: %s", self.session_id, attempt, self._config.rejoin_attempts, exc
                )
                await self._leave_room()
                if attempt < self._config.rejoin_attempts:
                    await asyncio.sleep(delay)
                    delay = min(_MAX_REJOIN_BACKOFF, delay * 2)
                continue
            if not self._rejoining():
                return  # closed or over meanwhile: close() leaves the room
            self._rejoins += 1
            logger.info("session %s: rejoined room %s (attempt %d)", self.session_id, self._room_name, attempt)
            self._core.move(BindingState.LIVE)
            self._reconcile_presence()
            return
        self._core.over("the service participant could not rejoin its LiveKit room")

    # -- room events ----------------------------------------------------------------------------------------------

    def _register(self, room: Room, generation: int) -> None:
        def current() -> bool:
            return generation == self._generation

        def on_joined(identity: str) -> None:
            if current() and not self._sdk_reconnecting:
                self.handle_room_event(ParticipantJoined(self._room_name, identity))

        def on_left(identity: str) -> None:
            if current() and not self._sdk_reconnecting:
                self.handle_room_event(ParticipantLeft(self._room_name, identity))

        def on_data(payload: bytes, identity: str | None, topic: str) -> None:
            if current():
                self._on_data(payload, identity, topic)

        def on_reconnecting() -> None:
            if current():
                self._sdk_reconnects += 1
                self._sdk_reconnecting = True
                logger.info("session %s: the SDK is resuming the room connection", self.session_id)

        def on_reconnected() -> None:
            if current():
                self._sdk_reconnecting = False
                logger.info("session %s: the SDK resumed the room connection", self.session_id)
                self._reconcile_presence()

        def on_disconnected(reason: str) -> None:
            if current():
                self._sdk_reconnecting = False
                self._on_disconnected(reason)

        def on_track_subscribed(track_sid: str) -> None:
            if current():
                self._subscribed.set()

        room.on("participant_connected", on_joined)
        room.on("participant_disconnected", on_left)
        room.on("local_track_subscribed", on_track_subscribed)
        room.on("data_received", on_data)
        room.on("reconnecting", on_reconnecting)
        room.on("reconnected", on_reconnected)
        room.on("disconnected", on_disconnected)

    def _on_disconnected(self, reason: str) -> None:
        if reason == "DUPLICATE_IDENTITY":
            self._replaced = True
        if self._core.state is not BindingState.LIVE:
            return  # joining (connect() reports it), rejoining already, over or closed
        if reason == "CLIENT_INITIATED":
            return  # we left ourselves
        if reason in OVER_DISCONNECT_REASONS:
            self._core.over(f"the room connection ended: {reason}")
            return
        logger.warning("session %s: lost room %s (%s); rejoining", self.session_id, self._room_name, reason)
        self._core.move(BindingState.REJOINING)
        self._core.spawn(self._rejoin(), "rejoin")

    def handle_room_event(self, event: RoomEvent) -> None:
        """React to a room event, from the room itself or a webhook. Idempotent: duplicates change nothing."""
        match event:
            case ParticipantJoined(identity=identity) if identity.startswith(_VIEWER_PREFIX):
                self.viewer_seats.admit(identity)
                return
            case ParticipantLeft(identity=identity) if identity.startswith(_VIEWER_PREFIX):
                self.viewer_seats.leave(identity)
                return
        if self._core.ended or self._presence is ControllerPresence.GONE:
            return
        match event:
            case ParticipantJoined(identity=identity) if identity == self._controller:
                self._core.cancel_timer()
                if self._presence is ControllerPresence.AWAY:
                    self._returns += 1
                    logger.info("session %s: the controller is back within the grace", self.session_id)
                if self._presence is not ControllerPresence.PRESENT:
                    self._welcome_due = True  # a (re)joining client learns where the session is (`_welcome`)
                self._presence = ControllerPresence.PRESENT
                self._welcome()
            case ParticipantLeft(identity=identity) if identity == self._controller:
                if self._presence is not ControllerPresence.PRESENT:
                    return
                self._presence = ControllerPresence.AWAY
                self._departures += 1
                logger.info(
                    "session %s: the controller left; %.1f s to come back",
                    self.session_id,
                    self._config.reconnect_grace,
                )
                self._core.start_timer(self._config.reconnect_grace, "the controller left")
            case RoomFinished():
                self._core.over("the room finished")

    def _welcome(self) -> None:
        """Tell a (re)joined controller the session's state (earlier broadcasts did not reach it), once this room
        connection's SDK knows it. A webhook can report the join before the SDK does (measured: 0.74 s ahead on the
        real server), and a packet the controller sends before the SDK knows it arrives with no sender and is dropped
        as foreign; the Python client holds its first control packet until this status comes (docs/livekit.md), so
        it must not come early. Until then it stays due; the SDK's own join event (or a rejoin's reconciliation)
        sends it."""
        room = self._room
        last_state = self._core.last_state
        if not self._welcome_due or last_state is None or room is None:
            return
        if self._controller not in room.remote_identities:
            return
        self._welcome_due = False
        self._core.reply(last_state)

    def _reconcile_presence(self) -> None:
        """After a (re)join the SDK reports only later arrivals: read who is in the room now."""
        room = self._room
        if room is None:
            return
        if self._controller in room.remote_identities:
            self.handle_room_event(ParticipantJoined(self._room_name, self._controller))
        elif self._presence is ControllerPresence.PRESENT:
            self.handle_room_event(ParticipantLeft(self._room_name, self._controller))

    def _grace_expired(self, reason: str) -> None:
        # Called by the core only while the binding has not ended.
        if self._presence not in (ControllerPresence.EXPECTED, ControllerPresence.AWAY):
            return
        # Webhooks can arrive late or out of order: while we are in the room, the room has the last word.
        room = self._room
        if self._core.state is BindingState.LIVE and room is not None and self._controller in room.remote_identities:
            self._presence = ControllerPresence.PRESENT
            return
        self._presence = ControllerPresence.GONE
        self._core.over(reason)

    # -- data and frames --------------------------------------------------------------------------------------------

    def _on_data(self, payload: bytes, identity: str | None, topic: str) -> None:
        if topic != self._config.control_topic:
            self._data_other_topic += 1
            return
        if identity != self._controller:
            self._data_foreign += 1
            return
        self._core.intake.receive(payload)

    def _register_rpc(self, room: Room) -> None:
        """The control protocol's discrete commands as RPC methods of this connection (`transport.livekit.rpc`)."""
        participant = room.local_participant
        for method in RPC_METHODS:

            def handler(caller: str, payload: str, method: str = method) -> str | RpcFailure:
                return self._rpc.handle(method, caller, payload)

            participant.register_rpc_method(method, handler)

    def _encode_status(self, message: StatusMessage) -> Outbound:
        # Every status the session relays passes here once: its state changes are the attributes' too.
        if isinstance(message, StateStatus):
            self._offer_attributes(message.state)
        return encode_outbound(
            message, max_bytes=self._config.status_max_bytes, lossy_max_bytes=self._config.lossy_max_bytes
        )

    def _deliver(self, frame: PacedFrame) -> bool:
        video = self._video
        if video is None or self._core.state is not BindingState.LIVE:
            return False
        video.capture(frame)
        self._last_capture = time.monotonic()
        return True

    async def wait_subscribed(self) -> None:
        """Return once someone in the room subscribed to the video track this binding published last (the server's
        word: the first subscriber, not necessarily the controller; the SDK does not say who), and
        `SUBSCRIBED_SETTLE_S` after it, when the subscriber is ready for the media. A frame captured before that
        goes to nobody: an adopter's first frames were lost so (docs/continuity.md)."""
        await self._subscribed.wait()
        await asyncio.sleep(SUBSCRIBED_SETTLE_S)

    # StatusLink, for the outbox's sender loop.
    @property
    def link_ready(self) -> bool:
        return self._core.state is BindingState.LIVE and self._room is not None

    async def wait_link_ready(self) -> None:
        await self._core.wait_live()

    async def send_status(self, message: Outbound) -> None:
        room = self._room
        if room is None:
            raise RuntimeError("no room connection")
        destinations = (message.destination,) if message.destination is not None else ()
        await room.local_participant.publish_data(
            message.payload,
            reliable=message.reliable,
            topic=self._config.status_topic,
            destination_identities=destinations,
        )

    # -- closing --------------------------------------------------------------------------------------------------

    async def aclose(self, reason: str = "detached") -> None:
        """Stop serving the session and leave the room. Idempotent."""
        if self._attribute_timer is not None:
            self._attribute_timer.cancel()
            self._attribute_timer = None
        if await self._core.aclose(reason):
            # The pacer stopped: let the source's encoder send the last frame before the track goes.
            since = None if self._last_capture is None else time.monotonic() - self._last_capture
            if since is not None and since < LAST_FRAME_LINGER_S:
                await asyncio.sleep(LAST_FRAME_LINGER_S - since)
            await self._leave_room()

    def statistics(self) -> LiveKitBindingStatistics:
        core = self._core.statistics()
        return LiveKitBindingStatistics(
            state=core.state,
            controller=self._presence,
            rejoins=self._rejoins,
            rejoin_failures=self._rejoin_failures,
            sdk_reconnects=self._sdk_reconnects,
            controller_departures=self._departures,
            controller_returns=self._returns,
            data_foreign=self._data_foreign,
            data_other_topic=self._data_other_topic,
            rpc_foreign=self._rpc.foreign_calls,
            frames_captured=core.frames_delivered,
            frames_unsent=core.frames_unsent,
            tasks=core.tasks,
            control=core.control,
            pacer=core.pacer,
            outbox=core.outbox,
            viewers=self.viewer_seats.statistics(time.time()),
            attributes=self._attributes.statistics(),
            attribute_failures=self._attribute_failures,
        )


_TRANSIENT_STATES = frozenset({"queued", "admitted"})
"""Session states not worth an attribute update (one of a few a minute): a bound session is past them at once."""

_REFUSAL_MARKS = ("401", "403", "unauthorized", "forbidden", "invalid token", "token is expired", "permission")


def _refuses_token(detail: str) -> bool:
    """Whether the SDK's join failure says the server refused the token (as the real server answers one that does not
    verify or is expired: an HTTP 401 on the signal connection)."""
    lowered = detail.lower()
    return any(mark in lowered for mark in _REFUSAL_MARKS)


def _ends_at_text(ends_at: float | None) -> str:
    return "" if ends_at is None else str(int(ends_at))
