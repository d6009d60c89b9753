"""The seam between the service and the transports.

A transport binds a session to a browser: control in, frames out, status out. The service owns sessions and
implements `SessionPort` for each; a `Transport` (LiveKit or embedded WebRTC) attaches to a port and returns the
details the client needs to join (they go into the REST response). A reconnect *rebinds*: the transport attaches
a new connection to the same port; the session, its caches, pose and sequence numbers are untouched.

Status messages are the service-to-client half of control protocol v1; the transports encode them as JSON.

What a transport can do beyond `Transport` is said by *capabilities*, small runtime-checkable protocols
(`AnswersOffers`, `AnswersViewerOffers`, `IssuesViewers`, `RenewsJoinDetails`, `ChecksCallerRooms`,
`ReceivesWebhooks`): the service's routes ask the one active transport for a capability (`isinstance(transport,
IssuesViewers)`) and never name a transport class; only the composition root (`service.transports`) does. (mypy
does not narrow a value typed as one Protocol by `isinstance` of another: it reads the branch as unreachable. Code
that only asks for capabilities holds the transport as `object`, as the routes do.)

What a transport reports to the service is typed here too, in terms every kind shares: `BindingStatistics` for one
session's binding (its pacer, frames nobody took, returns by `ReconnectKind`, its viewers as `ViewerFigures`) and
`TransportStatistics` for the whole transport. Each kind also has its own, richer records (`session_statistics()`,
`statistics()`).
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from pipeline.bidirectional import ChunkItem, ControlMessage

if TYPE_CHECKING:  # the seam names the pacer's record; importing transport.session here would run in a circle
    from transport.session.pacing import PacerStatistics

__all__ = [
    "SERVICE_IDENTITY_PREFIX",
    "AnswersOffers",
    "AnswersViewerOffers",
    "BindingStatistics",
    "CallerRoom",
    "ChecksCallerRooms",
    "ChunkStatus",
    "DoneStatus",
    "ErrorStatus",
    "IssuesViewers",
    "ReceivesWebhooks",
    "ReconnectKind",
    "RenewsJoinDetails",
    "ReportsDelivery",
    "ResumedRoom",
    "SessionPort",
    "StateStatus",
    "StatusMessage",
    "Transport",
    "TransportStatistics",
    "ViewerFigures",
    "WaitsForClient",
    "WarningStatus",
]

SERVICE_IDENTITY_PREFIX = "svc-"
"""How every replica tells the service's own participants in a room (the LiveKit tokens' `ParticipantRole.SERVICE`
identities start with it): one session per caller's room across replicas rests on it."""


@dataclass(frozen=True, slots=True)
class StateStatus:
    """The session's lifecycle state changed (e.g. "running", "draining", "closed")."""

    state: str
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class ChunkStatus:
    """A chunk was generated from control snapshot `applied_seq` holding `keys`.

    `first_frame_pts`: the presentation timestamp (90 kHz, the RTP video clock) of the chunk's first frame as the
    pacer sent it, set by the binding; None when the status went out without it (its frames were never paced)."""

    index: int
    applied_seq: int
    keys: tuple[str, ...]
    timings: Mapping[str, float] = field(default_factory=dict)
    first_frame_pts: int | None = None
    prompt: str = ""
    """The text prompt the chunk was generated from ("" for none)."""
    prompt_seq: int = -1
    """The `seq` of the `prompt` message that set it (-1: the prompt the session was created with)."""
    stream_base_pts: int | None = None
    """Embedded transport: the presentation timestamp of the first frame the connection's video track sent (an
    aiortc receiver counts a frame's timestamp from that frame, so this maps its frames onto `first_frame_pts`
    exactly); None before that frame went out, and on LiveKit."""
    first_frame_id: int | None = None
    """The index of the chunk's first frame in the session's video: on LiveKit every frame carries its index as
    frame metadata (`frame_id`), so a receiver finds each chunk's frames, and tells keep-warm repeats (an id seen
    already), exactly. None from a service that does not say."""


@dataclass(frozen=True, slots=True)
class WarningStatus:
    """The session will end soon unless the client acts: `code` says why (`time_limit`, `paused_too_long`) and
    `ends_in_s` when."""

    code: str
    message: str
    ends_in_s: float


