"""The Python client's errors: the service's stable error codes as typed exceptions, and what can go wrong on the
client's side of a session.

    ClientError
    ├── ApiError                     a non-2xx answer; `status`, `code` (the service's stable code), `message`
    │   ├── UnauthorizedError        unauthorized, viewer_token_expired, viewer_token_invalid, token_invalid,
    │   │                            token_expired, token_revoked      a missing, wrong, expired or revoked credential
    │   ├── SessionNotFoundError     session_not_found                 no such session for this key
    │   ├── InvalidInputError        invalid_request, invalid_config, invalid_image, payload_too_large,
    │   │                            image_too_large, unsupported_media_type, invalid_since, prompt_too_large,
    │   │                            max_seconds_over_limit, webhook_url_not_allowed
    │   ├── RoomNotFoundError        room_not_found                    the named LiveKit room does not exist
    │   ├── RoomInUseError           room_in_use                       it holds a session of the service already
    │   ├── LiveKitTokenError        livekit_token_invalid, livekit_token_refused  the caller's LiveKit token
    │   ├── TokenError               token_scope, origin_not_allowed, token_bounds, token_exhausted,
    │   │                            tokens_not_configured             a client/session token cannot do this
    │   ├── RateLimitedError         queue_full, quota_exceeded, too_many_viewers  (`retry_after`: Retry-After)
    │   ├── UnavailableError         draining, not_ready, admission_unavailable
    │   ├── SessionNotRunningError   session_not_running, session_on_other_replica, session_queued
    │   ├── SessionStartError        session_failed                    admitted, but it could not be started
    │   └── RecordingError           recording_not_found, recording_failed, recording_in_progress,
    │                                recording_not_configured          a session's recording cannot be had (yet)
    ├── UnreachableError             the service could not be reached (connection refused, timed out)
    ├── SessionEndedError            the session ended (closed, failed, expired, cancelled) before it could stream
    ├── ConnectError                 joining the session's transport failed (no answer, nothing connected)
    └── ControlRefusedError          a command sent as a LiveKit RPC was refused; `code` (control protocol's)

`api_error(status, code, message, retry_after)` picks the class by `code`; a code this client does not know yet
becomes a plain `ApiError` with that code, so a newer service never breaks an older client. Match on the class for
what you handle, and on `code` for the exact reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "ApiError",
    "ClientError",
    "ConnectError",
    "ControlRefusedError",
    "InvalidInputError",
    "LiveKitTokenError",
    "RateLimitedError",
    "RecordingError",
    "RoomInUseError",
    "RoomNotFoundError",
    "SessionEndedError",
    "SessionNotFoundError",
    "SessionNotRunningError",
    "SessionStartError",
    "TokenError",
    "UnauthorizedError",
    "UnavailableError",
    "UnreachableError",
    "api_error",
    "error_classes",
]


class ClientError(Exception):
    """Root of every error the client raises."""


class ApiError(ClientError):
    """The service answered with an error: `status` (HTTP), `code` (stable, docs/api.md), `message` (for humans)."""

    def __init__(self, status: int, code: str, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after


class UnauthorizedError(ApiError):
    """`unauthorized`: API keys are configured and this client's is missing or unknown (`viewer_token_expired`,
    `viewer_token_invalid`: a viewer's credential is)."""


class SessionNotFoundError(ApiError):
    """`session_not_found`: no such session for this key (another key's session answers the same)."""


class InvalidInputError(ApiError):
    """The request was refused for its content; `code` says which rule (see the class tree above)."""


class RoomNotFoundError(ApiError):
    """`room_not_found`: the create named a LiveKit room that does not exist."""


class RoomInUseError(ApiError):
    """`room_in_use`: the named LiveKit room already holds a session of this service."""


class LiveKitTokenError(ApiError):
    """`livekit_token_invalid` (the create's `livekit.url`/`livekit.token` cannot work, checked before it queued) or
    `livekit_token_refused` (the LiveKit server refused the token when the service joined)."""


class TokenError(ApiError):
    """A valid client, session or watch token that cannot do this: outside its scope or bounds, from an origin it
    does not allow, its creates used up, or no token secret configured on the service (docs/integrate.md)."""


class RateLimitedError(ApiError):
    """`queue_full`, `quota_exceeded` or `too_many_viewers`: try again later, in `retry_after` seconds when the
    service said (None otherwise)."""


