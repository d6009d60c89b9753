"""Binding sessions to browsers: the seam every transport shares, by role in three folders.

At the top, the thin seam: `base` (the `Transport` and `SessionPort` protocols, the status messages, the
statistics both kinds report), `protocol` (control protocol v1's JSON codec), `errors` (the one exception tree) and
`config` (the topics and checks both transports' configurations share). Below it, by role:

- `transport.session`: what binds one session whichever the transport (the binding core and its lifecycle, control
  intake, the status outbox, frame pacing, viewer places and credentials, timers);
- `transport.livekit`: the LiveKit transport (its binding, the room and rooms API, tokens, webhooks, room events, its
  config);
- `transport.embedded`: direct WebRTC between the browser and the service (aiortc: the transport, its binding,
  viewers, the RTC helpers, its config);
- `transport.client`: the Python client of the service (REST and the embedded stream).

Importing this package, or any module at its top, loads none of LiveKit, aiortc or av (a test holds it); the
service builds one transport at start (`service.transports`) and the routes ask it for capabilities
(`transport.base`), never for a class.
"""

from __future__ import annotations

from transport.base import (
    SERVICE_IDENTITY_PREFIX,
    BindingStatistics,
    CallerRoom,
    ChunkStatus,
    DoneStatus,
    ErrorStatus,
    ReconnectKind,
    SessionPort,
    StateStatus,
    StatusMessage,
    Transport,
    TransportStatistics,
    ViewerFigures,
    WarningStatus,
)
from transport.config import CONTROL_TOPIC, DEFAULT_JOIN_TTL, STATUS_TOPIC
from transport.errors import (
    ControlRejectedError,
    LinkLostError,
    RoomInUseError,
    RoomJoinError,
    RoomNotFoundError,
    RoomServiceAuthError,
    RoomServiceError,
    RoomServiceUnavailableError,
    SessionAlreadyAttachedError,
    SessionNotAttachedError,
    SignalingError,
    TooManyViewersError,
    TransportClosedError,
    TransportConfigError,
    TransportError,
    ViewerTokenError,
    ViewerTokenExpiredError,
    ViewerTokenInvalidError,
    WebhookError,
)
from transport.protocol import (
    CANONICAL_KEYS,
    KEY_ALIASES,
    MAX_INBOUND_BYTES,
    MAX_SEQ,
    MAX_STATUS_BYTES,
    PROTOCOL_VERSION,
    ControlInbox,
    InboxStatistics,
    ProtocolError,
    ProtocolErrorCode,
    decode_control,
    decode_status,
    encode_control,
    encode_status,
    error_status,
)

__all__ = [
    "CANONICAL_KEYS",
    "CONTROL_TOPIC",
    "DEFAULT_JOIN_TTL",
    "KEY_ALIASES",
    "MAX_INBOUND_BYTES",
    "MAX_SEQ",
    "MAX_STATUS_BYTES",
    "PROTOCOL_VERSION",
    "SERVICE_IDENTITY_PREFIX",
    "STATUS_TOPIC",
    "BindingStatistics",
    "CallerRoom",
    "ChunkStatus",
    "ControlInbox",
    "ControlRejectedError",
    "DoneStatus",
    "ErrorStatus",
    "InboxStatistics",
    "LinkLostError",
    "ProtocolError",
    "ProtocolErrorCode",
    "ReconnectKind",
    "RoomInUseError",
    "RoomJoinError",
    "RoomNotFoundError",
    "RoomServiceAuthError",
    "RoomServiceError",
    "RoomServiceUnavailableError",
    "SessionAlreadyAttachedError",
    "SessionNotAttachedError",
    "SessionPort",
    "SignalingError",
    "StateStatus",
    "StatusMessage",
    "TooManyViewersError",
    "Transport",
    "TransportClosedError",
    "TransportConfigError",
    "TransportError",
    "TransportStatistics",
    "ViewerFigures",
    "ViewerTokenError",
    "ViewerTokenExpiredError",
    "ViewerTokenInvalidError",
    "WarningStatus",
    "WebhookError",
    "annotations",
    "decode_control",
    "decode_status",
    "encode_control",
    "encode_status",
    "error_status",
]