@dataclass(frozen=True, slots=True)
class ErrorStatus:
    """Something the client sent or the session hit; `code` is stable (see the README's error table)."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class DoneStatus:
    """The session ended; `reason` says why: the session's stable reason (`client_stop`, `client_deleted`,
    `time_limit`, `completed`, `model_failure`, `queue_timeout`, ...), else its terminal state's name."""

    reason: str


StatusMessage = StateStatus | ChunkStatus | WarningStatus | ErrorStatus | DoneStatus


_MAX_ROOM_NAME = 256
_MAX_IDENTITY = 256


@dataclass(frozen=True, slots=True)
class CallerRoom:
    """A LiveKit room that exists already and belongs to the caller (a voice agent's, a game lobby's): the session is
    published there instead of in a room of its own. Takes control only from `controller_identity` (None: the
    service mints a controller identity and token for that room, as for its own rooms), and leaves, never deletes,
    the room when the session ends. Checked on construction (`ValueError`).

    Two ways in. By name (`name`): the service joins with its own identity and a token it mints, so the room must be
    on the service's own LiveKit project. With the caller's token (`url` and `token`, the avatar-provider pattern):
    the service joins `url` with the token the caller minted for it, on any LiveKit project, holding no secret of
    it; the room is the token's (`name` is "" until the transport read it, `ChecksCallerRooms`), and
    `controller_identity` is required (no token can be minted for a controller). `agent_identity`: the agent the
    video is published for (the `lk.publish_on_behalf` attribute)."""

    name: str
    controller_identity: str | None = None
    url: str | None = None
    token: str | None = field(default=None, repr=False)
    agent_identity: str | None = None

    def __post_init__(self) -> None:
        if (self.url is None) != (self.token is None):
            raise ValueError("give livekit.url and livekit.token together")
        if self.token is None and not self.name:
            raise ValueError("name the room (livekit.room), or give livekit.url and livekit.token")
        if self.name and (len(self.name) > _MAX_ROOM_NAME or not self.name.isprintable()):
            raise ValueError(f"a room name is 1 to {_MAX_ROOM_NAME} printable characters")
        identity = self.controller_identity
        if self.token is not None and identity is None:
            raise ValueError("with livekit.token, name the controller (livekit.controller_identity)")
        for what, value in (("controller", identity), ("agent", self.agent_identity)):
            if value is not None and (not 1 <= len(value) <= _MAX_IDENTITY or not value.isprintable()):
                raise ValueError(
                    f"a{'n' if what == 'agent' else ''} {what} identity is 1 to {_MAX_IDENTITY} printable characters"
                )
        if identity is not None and identity.startswith(SERVICE_IDENTITY_PREFIX):
            # The service's own participants are told apart by that prefix (one session per room, across replicas).
            raise ValueError(f"a controller identity must not start with {SERVICE_IDENTITY_PREFIX}")

    @property
    def with_token(self) -> bool:
        """Whether the service joins with the caller's token (else by name, with a token of its own)."""
        return self.token is not None


@dataclass(frozen=True, slots=True)
class ResumedRoom:
    """The LiveKit room of a session adopted from a lost replica, or handed off by a draining one
    (docs/continuity.md): the adopter joins this room again, as the same service participant, taking control from
    the same controller identity, so that the clients already in the room keep their connection and only switch to
    the new video track. Read from the join details the old replica published; the service's own room or a caller's
    room joined by name (a caller's token names its own room and identity)."""

    room: str
    controller_identity: str
    service_identity: str