class UnavailableError(ApiError):
    """`draining`, `not_ready` or `admission_unavailable`: this instance cannot take the request now."""


class SessionNotRunningError(ApiError):
    """A transport route for a session that does not stream (here), or a pause/resume of one that does not run:
    `session_not_running`, `session_on_other_replica`, `session_queued`."""


class SessionStartError(ApiError):
    """`session_failed`: admitted, but the model worker or the transport could not start it."""


class RecordingError(ApiError):
    """A session's recording is not there: `recording_not_found`, `recording_failed`, `recording_in_progress`,
    `recording_not_configured`."""


class UnreachableError(ClientError):
    """The service could not be reached (refused, reset, timed out); the message names the URL."""


class SessionEndedError(ClientError):
    """The session reached a terminal status while the client waited for it to stream.

    `status` is `closed`, `failed`, `expired` or `cancelled`; `reason` the session's reason; `code` and `message`
    its error when it failed (None otherwise)."""

    def __init__(
        self, session_id: str, status: str, reason: str | None, code: str | None = None, message: str | None = None
    ) -> None:
        why = f"{status} ({reason})" if reason else status
        detail = f": {code}: {message}" if code else ""
        super().__init__(f"session {session_id} ended: {why}{detail}")
        self.session_id = session_id
        self.status = status
        self.reason = reason
        self.code = code
        self.message = message


class ConnectError(ClientError):
    """Joining the session's transport failed: the offer was refused, the data channel or the LiveKit room did not
    connect in time. An `ApiError` from the offer route is raised as itself."""


class ControlRefusedError(ClientError):
    """The session refused a command sent as a LiveKit RPC (`pause`, `prompt`, ...): `code` is the stable code of
    the control protocol or the REST error table (`rate_limited`, `session_not_running`, `not_controller`, ...),
    `message` the service's sentence, `rpc_code` the RPC error's number (docs/livekit.md's table)."""

    def __init__(self, code: str, message: str, rpc_code: int) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.rpc_code = rpc_code


_BY_CODE: Mapping[str, type[ApiError]] = MappingProxyType(
    {
        "unauthorized": UnauthorizedError,
        "viewer_token_expired": UnauthorizedError,
        "viewer_token_invalid": UnauthorizedError,
        "token_invalid": UnauthorizedError,
        "token_expired": UnauthorizedError,
        "token_revoked": UnauthorizedError,
        "token_scope": TokenError,
        "origin_not_allowed": TokenError,
        "token_bounds": TokenError,
        "token_exhausted": TokenError,
        "tokens_not_configured": TokenError,
        "session_not_found": SessionNotFoundError,
        "invalid_request": InvalidInputError,
        "invalid_config": InvalidInputError,
        "invalid_image": InvalidInputError,
        "payload_too_large": InvalidInputError,
        "image_too_large": InvalidInputError,
        "unsupported_media_type": InvalidInputError,
        "invalid_since": InvalidInputError,
        "prompt_too_large": InvalidInputError,
        "max_seconds_over_limit": InvalidInputError,
        "webhook_url_not_allowed": InvalidInputError,
        "room_not_found": RoomNotFoundError,
        "room_in_use": RoomInUseError,
        "livekit_token_invalid": LiveKitTokenError,
        "livekit_token_refused": LiveKitTokenError,
        "queue_full": RateLimitedError,
        "quota_exceeded": RateLimitedError,
        "too_many_viewers": RateLimitedError,
        "draining": UnavailableError,
        "not_ready": UnavailableError,
        "admission_unavailable": UnavailableError,
        "session_not_running": SessionNotRunningError,
        "session_on_other_replica": SessionNotRunningError,
        "session_queued": SessionNotRunningError,
        "session_failed": SessionStartError,
        "recording_not_found": RecordingError,
        "recording_failed": RecordingError,
        "recording_in_progress": RecordingError,
        "recording_not_configured": RecordingError,
    }
)


def error_classes() -> Mapping[str, type[ApiError]]:
    """The stable codes this client maps to a class of its own (others are plain `ApiError`)."""
    return _BY_CODE


def api_error(status: int, code: str, message: str, *, retry_after: float | None = None) -> ApiError:
    """The typed exception for an error answer (see the module docstring)."""
    cls = _BY_CODE.get(code, ApiError)
    return cls(status, code, message, retry_after=retry_after)
