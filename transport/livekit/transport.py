"""The LiveKit transport: one room per session, the service as a participant in it, browsers joining with tokens.

`LiveKitTransport.attach(port)` creates the session's room (RoomService API), mints the identities, joins the
service participant (`LiveKitSessionBinding`) and returns what the browser needs to join:
`{"kind": "livekit", "url", "room", "token", "identity", "expires_at", "service_identity", "control_topic",
"status_topic", "room_owner"}`. `join_details` re-mints the controller's token (same identity) for a browser that
reconnects after its token expired; `viewer_details` mints a watch-only token. `handle_webhook` verifies a LiveKit
webhook and hands the room event to the session it concerns. `detach` leaves and deletes the room, except for a
session handed off (`SessionPort.handed_off`: a drain's hand-off), one whose participant an adopter replaced (a
replica that stalled past its liveness comes back to find its session adopted) and a caller's room: those are left
standing (`detach_deletes_room`).

A session adopted from a lost replica, or handed off by a draining one (`SessionPort.resumed_room`,
docs/continuity.md), goes on in that replica's room, the service's own or a caller's: `attach` joins it again as the
same service identity (the server drops the old participant for the duplicate, whether it is a dead replica's still
listed or a draining replica's not yet gone) and takes control from the same controller identity, so the clients in
the room keep their connection and switch to the new track. The old participant does not make a caller's room "in
use" (`holds_another_session`). A hand-off leaves no gap the room's timeouts could close it in: the room is left, not
deleted, and its clients stay in it (`departure_timeout` counts only once the last participant left; a room the
server closed meanwhile is made again under the same name).

A caller's room (`SessionPort.caller_room`, a create's `"livekit": {"room": ...}`): the room must exist
(`RoomNotFoundError`) and hold no other session of this service (`RoomInUseError`); `check_caller_room` says so
before admission, `attach` checks again. The service joins it with its own identity and publishes there; control is
taken only from the caller-named identity (no token is minted for it: `"token": null`, the caller gives its own
participant a token) or, when none is named, from a controller identity the service mints a token for, as for its
own rooms. `detach` leaves the caller's room and never deletes it (`"room_owner": "caller"` in the details).

One session per caller's room across replicas. Each replica knows only its own sessions, so the LiveKit server is
the arbiter: a room holds a session of this service when a service participant (`svc-…`, any replica's) is in it.
`check_caller_room` lists the room's participants (one RoomService call besides the existence check). Two replicas
attaching to one room at once can both pass that check, so after joining, `attach` lists the room again and keeps
it only if its own participant is listed and joined strictly before every other service participant there (the
server's `joined_at_ms`); otherwise it leaves at once and the session fails with `room_in_use`.

A caller's room joined with the caller's token (`CallerRoom.with_token`: the avatar-provider pattern, any LiveKit
project): `check_caller_room` reads the token (`transport.livekit.caller_tokens`: shape, room, identity, grants,
expiry; `CallerTokenError`) and checks its URL against `LiveKitConfig.caller_urls`; there is no RoomService to ask,
so whether the room holds a session is decided by the room itself: after joining, the service participant sets its
attributes (`lingstream.session_id` among them) and looks at everyone else's; one carrying `lingstream.session_id`
means the room is taken (leave, `RoomInUseError`). Two sessions joining one room within the same moment may both
see the other and both leave, or (when neither's attributes reached the other yet) both stay: the window is one
signalling round trip. A token the server refuses fails the session with `CallerTokenRefusedError`. No token can be
minted in the caller's project: the controller is the caller's (`controller_identity` is required), viewers join
with tokens the caller mints (`viewer_details` refuses), and the caller's webhooks are not ours. A transport with no
project of its own (`LiveKitConfig.has_project` false) takes only such sessions (`check_caller_room(None)` refuses
a create without one). Whichever way the
two joins and listings interleave, the later joiner's listing shows the earlier one, so at most one stays. A tie
(the same millisecond, or the same second on a server without milliseconds) makes the later lister leave too: it
cannot know whether the other already kept the room, and two publishers would be worse than a refused create. If
the listing after the join cannot be had (the server cannot say), the session keeps the room: the check before
joining passed moments ago.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from pipeline.clock import Clock
from transport.base import BindingStatistics, CallerRoom, ReconnectKind, ResumedRoom, SessionPort, ViewerFigures
from transport.errors import (
    CallerTokenError,
    RoomInUseError,
    RoomNotFoundError,
    RoomServiceError,
    SessionAlreadyAttachedError,
    SessionNotAttachedError,
    TransportClosedError,
    WebhookError,
)
from transport.livekit.attributes import SESSION_ID_ATTRIBUTE
from transport.livekit.binding import LiveKitBindingStatistics, LiveKitSessionBinding
from transport.livekit.caller_tokens import CallerToken, caller_url_allowed, read_caller_token
from transport.livekit.config import LiveKitConfig
from transport.livekit.events import RoomEvent
from transport.livekit.room import RoomFactory, livekit_room_factory
from transport.livekit.rooms import RoomAdmin, RoomManager
from transport.livekit.tokens import IssuedToken, ParticipantRole, TokenIssuer, room_name_for
from transport.livekit.webhooks import WebhookHandler
from transport.session.timers import LoopTimers, Timers

__all__ = ["LiveKitTransport", "LiveKitTransportStatistics", "detach_deletes_room", "holds_another_session"]

logger = logging.getLogger(__name__)


def detach_deletes_room(*, callers_room: bool, handed_off: bool, replaced: bool) -> bool:
    """Whether `detach` deletes the session's room after leaving it: only the service's own room of a session that
    ends for good. A caller's room is the caller's (left standing). A handed-off session goes on in its room with the
    replica that adopts it, which joins it again as the same service identity: deleting it would disconnect the
    clients in it (the server's `ROOM_DELETED`), and the room ends when that replica's session does. A binding
    `replaced` (the server dropped it for its identity joining again) left the room to that participant: the
    session's adopter, whether this replica handed it off or stalled past its liveness and was reaped meanwhile."""
    return not callers_room and not handed_off and not replaced


def holds_another_session(identities: Iterable[str], own: str | None = None) -> bool:
    """Whether a room with participants `identities` holds a session of this service other than the one whose
    service identity is `own`: any replica's service participant (`svc-…`) but `own`. `own` is an adopted session's
    old participant, still listed while the server has not yet dropped it (a SIGKILLed replica's until its timeout,
    a draining one's until it left): the adopter joins as that identity, which drops it."""
    return any(i != own and TokenIssuer.has_role(i, ParticipantRole.SERVICE) for i in identities)


@dataclass(frozen=True, slots=True)
class LiveKitTransportStatistics:
    sessions: int
    attached_total: int
    attach_failures: int
    room_delete_failures: int
    webhooks_received: int
    webhooks_rejected: int
    webhooks_unmatched: int


class LiveKitTransport:
    """`Transport` over LiveKit. One instance per service; `start()` before `attach`, `aclose()` at shutdown.

    `room_admin` (default: a `RoomManager` on `config.url`), `room_factory` (default: the real SDK room) and
    `timers` are seams for tests.
    """

    def __init__(
        self,
        config: LiveKitConfig,
        *,
        room_admin: RoomAdmin | None = None,
        room_factory: RoomFactory | None = None,
        timers: Timers | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._config = config
        project = config.has_project
        self._tokens = TokenIssuer(config.api_key, config.api_secret, join_ttl=config.join_ttl) if project else None
        self._webhooks = WebhookHandler(config.api_key, config.api_secret) if project else None
        self._owns_admin = room_admin is None
        self._room_admin: RoomAdmin | None = (
            room_admin
            if room_admin is not None
            else RoomManager(config.url, config.api_key, config.api_secret, config.room)
            if project
            else None
        )
        self._caller_urls = tuple(config.caller_urls) + tuple(u for u in (config.url, config.client_url) if u)
        self._room_factory = room_factory if room_factory is not None else livekit_room_factory
        self._timers: Timers = timers if timers is not None else LoopTimers()
        self._clock = clock
        self._bindings: dict[str, LiveKitSessionBinding] = {}
        self._attaching: set[str] = set()
        self._joining_rooms: set[str] = set()  # callers' rooms a session is being attached to
        self._by_room: dict[str, str] = {}
        self._callers: dict[str, CallerRoom] = {}  # session id -> the caller's room it was published into
        self._running = False
        self._attached_total = 0
        self._attach_failures = 0
        self._room_delete_failures = 0
        self._webhooks_received = 0
        self._webhooks_rejected = 0
        self._webhooks_unmatched = 0

    @property
    def kind(self) -> str:
        return "livekit"

    @property
    def reports_delivery(self) -> bool:
        """Its bindings say when each chunk's frames left the pacer (`transport.base.ReportsDelivery`)."""
        return True

    @property
    def config(self) -> LiveKitConfig:
        return self._config

    async def start(self) -> None:
        if self._running:
            return
        if isinstance(self._room_admin, RoomManager) and self._owns_admin:
            await self._room_admin.start()
        self._running = True

    async def aclose(self) -> None:
        """Detach every session (their rooms are deleted), then close the API client. Idempotent."""
        self._running = False
        for session_id in tuple(self._bindings):
            await self.detach(session_id, "the transport is stopping")
        if isinstance(self._room_admin, RoomManager) and self._owns_admin:
            await self._room_admin.aclose()

    def _details(self, binding: LiveKitSessionBinding) -> Mapping[str, object]:
        """The controller's join details; a fresh token unless the caller named (and tokens) the controller."""
        caller = self._callers.get(binding.session_id)
        token: IssuedToken | None = None
        if caller is None or caller.controller_identity is None:
            token = self._project_tokens().controller(
                binding.session_id, binding.room_name, identity=binding.controller_identity
            )
        return {
            "kind": "livekit",
            "url": caller.url if caller is not None and caller.url is not None else self._config.join_url,
            "room": binding.room_name,
            "token": None if token is None else token.token,
            "identity": binding.controller_identity,
            "expires_at": None if token is None else token.expires_at,
            "service_identity": binding.service_identity,
            "control_topic": self._config.control_topic,
            "status_topic": self._config.status_topic,
            "room_owner": "service" if caller is None else "caller",
        }

    def _project_tokens(self) -> TokenIssuer:
        if self._tokens is None:
            raise CallerTokenError(
                "this service has no LiveKit project of its own: it joins callers' rooms with their tokens only"
            )
        return self._tokens

    def _read_caller_token(self, room: CallerRoom) -> CallerToken:
        """The caller's token of `room`, read and checked (`CallerTokenError`)."""
        assert room.url is not None  # with_token
        assert room.token is not None
        if not caller_url_allowed(room.url, self._caller_urls):
            raise CallerTokenError(
                f"livekit.url {room.url!r} is not a LiveKit server this service may join "
                "(LINGSTREAM_LIVEKIT_CALLER_URLS)"
            )
        token = read_caller_token(room.url, room.token, now=time.time())
        if room.name and room.name != token.room:
            raise CallerTokenError(f"livekit.room {room.name!r} is not the room the token grants ({token.room!r})")
        if token.identity == room.controller_identity:
            raise CallerTokenError("livekit.token's identity is the controller's: mint one for the service")
        if room.agent_identity is not None and token.identity == room.agent_identity:
            raise CallerTokenError("livekit.token's identity is the agent's: mint one for the service")
        return token

    @staticmethod
    def _room_key(room: CallerRoom) -> str:
        # Callers' tokens may name rooms on other servers: a room is known by its server too.
        return room.name if room.url is None else f"{room.url}#{room.name}"

    async def check_caller_room(
        self, room: CallerRoom | None, *, resumed: ResumedRoom | None = None
    ) -> CallerRoom | None:
        """The caller's room as the session will join it (None: the service's own room). Raises
        `RoomNotFoundError` when the caller's room does not exist, `RoomInUseError` when a session of this service is
        in it (or joining it) already (with a caller's token: of this replica; the room itself tells at the join), a
        `RoomServiceError` when the server cannot say, and `CallerTokenError` for a caller's token or URL that cannot
        work, or a create without one on a transport with no project. `resumed`: an adopted session's room, whose
        old service participant (`resumed.service_identity`) is its own, not another session."""
        if room is None:
            self._project_tokens()
            return None
        if room.with_token:
            token = self._read_caller_token(room)
            room = replace(room, name=token.room)
            key = self._room_key(room)
            if key in self._by_room or key in self._joining_rooms:
                raise RoomInUseError(room.name)
            return room
        admin = self._admin()
        if room.name in self._by_room or room.name in self._joining_rooms:
            raise RoomInUseError(room.name)
        if not await admin.room_exists(room.name):
            raise RoomNotFoundError(room.name)
        participants = await admin.list_participants(room.name)
        own = resumed.service_identity if resumed is not None and resumed.room == room.name else None
        if holds_another_session((p.identity for p in participants), own):
            raise RoomInUseError(room.name)  # a session of another replica is in it
        return room

    def _admin(self) -> RoomAdmin:
        if self._room_admin is None:
            self._project_tokens()  # raises: no project
            raise AssertionError("a project without a room admin")
        return self._room_admin

    async def _keeps_caller_room(self, binding: LiveKitSessionBinding) -> bool:
        """After joining a caller's room: whether this session's participant joined it before every other service
        participant (module docstring); True when the server cannot say."""
        try:
            participants = await self._admin().list_participants(binding.room_name)
        except RoomServiceError:
            logger.warning(
                "session %s: could not list room %s after joining it; keeping it",
                binding.session_id,
                binding.room_name,
                exc_info=True,
            )
            return True
        ours = binding.service_identity
        rivals = [
            p.joined_at_ms
            for p in participants
            if p.identity != ours and TokenIssuer.has_role(p.identity, ParticipantRole.SERVICE)
        ]
        if not rivals:
            return True
        mine = next((p.joined_at_ms for p in participants if p.identity == ours), None)
        # Not listed yet (the server's view lags our join): we are the later joiner, whoever the rival is.
        return mine is not None and mine < min(rivals)

    async def attach(self, port: SessionPort) -> Mapping[str, object]:
        """Create the room, join the service participant, return the controller's join details.

        Raises `RoomServiceError` (the room could not be created) or `RoomJoinError` (the service could not join;
        the room is deleted again).
        """
        if not self._running:
            raise TransportClosedError("the LiveKit transport is not started")
        session_id = port.session_id
        if session_id in self._bindings or session_id in self._attaching:
            raise SessionAlreadyAttachedError(session_id)
        resumed = port.resumed_room
        caller = await self.check_caller_room(port.caller_room, resumed=resumed)
        caller_token = self._read_caller_token(caller) if caller is not None and caller.with_token else None
        key = self._room_key(caller) if caller is not None else None
        if caller is not None and resumed is not None and resumed.room != caller.name:
            logger.warning(
                "session %s: its old room %s is not the caller's room %s; not joined again",
                session_id,
                resumed.room,
                caller.name,
            )
            resumed = None
        self._attaching.add(session_id)
        try:
            if caller is None:
                # An adopted session goes on in its lost replica's room (creating a room that exists is a no-op;
                # one the server closed meanwhile, emptied, is made again under the same name).
                room = resumed.room if resumed is not None else room_name_for(session_id, self._config.room_prefix)
                metadata = json.dumps({"session_id": session_id}, separators=(",", ":"))
                await self._admin().create_room(room, metadata=metadata)
            else:
                room = caller.name
                self._joining_rooms.add(room if key is None else key)
            if resumed is not None:
                controller = resumed.controller_identity
            elif caller is not None and caller.controller_identity is not None:
                controller = caller.controller_identity
            else:
                controller = TokenIssuer.new_identity(ParticipantRole.CONTROLLER, session_id)
            if caller_token is not None:
                service_identity = caller_token.identity
            elif resumed is not None:
                # The same identity: the server drops the lost replica's participant at once (a duplicate
                # identity) instead of after its departure timeout, and clients keep following that identity.
                service_identity = resumed.service_identity
            else:
                service_identity = TokenIssuer.new_identity(ParticipantRole.SERVICE, session_id)
            try:
                binding = LiveKitSessionBinding(
                    port,
                    config=self._config,
                    room_name=room,
                    controller_identity=controller,
                    service_identity=service_identity,
                    tokens=None if caller_token is not None else self._project_tokens(),
                    room_factory=self._room_factory,
                    timers=self._timers,
                    clock=self._clock,
                    caller_token=caller_token,
                    agent_identity=caller.agent_identity if caller is not None else None,
                )
                await binding.start()
            except BaseException:
                self._attach_failures += 1
                if caller is None:
                    await self._delete_room(room)
                raise
            if caller is not None:
                try:
                    keeps = (
                        self._room_is_free(binding)
                        if caller_token is not None
                        else await self._keeps_caller_room(binding)
                    )
                except BaseException:  # cancelled while listing: leave the room we joined
                    self._attach_failures += 1
                    await binding.aclose("attaching was cancelled")
                    raise
                if not keeps:
                    self._attach_failures += 1
                    await binding.aclose("another session of this service joined the room first")
                    raise RoomInUseError(room)
            self._bindings[session_id] = binding
            self._by_room[room if key is None else key] = session_id
            if caller is not None:
                self._callers[session_id] = caller
            self._attached_total += 1
        finally:
            self._attaching.discard(session_id)
            if key is not None:
                self._joining_rooms.discard(key)
        return self._details(binding)

    @staticmethod
    def _room_is_free(binding: LiveKitSessionBinding) -> bool:
        """Joined with a caller's token: whether nobody else in the room carries a session of this service (our
        attributes went out with the join, so a rival joining after us sees ours)."""
        return not any(SESSION_ID_ATTRIBUTE in attributes for attributes in binding.remote_attributes().values())

    async def client_connected(self, session_id: str) -> None:
        """`transport.base.WaitsForClient`: once someone in the session's room subscribed to its video track (its
        controller, which stayed in the room while the session was adopted, or a viewer) and the subscriber is ready
        for it (`LiveKitSessionBinding.wait_subscribed`). An adopted session's first chunks wait for it (at most
        `RuntimeTuning.resume_client_wait_s`) instead of going out while nobody receives the new track."""
        await self._binding(session_id).wait_subscribed()

    def _binding(self, session_id: str) -> LiveKitSessionBinding:
        binding = self._bindings.get(session_id)
        if binding is None:
            raise SessionNotAttachedError(session_id)
        return binding

    def join_details(self, session_id: str) -> Mapping[str, object]:
        """Fresh join details for the session's controller (same identity, new token): for a rejoin after the
        first token expired."""
        return self._details(self._binding(session_id))

    def rejoin_details(self, session_id: str, published: Mapping[str, object]) -> Mapping[str, object]:
        """Fresh join details for a session attached by another service replica (shared admission), from the
        details that replica published: the same room and controller identity, a new token. Minting needs only the
        API key, so any replica can do it; raises `SessionNotAttachedError` when `published` names no LiveKit room.
        """
        room, identity = published.get("room"), published.get("identity")
        if published.get("kind") != "livekit" or not isinstance(room, str) or not isinstance(identity, str):
            raise SessionNotAttachedError(session_id)
        if published.get("token") is None:
            return dict(published)  # the caller tokens its own controller
        token = self._project_tokens().controller(session_id, room, identity=identity)
        return {**published, "url": self._config.join_url, "token": token.token, "expires_at": token.expires_at}

    def viewer_details(self, session_id: str) -> Mapping[str, object]:
        """Join details for a viewer: a new identity that may subscribe and nothing else. It takes one of the
        session's `max_viewers` places, held until the viewer leaves the room (or until the token's time to join
        runs out unused); raises `TooManyViewersError` when every place is taken."""
        binding = self._binding(session_id)
        caller = self._callers.get(session_id)
        if caller is not None and caller.with_token:
            raise CallerTokenError(
                "this session is in a caller's room joined with the caller's token: its viewers join with tokens the "
                "caller mints"
            )
        token = self._project_tokens().viewer(session_id, binding.room_name)
        binding.viewer_seats.reserve(token.identity, token.expires_at, time.time())
        return {
            "kind": "livekit",
            "url": self._config.join_url,
            "room": token.room,
            "token": token.token,
            "identity": token.identity,
            "expires_at": token.expires_at,
            "service_identity": binding.service_identity,
            "status_topic": self._config.status_topic,
        }

    def handle_webhook(self, body: bytes | str, authorization: str | None) -> RoomEvent | None:
        """Verify a LiveKit webhook (raises `WebhookError`: answer 401) and apply it to its session.

        Returns the room event it was mapped to (None for events no session acts on, or for a room no attached
        session owns, e.g. one deleted a moment ago).
        """
        self._webhooks_received += 1
        if self._webhooks is None:
            self._webhooks_rejected += 1
            raise WebhookError("this service has no LiveKit project of its own: it takes no webhooks")
        try:
            event = self._webhooks.receive(body, authorization)
        except Exception:
            self._webhooks_rejected += 1
            raise
        if event is None:
            return None
        session_id = self._by_room.get(event.room)
        binding = self._bindings.get(session_id) if session_id is not None else None
        if binding is None:
            self._webhooks_unmatched += 1
            return event
        binding.handle_room_event(event)
        return event

    async def detach(self, session_id: str, reason: str) -> None:
        """Leave the session's room and delete it, unless it is the caller's or the session was handed off to another
        replica (left only: `detach_deletes_room`). Idempotent; never raises for LiveKit errors (logged, counted: the
        room's timeouts remove it anyway)."""
        binding = self._bindings.pop(session_id, None)
        if binding is None:
            return
        caller = self._callers.pop(session_id, None)
        handed_off = binding.port.handed_off
        self._by_room.pop(binding.room_name if caller is None else self._room_key(caller), None)
        # Closing the binding leaves the room. Handed off, the adopter may have joined as the same identity already
        # (the server then dropped this participant: `DUPLICATE_IDENTITY`, which the session ignores: it is ending
        # here); its end publishes no `done` (the session goes on).
        await binding.aclose(reason)
        if detach_deletes_room(callers_room=caller is not None, handed_off=handed_off, replaced=binding.replaced):
            await self._delete_room(binding.room_name)
        elif caller is None:
            logger.info(
                "session %s: left LiveKit room %s standing for the replica that %s",
                session_id,
                binding.room_name,
                "it was handed to" if handed_off else "adopted it (the server dropped this participant for it)",
            )
        else:
            logger.info("session %s: left the caller's LiveKit room %s (not deleted)", session_id, binding.room_name)

    async def _delete_room(self, room: str) -> None:
        try:
            await self._admin().delete_room(room)
        except RoomServiceError:
            self._room_delete_failures += 1
            logger.warning("deleting LiveKit room %s failed; its timeouts will remove it", room, exc_info=True)

    def session_statistics(self, session_id: str) -> LiveKitBindingStatistics:
        return self._binding(session_id).statistics()

    def binding_statistics(self, session_id: str) -> BindingStatistics:
        stats = self.session_statistics(session_id)
        return BindingStatistics(
            pacer=stats.pacer,
            frames_unsent=stats.frames_unsent,
            track_dropped=None,  # the SDK's video source keeps no queue of its own
            reconnects={
                ReconnectKind.SDK_RESUME: stats.sdk_reconnects,
                ReconnectKind.REJOIN: stats.rejoins,
                ReconnectKind.CONTROLLER_RETURN: stats.controller_returns,
            },
            viewers=ViewerFigures(watching=stats.viewers.watching),
            controls=stats.control.forwarded_by,
        )

    def statistics(self) -> LiveKitTransportStatistics:
        return LiveKitTransportStatistics(
            sessions=len(self._bindings),
            attached_total=self._attached_total,
            attach_failures=self._attach_failures,
            room_delete_failures=self._room_delete_failures,
            webhooks_received=self._webhooks_received,
            webhooks_rejected=self._webhooks_rejected,
            webhooks_unmatched=self._webhooks_unmatched,
        )