class SessionPort(Protocol):
    """One running session as a transport sees it (implemented by the service)."""

    @property
    def session_id(self) -> str: ...

    @property
    def caller_room(self) -> CallerRoom | None:
        """The caller's LiveKit room to publish into (None: the transport makes its own, if it has rooms)."""
        ...

    @property
    def resumed_room(self) -> ResumedRoom | None:
        """The LiveKit room an adopted session goes on in (None: a new session, or one without a room)."""
        ...

    @property
    def handed_off(self) -> bool:
        """Whether the session stops here to go on with another replica (a drain's hand-off, docs/continuity.md):
        its end here is not the session's, so `detach` leaves what the adopter needs standing (a LiveKit room is
        left, not deleted: the adopter joins it again). Read at `detach`."""
        ...

    @property
    def ends_at(self) -> float | None:
        """Unix seconds the session ends by (its time limit), None while it has none."""
        ...

    @property
    def width(self) -> int: ...

    @property
    def height(self) -> int: ...

    @property
    def fps(self) -> float: ...

    @property
    def state(self) -> str:
        """The session's lifecycle state now (`running`, `paused`, `draining`, ...: the REST API's names). Read after
        `push_control` it is the state the message left the session in (a `Pause` → `paused`, a `Stop` →
        `draining`): what a discrete command that expects an answer (a LiveKit RPC) returns."""
        ...

    def push_control(self, message: ControlMessage) -> None:
        """Hand a decoded control message to the session (never blocks; stale snapshots are dropped). Raises
        `ControlRejectedError` for a message the session refuses in its state (e.g. `pause` while it drains); the
        bindings answer it with an `error` status carrying its code."""
        ...

    def chunks(self) -> AsyncIterator[ChunkItem]:
        """The session's generated chunks from now on, bounded, latest wins: a slow consumer skips chunks. Where the
        model decodes progressively, a chunk's `ChunkPart`s (its first frames, decoded ahead of it) come before it:
        play the parts at once, then only the frames of the chunk no part brought."""
        ...

    def status(self) -> AsyncIterator[StatusMessage]:
        """Status messages from now on, starting with the current `StateStatus`; ends after `DoneStatus`."""
        ...

    def client_gone(self, reason: str) -> None:
        """The controlling client left for good (grace expired or an "over" disconnect): close the session."""
        ...

    def delivered(self, chunk_index: int) -> None:
        """Every frame of the chunks up to `chunk_index` left the transport's pacer (sent, or dropped late: the
        client's clock moved past them); called in chunk order, each index at most once, by a transport that
        `ReportsDelivery`. The service then publishes the checkpoint a successor goes on from (docs/continuity.md)."""
        ...


class ReconnectKind(enum.Enum):
    """How a client's connection came back to its session (the `kind` label of the service's reconnect counter)."""

    SDK_RESUME = "sdk_resume"  # LiveKit: the SDK resumed the room connection by itself
    REJOIN = "rejoin"  # LiveKit: the service participant joined the room again after losing it
    CONTROLLER_RETURN = "controller_return"  # LiveKit: the controlling participant came back within the grace
    PEER_RETURN = "peer_return"  # embedded: a new peer connection rebound the session within the grace


@dataclass(frozen=True, slots=True)
class ViewerFigures:
    """A session's viewers in common terms. `watching`: viewers connected now. `frames_dropped`: frames a slow
    viewer's own track dropped (its sender was behind; the controller and other viewers are not held up).
    `controls_refused`: messages viewers sent, never applied (answered `viewer_cannot_control`). None: this kind
    does not carry that itself (LiveKit: the SFU forwards the one published track to viewers, and a viewer's token
    cannot publish data)."""

    watching: int = 0
    frames_dropped: int | None = None
    controls_refused: int | None = None


@dataclass(frozen=True, slots=True)
class BindingStatistics:
    """What every kind of session binding reports, in the same terms (the service's metrics read this).

    `pacer`: the binding's frame pacer (frames sent; dropped late, by overflow, or rejected for their shape).
    `frames_unsent`: frames the pacer released while no connection could take them. `track_dropped`: frames the
    video track's own queue dropped because its sender was behind (None: this kind has no such queue).
    `reconnects`: returns counted by kind, for the kinds this binding has. `viewers`: the session's viewers.
    `controls`: the controller's messages handed to the session, by `(via, type)`: `via` `packet` (a data packet or
    data channel message) or `rpc` (a LiveKit RPC call), `type` the message's wire type
    (`ControlStatistics.forwarded_by`).
    """

    pacer: PacerStatistics
    frames_unsent: int
    track_dropped: int | None
    reconnects: Mapping[ReconnectKind, int]
    viewers: ViewerFigures = ViewerFigures()
    controls: Mapping[tuple[str, str], int] = field(default_factory=dict)


class TransportStatistics(Protocol):
    """What every transport's `statistics()` record has (each kind's frozen record has more)."""

    @property
    def sessions(self) -> int:
        """Sessions attached now."""
        ...


