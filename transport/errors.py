"""Errors raised by the transport package (LiveKit binding, embedded WebRTC, tokens, room management, webhooks).

    TransportError
    ├── TransportConfigError             a configuration value is invalid (the message names the field)
    ├── TransportClosedError             the transport was stopped (or never started) when it was called
    ├── SessionNotAttachedError          no session with this id is attached to the transport
    ├── SessionAlreadyAttachedError      `attach` was called twice for the same session id
    ├── RoomServiceError                 a LiveKit RoomService call failed (`code` is the server's error code)
    │   ├── RoomServiceAuthError         the server rejected our credentials or grants (401/403)
    │   └── RoomServiceUnavailableError  the server could not be reached, timed out or answered 5xx
    ├── RoomJoinError                    the service participant could not join (or publish into) its room
    │   └── CallerTokenRefusedError      the LiveKit server refused the token a caller minted for the service
    ├── CallerTokenError                 a caller's LiveKit token (or URL) cannot work: refused before starting
    ├── RoomNotFoundError                a create named a caller's LiveKit room that does not exist
    ├── RoomInUseError                   a caller's room that already holds a session of this service
    ├── LinkLostError                    a message could not go out: its room connection or peer closed mid-send
    ├── WebhookError                     a LiveKit webhook failed verification (signature, body hash, or body)
    ├── SignalingError                   an embedded WebRTC offer was malformed, oversized or could not be answered
    ├── TooManyViewersError              the session already has `max_viewers` viewers (or credentials out for them)
    ├── ViewerTokenError                 an embedded viewer credential was refused
    │   ├── ViewerTokenInvalidError      not a credential this transport minted for this session
    │   └── ViewerTokenExpiredError      a genuine credential whose time to join has passed
    └── ControlRejectedError             the session refused a well-formed control message in its state (`code`)

Malformed *control messages* are not errors here: the protocol decoder returns a `ProtocolError` value and the
bindings answer it with an `error` status message (a client's mistake must never raise into the service).
Foreign exceptions (livekit-api `ServerError`, `aiohttp` errors, `livekit.rtc.ConnectError`, aiortc errors) are
translated where they are caught, always with `raise ... from exc`.
"""

from __future__ import annotations

__all__ = [
    "CallerTokenError",
    "CallerTokenRefusedError",
    "ControlRejectedError",
    "LinkLostError",
    "RoomInUseError",
    "RoomJoinError",
    "RoomNotFoundError",
    "RoomServiceAuthError",
    "RoomServiceError",
    "RoomServiceUnavailableError",
    "SessionAlreadyAttachedError",
    "SessionNotAttachedError",
    "SignalingError",
    "TooManyViewersError",
    "TransportClosedError",
    "TransportConfigError",
    "TransportError",
    "ViewerTokenError",
    "ViewerTokenExpiredError",
    "ViewerTokenInvalidError",
    "WebhookError",
]


class TransportError(Exception):
    """Root of every error the transport package raises."""


class TransportConfigError(TransportError):
    """A configuration value is invalid."""


class TransportClosedError(TransportError):
    """The transport is not running (never started, or stopped)."""


class SessionNotAttachedError(TransportError):
    """No session with this id is attached (never attached, or detached already)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"no session {session_id!r} is attached to this transport")
        self.session_id = session_id


class SessionAlreadyAttachedError(TransportError):
    """A session is attached once; reconnects rebind inside the transport."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} is already attached to this transport")
        self.session_id = session_id


class RoomServiceError(TransportError):
    """A LiveKit RoomService call failed. `code` is the Twirp error code (e.g. "invalid_argument")."""

    def __init__(self, operation: str, code: str, message: str, status: int | None = None) -> None:
        where = f" (HTTP {status})" if status is not None else ""
        super().__init__(f"LiveKit RoomService {operation} failed{where}: {code}: {message}")
        self.operation = operation
        self.code = code
        self.status = status


class RoomServiceAuthError(RoomServiceError):
    """The LiveKit server rejected our API key, secret or grants: a deployment error, not a transient one."""


class RoomServiceUnavailableError(RoomServiceError):
    """The LiveKit server could not be reached, timed out, or failed internally (worth retrying later)."""


class RoomJoinError(TransportError):
    """The service participant could not join its room or publish its video track."""

    def __init__(self, detail: str, room: str | None = None) -> None:
        where = f" {room!r}" if room is not None else ""
        super().__init__(f"the service participant could not join LiveKit room{where}: {detail}")
        self.detail = detail
        self.room = room


class CallerTokenRefusedError(RoomJoinError):
    """The LiveKit server refused the token the caller minted for the service participant (bad signature, another
    project's key, revoked or expired); the detail never quotes the token."""


class CallerTokenError(TransportError):
    """A create's `livekit.url`/`livekit.token` cannot work (malformed, expired, missing a grant, a URL the
    deployment does not dial, or a service without caller tokens): refused before the session takes a place."""


class RoomNotFoundError(TransportError):
    """The caller's LiveKit room named in a create does not exist (the service never creates a caller's room)."""

    def __init__(self, room: str) -> None:
        super().__init__(f"LiveKit room {room[:80]!r} does not exist; create it first, or leave out livekit.room")
        self.room = room


class RoomInUseError(TransportError):
    """The caller's LiveKit room already holds a session of this service (one session per room)."""

    def __init__(self, room: str) -> None:
        super().__init__(f"LiveKit room {room[:80]!r} already holds a session of this service")
        self.room = room


class LinkLostError(TransportError):
    """A message could not go out because the connection under it ended (e.g. the room was deleted mid-send)."""


class WebhookError(TransportError):
    """A LiveKit webhook request failed verification; answer it with 401 and do not act on it."""


class SignalingError(TransportError):
    """An SDP offer for the embedded transport was rejected (malformed, oversized, wrong type, or unanswerable)."""


class TooManyViewersError(TransportError):
    """A session has as many viewers as it may (`max_viewers`): watching ones plus credentials not yet used."""

    def __init__(self, session_id: str, limit: int) -> None:
        super().__init__(
            f"session {session_id!r} already has {limit} viewer(s), the most it may have; retry when one leaves"
        )
        self.session_id = session_id
        self.limit = limit


class ViewerTokenError(TransportError):
    """An embedded viewer's credential was refused (answer 401; the viewer needs a new one)."""


class ViewerTokenInvalidError(ViewerTokenError):
    """The credential is malformed, forged, or was minted for another session."""


class ViewerTokenExpiredError(ViewerTokenError):
    """The credential is genuine but its time to join has passed (or its place was given up)."""


class ControlRejectedError(TransportError):
    """A `SessionPort` refused a well-formed control message in the session's state (e.g. `pause` while it drains).

    Raised by the service's port, caught by the binding's control intake, which answers the client with an `error`
    status carrying `code` (a stable code of the REST error table, e.g. `session_not_running`)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
