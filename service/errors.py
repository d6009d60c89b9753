"""The service's errors and the only table from an exception to an HTTP status and a stable error code.

    ServiceError
    ├── InvalidRequestError          422 invalid_request         the request is malformed (JSON, fields, base64)
    ├── InvalidConfigError           422 invalid_config          the model worker rejected the session config
    ├── PromptTooLargeError          422 prompt_too_large        a prompt over 512 UTF-8 bytes
    ├── MaxSecondsTooLargeError      422 max_seconds_over_limit  max_seconds above LINGSTREAM_MAX_SESSION_SECONDS
    ├── PayloadTooLargeError         413 payload_too_large       the request body exceeds MAX_REQUEST_BYTES
    ├── ImageTooLargeError           413 image_too_large         the image exceeds MAX_IMAGE_BYTES or MAX_IMAGE_PIXELS
    ├── UnsupportedMediaTypeError    415 unsupported_media_type  not JSON, or an image format that cannot be read
    ├── UnauthorizedError            401 unauthorized            no or an unknown bearer key
    │   ├── TokenInvalidError        401 token_invalid           a client, session or watch token that is
    │   │                                                       malformed, forged, signed with an unknown secret,
    │   │                                                       or issued by a key no longer configured
    │   ├── TokenExpiredError        401 token_expired           a genuine token past its time (or its session's)
    │   └── TokenRevokedError        401 token_revoked           a share link's watch token revoked by its owner
    ├── TokenScopeError              403 token_scope             a token used for what its kind does not allow (a
    │                                                           session token listing sessions, minting tokens...)
    ├── OriginNotAllowedError        403 origin_not_allowed      a token bound to origins, used from another Origin
    ├── TokenBoundsError             403 token_bounds            a create asking for more than its client token
    │                                                           allows (max_seconds, record)
    ├── TokenExhaustedError          403 token_exhausted         a client token that made its N sessions already
    ├── TokensNotConfiguredError     404 tokens_not_configured   tokens asked for without LINGSTREAM_TOKEN_SECRET (the
    │                                                           capability is not there, as TransportFeatureError)
    ├── ForbiddenError               403 forbidden               an internal endpoint called from off the host
    ├── SessionNotFoundError         404 session_not_found       no such session for this key
    ├── TransportFeatureError        404 not_found               a transport route whose capability the active
    │                                                           transport lacks (webhooks without LiveKit, ...)
    ├── QueueFullError               429 queue_full              the admission queue is full (with Retry-After)
    ├── QuotaExceededError           429 quota_exceeded          the API key is at its max_running or max_queued
    ├── InvalidUsageQueryError       422 invalid_since           `GET /v1/usage?since=` is not a time, or is ahead
    ├── DrainingError                503 draining               the instance is draining and admits nobody
    ├── NotReadyError                503 not_ready              the instance is starting or its model workers are down
    ├── AdmissionUnavailableError    503 admission_unavailable  a shared admission backend cannot be reached
    ├── NotTicketOwnerError          500 internal               a replica released or published a shared session it
    │                                                           does not hold (a routing bug)
    ├── SessionElsewhereError        409 session_on_other_replica  a transport route sent to a replica that does
    │                                                               not run the session (it names the one that does)
    ├── RecordingNotConfiguredError  422 recording_not_configured  `"record": true` without RECORDINGS_DIR
    ├── WebhookUrlRefusedError       422 webhook_url_not_allowed  a create's webhook_url outside the allowed
    │                                                             prefixes, or resolving to an internal address
    ├── RecordingNotFoundError       404 recording_not_found    the session was not recorded here (or the file was
    │                                                           removed by retention)
    ├── RecordingFailedError         404 recording_failed       the recording stopped (write error or overrun)
    ├── RecordingInProgressError     409 recording_in_progress  the session runs, or its recording is being finalised
    ├── SessionStartError            500 session_failed         the model worker or transport failed to start it
    ├── SessionNotStreamingError     409 session_not_running    the session cannot do that now (not running, ended)
    │   └── SessionQueuedError       409 session_queued         the session still waits in the queue
    ├── SessionTransitionError       500 internal               an illegal session state move (a bug)
    ├── RuntimeTransitionError       500 internal               an illegal move of the runtime's own lifecycle (a bug)
    └── SettingsError                500 internal               invalid settings (raised at start, never served)

Every error response has one body shape, `{"error": {"code": "...", "message": "..."}}`, whoever raised it:
these errors, the admission and pipeline packages' errors, FastAPI's validation errors, 404/405 from routing, and
anything unexpected (500 `internal`, whose message never carries details). `error_table()` is the one place a
status and a code are decided; `lookup()` walks an exception's MRO, so the most specific entry wins. The entries for
`pipeline.lingbot` and `transport` errors are imported lazily (torch, aiortc), when the table is first built.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import admission.errors as admission_errors
import pipeline.errors as pipeline_errors

__all__ = [
    "AdmissionUnavailableError",
    "DrainingError",
    "ErrorSpec",
    "ForbiddenError",
    "ImageTooLargeError",
    "InvalidConfigError",
    "InvalidRequestError",
    "InvalidUsageQueryError",
    "MaxSecondsTooLargeError",
    "NotReadyError",
    "NotTicketOwnerError",
    "OriginNotAllowedError",
    "PayloadTooLargeError",
    "PromptTooLargeError",
    "QueueFullError",
    "QuotaExceededError",
    "RecordingFailedError",
    "RecordingInProgressError",
    "RecordingNotConfiguredError",
    "RecordingNotFoundError",
    "RuntimeTransitionError",
    "ServiceError",
    "SessionElsewhereError",
    "SessionNotFoundError",
    "SessionNotStreamingError",
    "SessionQueuedError",
    "SessionStartError",
    "SessionTransitionError",
    "SettingsError",
    "TokenBoundsError",
    "TokenExhaustedError",
    "TokenExpiredError",
    "TokenInvalidError",
    "TokenRevokedError",
    "TokenScopeError",
    "TokensNotConfiguredError",
    "TransportFeatureError",
    "UnauthorizedError",
    "UnsupportedMediaTypeError",
    "WebhookUrlRefusedError",
    "error_body",
    "error_table",
    "http_status_spec",
    "lookup",
    "public_message",
]

logger = logging.getLogger(__name__)


class ServiceError(Exception):
    """Root of every error the service raises. The message is safe to show to the client."""


class InvalidRequestError(ServiceError):
    """The request is malformed: not JSON, unknown or mistyped fields, bad base64."""


class InvalidConfigError(ServiceError):
    """The model worker rejected the session configuration; the message names the field."""


class PromptTooLargeError(ServiceError):
    """A text prompt (the create request's `prompt`) is longer than 512 UTF-8 bytes."""


class MaxSecondsTooLargeError(ServiceError):
    """A create request asked for `max_seconds` above the server's `LINGSTREAM_MAX_SESSION_SECONDS`."""


class PayloadTooLargeError(ServiceError):
    """The request body is larger than MAX_REQUEST_BYTES."""


class ImageTooLargeError(ServiceError):
    """The reference image has more bytes than MAX_IMAGE_BYTES or more pixels than MAX_IMAGE_PIXELS."""


class UnsupportedMediaTypeError(ServiceError):
    """The request body is not JSON, or the reference image is in a format that cannot be read."""


class UnauthorizedError(ServiceError):
    """API keys are configured and the request has no valid `Authorization: Bearer <key>` header."""


class TokenInvalidError(UnauthorizedError):
    """A bearer value that is not an API key was read as a token and refused: malformed, a bad signature, a secret
    (`kid`) this deployment does not know, or issued by an API key that is no longer configured."""


class TokenExpiredError(UnauthorizedError):
    """A genuine token whose time has passed: a client token's TTL, or a session token's session (ended longer
    ago than the reconnect grace)."""


class TokenRevokedError(UnauthorizedError):
    """A share link's watch token whose share was revoked (`DELETE /v1/sessions/{id}/viewers/{share_id}`)."""


class TokenScopeError(ServiceError):
    """A token used for something its kind does not allow: a session or watch token on a route of the key (list,
    usage, client tokens), a watch token that would steer or end its session, a client token on a session route."""


class OriginNotAllowedError(ServiceError):
    """A token bound to `origins` was presented with an `Origin` header not among them (or, for a create, with
    none)."""


class TokenBoundsError(ServiceError):
    """A create made with a client token asks for more than the token allows (`max_seconds`, `record`)."""


class TokenExhaustedError(ServiceError):
    """A client token has made as many sessions as it allows (`max_creates`, counted on every replica)."""


class TokensNotConfiguredError(ServiceError):
    """Client tokens or share links were asked for, but the deployment has no `LINGSTREAM_TOKEN_SECRET`."""


class ForbiddenError(ServiceError):
    """An internal (admin) endpoint was called from a client that is not on the host's loopback interface."""


class SessionNotFoundError(ServiceError):
    """No session with this id is visible to the caller (unknown, forgotten, or another key's session)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"no session {session_id!r}")
        self.session_id = session_id


class QueueFullError(ServiceError):
    """Every slot is taken and the admission queue is full; retry after `retry_after_s` seconds."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"the admission queue is full; retry in about {retry_after_s} s")
        self.retry_after_s = retry_after_s


class QuotaExceededError(ServiceError):
    """The caller's API key is at one of its quotas (`limit` is `max_running` or `max_queued`, `value` its bound);
    the create took no place in the queue."""

    def __init__(self, limit: str, value: int) -> None:
        meaning = _QUOTA_MEANING.get(limit, "")
        super().__init__(f"this API key is at its quota {limit}={value} ({meaning})")
        self.limit = limit
        self.value = value


_QUOTA_MEANING: Mapping[str, str] = MappingProxyType(
    {
        "max_running": "sessions running or waiting to run; a create is accepted again once one of them ends",
        "max_queued": "sessions waiting in the queue, and no slot is free now; retry once one of them is admitted",
    }
)


class InvalidUsageQueryError(ServiceError):
    """`GET /v1/usage?since=` is not an RFC 3339 time or Unix seconds, or lies in the future."""


class DrainingError(ServiceError):
    """The instance is draining (shutting down): it admits no new sessions."""


class NotReadyError(ServiceError):
    """The instance is starting, or none of its model workers is ready."""


class AdmissionUnavailableError(ServiceError):
    """The shared admission backend (Redis) cannot be reached: creates are refused, running sessions go on."""


class NotTicketOwnerError(ServiceError):
    """The shared admission backend refused a `release` or `publish_status` from a replica that does not hold the
    session's slot; only the owner may do either (a DELETE elsewhere reaches it through `request_close`)."""

    def __init__(self, ticket_id: str, replica: str | None) -> None:
        where = f"replica {replica!r}" if replica else "no replica (it is not admitted)"
        super().__init__(f"admission ticket {ticket_id!r} is held by {where}, not by this replica")
        self.ticket_id = ticket_id
        self.replica = replica


class SessionElsewhereError(ServiceError):
    """A route bound to the transport of the replica that runs the session (the WebRTC offer, viewer tokens) was
    sent to another replica; `replica` names the one that runs it (also in the `Lingstream-Replica` header)."""

    def __init__(self, session_id: str, replica: str, *, detail: str | None = None) -> None:
        super().__init__(
            f"session {session_id!r} runs on replica {replica!r}; "
            + (
                detail
                or "its transport endpoints answer only there: send this request to that replica (every other "
                "session route works on any replica)"
            )
        )
        self.session_id = session_id
        self.replica = replica


class WebhookUrlRefusedError(ServiceError):
    """A create's `webhook_url` is not allowed: no or no matching LINGSTREAM_WEBHOOK_ALLOWED_PREFIXES, not http(s),
    credentials in it, or its host resolves to an internal address (loopback, private, link-local, reserved)."""


class RecordingNotConfiguredError(ServiceError):
    """A create asked for `"record": true` but this service has no LINGSTREAM_RECORDINGS_DIR."""


class RecordingNotFoundError(ServiceError):
    """The session has no recording here: it was not recorded, ran on another replica, or retention removed it."""


class RecordingFailedError(ServiceError):
    """The session's recording stopped before it was complete (a write error, or it fell behind); nothing was kept."""


class RecordingInProgressError(ServiceError):
    """The session has not ended yet, or its recording is still being finalised: retry once it is over."""


class SessionStartError(ServiceError):
    """The session was admitted but its model worker or the transport failed to start it (GET shows it failed)."""


class SessionNotStreamingError(ServiceError):
    """The session is queued, ended, or not attached to its transport, so it cannot be joined now; or it is not
    running, so it cannot be paused or resumed now."""


class SessionQueuedError(SessionNotStreamingError):
    """The session still waits in the admission queue: it cannot be paused or resumed before it runs."""


class SessionTransitionError(ServiceError):
    """A session state move that the lifecycle table forbids; always a bug in the service."""


class RuntimeTransitionError(ServiceError):
    """A move of the runtime's own lifecycle (`service.runtime.state.RuntimeState`) that its table forbids; always a
    bug in the service."""


class TransportFeatureError(ServiceError):
    """A transport route (the WebRTC offer, viewers, LiveKit webhooks) asked the active transport for a capability it
    does not have, or no transport is enabled: the route does not exist here (404 `not_found`, as routing answers an
    unknown path). The message names what is missing."""


class SettingsError(ServiceError):
    """Invalid settings; the message is one paragraph naming the variable. Raised at start, never over HTTP."""


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    """How one exception class is answered: HTTP `status`, stable `code`, and whether the exception's message is
    shown (`expose`); a hidden message becomes a generic sentence, so server internals never leak."""

    status: int
    code: str
    expose: bool = True


_INTERNAL = ErrorSpec(500, "internal", expose=False)
_NOT_FOUND = ErrorSpec(404, "session_not_found")
_NOT_READY = ErrorSpec(503, "not_ready")
_BAD_CONFIG = ErrorSpec(422, "invalid_config")

_BASE_TABLE: Mapping[type[BaseException], ErrorSpec] = {
    # service
    ServiceError: _INTERNAL,
    InvalidRequestError: ErrorSpec(422, "invalid_request"),
    InvalidConfigError: _BAD_CONFIG,
    PromptTooLargeError: ErrorSpec(422, "prompt_too_large"),
    MaxSecondsTooLargeError: ErrorSpec(422, "max_seconds_over_limit"),
    PayloadTooLargeError: ErrorSpec(413, "payload_too_large"),
    ImageTooLargeError: ErrorSpec(413, "image_too_large"),
    UnsupportedMediaTypeError: ErrorSpec(415, "unsupported_media_type"),
    UnauthorizedError: ErrorSpec(401, "unauthorized"),
    TokenInvalidError: ErrorSpec(401, "token_invalid"),
    TokenExpiredError: ErrorSpec(401, "token_expired"),
    TokenRevokedError: ErrorSpec(401, "token_revoked"),
    TokenScopeError: ErrorSpec(403, "token_scope"),
    OriginNotAllowedError: ErrorSpec(403, "origin_not_allowed"),
    TokenBoundsError: ErrorSpec(403, "token_bounds"),
    TokenExhaustedError: ErrorSpec(403, "token_exhausted"),
    TokensNotConfiguredError: ErrorSpec(404, "tokens_not_configured"),
    ForbiddenError: ErrorSpec(403, "forbidden"),
    SessionNotFoundError: _NOT_FOUND,
    QueueFullError: ErrorSpec(429, "queue_full"),
    QuotaExceededError: ErrorSpec(429, "quota_exceeded"),
    InvalidUsageQueryError: ErrorSpec(422, "invalid_since"),
    DrainingError: ErrorSpec(503, "draining"),
    NotReadyError: _NOT_READY,
    AdmissionUnavailableError: ErrorSpec(503, "admission_unavailable"),
    NotTicketOwnerError: _INTERNAL,  # only the owner replica releases or publishes a session; anything else is a bug
    SessionStartError: ErrorSpec(500, "session_failed"),
    RecordingNotConfiguredError: ErrorSpec(422, "recording_not_configured"),
    WebhookUrlRefusedError: ErrorSpec(422, "webhook_url_not_allowed"),
    RecordingNotFoundError: ErrorSpec(404, "recording_not_found"),
    RecordingFailedError: ErrorSpec(404, "recording_failed"),
    RecordingInProgressError: ErrorSpec(409, "recording_in_progress"),
    SessionNotStreamingError: ErrorSpec(409, "session_not_running"),
    SessionQueuedError: ErrorSpec(409, "session_queued"),
    SessionElsewhereError: ErrorSpec(409, "session_on_other_replica"),
    SessionTransitionError: _INTERNAL,
    RuntimeTransitionError: _INTERNAL,
    TransportFeatureError: ErrorSpec(404, "not_found"),
    SettingsError: _INTERNAL,
    # admission: only an unknown ticket or a closed driver are expected at runtime; the rest are bugs.
    admission_errors.AdmissionError: _INTERNAL,
    admission_errors.AdmissionConfigError: _INTERNAL,
    admission_errors.UnknownTicketError: _NOT_FOUND,
    admission_errors.TicketExistsError: _INTERNAL,
    admission_errors.IllegalTransitionError: _INTERNAL,
    admission_errors.UnknownWorkerError: _INTERNAL,
    admission_errors.AdmissionClosedError: _NOT_READY,
    admission_errors.AdmissionInvariantError: _INTERNAL,
    admission_errors.LeaseError: _INTERNAL,
    admission_errors.LeaseAlreadyRequestedError: _INTERNAL,
    admission_errors.LeaseSessionRemovedError: _INTERNAL,
    # pipeline: a model worker's errors that may surface through the service.
    pipeline_errors.PipelineError: _INTERNAL,
    pipeline_errors.PipelineSpecError: _INTERNAL,
    pipeline_errors.SessionError: _INTERNAL,
    pipeline_errors.UnknownSessionError: _NOT_FOUND,
    pipeline_errors.SessionExistsError: _INTERNAL,
    pipeline_errors.SessionPoisonedError: _INTERNAL,
    pipeline_errors.SessionClosedError: _INTERNAL,
    pipeline_errors.UnknownArtifactError: _INTERNAL,
    pipeline_errors.SessionFailedError: _INTERNAL,
    pipeline_errors.SequenceError: _INTERNAL,
    pipeline_errors.StageFailedError: _INTERNAL,
    pipeline_errors.ActorDiedError: _NOT_READY,
    pipeline_errors.ActorUnavailableError: _NOT_READY,
    pipeline_errors.ChannelError: _INTERNAL,
}


def _lingbot_table() -> dict[type[BaseException], ErrorSpec]:
    """Entries for `pipeline.lingbot.errors`, imported lazily because `pipeline.lingbot` imports torch."""
    try:
        from pipeline.lingbot import errors as lingbot
        from pipeline.lingbot.models import errors as models
    except ImportError as exc:
        logger.warning("pipeline.lingbot is not importable (%s); its errors map through their base classes", exc)
        return {}
    return {
        lingbot.LingBotError: _INTERNAL,
        lingbot.ChunkContractError: _BAD_CONFIG,
        lingbot.ControlError: ErrorSpec(422, "invalid_request"),
        lingbot.SessionConfigError: _BAD_CONFIG,
        lingbot.ImageInputError: ErrorSpec(422, "invalid_image"),
        lingbot.PlacementError: _INTERNAL,
        lingbot.ModelInputError: _INTERNAL,
        lingbot.ModelSessionError: _INTERNAL,
        lingbot.CheckpointVersionError: _INTERNAL,
        models.ModelConfigError: _BAD_CONFIG,
        models.CheckpointError: _INTERNAL,
        models.ModelContextExhaustedError: ErrorSpec(500, models.CONTEXT_EXHAUSTED_REASON),
    }


def _transport_table() -> dict[type[BaseException], ErrorSpec]:
    """Entries for `transport.errors` (the SDP offer and webhook endpoints raise them), imported lazily."""
    try:
        from transport import errors as transport
    except ImportError as exc:
        logger.warning("transport.errors is not importable (%s); its errors answer 500", exc)
        return {}
    return {
        transport.TransportError: _INTERNAL,
        transport.TransportConfigError: _INTERNAL,
        transport.TransportClosedError: _NOT_READY,
        transport.SessionNotAttachedError: _NOT_FOUND,
        transport.SessionAlreadyAttachedError: _INTERNAL,
        transport.RoomServiceError: _INTERNAL,
        transport.RoomServiceAuthError: _INTERNAL,
        transport.RoomServiceUnavailableError: _NOT_READY,
        transport.RoomJoinError: _NOT_READY,
        transport.RoomNotFoundError: ErrorSpec(422, "room_not_found"),
        transport.RoomInUseError: ErrorSpec(409, "room_in_use"),
        transport.CallerTokenError: ErrorSpec(422, "livekit_token_invalid"),
        transport.CallerTokenRefusedError: ErrorSpec(422, "livekit_token_refused"),
        transport.LinkLostError: _INTERNAL,
        transport.WebhookError: ErrorSpec(401, "unauthorized"),
        transport.SignalingError: ErrorSpec(422, "invalid_request"),
        transport.TooManyViewersError: ErrorSpec(429, "too_many_viewers"),
        transport.ViewerTokenError: ErrorSpec(401, "viewer_token_invalid"),
        transport.ViewerTokenInvalidError: ErrorSpec(401, "viewer_token_invalid"),
        transport.ViewerTokenExpiredError: ErrorSpec(401, "viewer_token_expired"),
        # Raised by the service's port to its binding, answered as an `error` status there; never over HTTP.
        transport.ControlRejectedError: ErrorSpec(409, "session_not_running"),
    }


@functools.cache
def error_table() -> Mapping[type[BaseException], ErrorSpec]:
    """The whole table (built once; the app builds it at start so no request pays for the lazy imports)."""
    return MappingProxyType({**_BASE_TABLE, **_lingbot_table(), **_transport_table()})


# Statuses raised by routing itself (Starlette's HTTPException), with their codes.
_HTTP_STATUS_TABLE: Mapping[int, ErrorSpec] = {
    400: ErrorSpec(400, "bad_request"),
    401: ErrorSpec(401, "unauthorized"),
    403: ErrorSpec(403, "forbidden"),
    404: ErrorSpec(404, "not_found"),
    405: ErrorSpec(405, "method_not_allowed"),
    413: ErrorSpec(413, "payload_too_large"),
    415: ErrorSpec(415, "unsupported_media_type"),
    422: ErrorSpec(422, "invalid_request"),
}

_GENERIC_MESSAGES: Mapping[int, str] = {
    500: "internal error; the server logged the details",
    503: "the service cannot take this request now; retry later",
}


def lookup(error: BaseException) -> ErrorSpec | None:
    """The entry for `error`'s class or its nearest listed ancestor; None if nothing in its MRO is listed."""
    table = error_table()
    for cls in type(error).__mro__:
        spec = table.get(cls)
        if spec is not None:
            return spec
    return None


def http_status_spec(status: int) -> ErrorSpec:
    """The entry for a status raised by routing (404, 405, ...); unknown statuses get code `http_<status>`."""
    return _HTTP_STATUS_TABLE.get(status, ErrorSpec(status, f"http_{status}"))


def public_message(spec: ErrorSpec, error: BaseException) -> str:
    """What the client reads: the exception's message when `spec.expose`, else a generic sentence."""
    if spec.expose:
        text = str(error)
        if text:
            return text
    return _GENERIC_MESSAGES.get(spec.status, "the request failed")


def error_body(code: str, message: str) -> dict[str, dict[str, str]]:
    """The one error body shape."""
    return {"error": {"code": code, "message": message}}