class Transport(Protocol):
    """Binds sessions to clients. One instance per service; `attach` once per session, rebinds inside."""

    @property
    def kind(self) -> str:
        """ "livekit" or "embedded"."""
        ...

    async def start(self) -> None: ...

    async def aclose(self) -> None:
        """Close every binding and stop what the transport runs (the one shutdown verb); idempotent."""
        ...

    async def attach(self, port: SessionPort) -> Mapping[str, object]:
        """Start serving the session; return the JSON-able join details for the client."""
        ...

    def join_details(self, session_id: str) -> Mapping[str, object]:
        """Fresh join details for an attached session (e.g. a new short-lived LiveKit token for a GET)."""
        ...

    async def detach(self, session_id: str, reason: str) -> None:
        """Stop serving the session (it is closing); idempotent."""
        ...

    def statistics(self) -> TransportStatistics: ...

    def binding_statistics(self, session_id: str) -> BindingStatistics:
        """An attached session's binding in common terms; raises `SessionNotAttachedError` for any other id."""
        ...


# -- capabilities: what some transports can do beyond `Transport` (the routes ask with isinstance)


@runtime_checkable
class ReportsDelivery(Protocol):
    """Paces each session's frames and says when a chunk's frames left the pacer (`SessionPort.delivered`): the
    service holds each chunk's checkpoint until then, so a successor goes on from what the client was sent (LiveKit
    and embedded; a transport without it gets every checkpoint published as its chunk is generated)."""

    @property
    def reports_delivery(self) -> bool: ...


@runtime_checkable
class WaitsForClient(Protocol):
    """Can say when a session's client has connected (the embedded transport: its first peer connection): an adopted
    session's generation waits for it (bounded), so that the chunks its client has not seen are not sent to nobody
    while the client reconnects (docs/continuity.md)."""

    async def client_connected(self, session_id: str) -> None:
        """Return once the attached session's client has connected (at once if it has);
        `SessionNotAttachedError` for a session not attached here."""
        ...


@runtime_checkable
class AnswersOffers(Protocol):
    """Answers the session client's own WebRTC offer (the embedded transport): every offer rebinds the session."""

    async def answer(self, session_id: str, offer_sdp: str, offer_type: str) -> tuple[str, str]:
        """The SDP answer and its type; `SessionNotAttachedError` when the session is not attached,
        `SignalingError` for an offer it refuses."""
        ...


@runtime_checkable
class AnswersViewerOffers(Protocol):
    """Answers a viewer's WebRTC offer, authenticated by a viewer credential it issued (the embedded transport)."""

    def verify_viewer(self, session_id: str, token: str) -> str:
        """The viewer id the credential names; `ViewerTokenError` unless it is valid for this session."""
        ...

    async def answer_viewer(self, session_id: str, token: str, offer_sdp: str, offer_type: str) -> tuple[str, str]:
        """The SDP answer for the viewer and its type (watch-only)."""
        ...


@runtime_checkable
class IssuesViewers(Protocol):
    """Issues watch-only join details for one more viewer of a session (LiveKit and embedded)."""

    def viewer_details(self, session_id: str) -> Mapping[str, object]:
        """`TooManyViewersError` beyond the transport's bound; `SessionNotAttachedError` when not attached."""
        ...


@runtime_checkable
class RenewsJoinDetails(Protocol):
    """Join details that go stale (LiveKit's short-lived tokens), renewed on every read of the session."""

    def join_details(self, session_id: str) -> Mapping[str, object]:
        """Fresh details for a session attached here (`SessionNotAttachedError` otherwise)."""
        ...

    def rejoin_details(self, session_id: str, published: Mapping[str, object]) -> Mapping[str, object]:
        """Fresh details for a session another replica runs, from the details that replica published."""
        ...


@runtime_checkable
class ChecksCallerRooms(Protocol):
    """Publishes a session into a room the caller names (LiveKit), checked before the session takes a place."""

    async def check_caller_room(self, room: CallerRoom | None) -> CallerRoom | None:
        """The room as the session will join it (with a caller's token: named after the token's room); None for a
        create that names no room (`CallerTokenError` where the transport takes only callers' rooms). Raises
        `RoomNotFoundError` when the room does not exist, `RoomInUseError` when a session of this service (any
        replica) is in it already (as far as can be told before joining), `CallerTokenError` for a caller's token
        or URL that cannot work."""
        ...


@runtime_checkable
class ReceivesWebhooks(Protocol):
    """Receives the media server's signed webhooks (LiveKit)."""

    def handle_webhook(self, body: bytes | str, authorization: str | None) -> object:
        """Verify and apply one webhook (`WebhookError` when its signature does not hold); returns the event, if
        it was one the transport reads."""
        ...
