"""A small async Python client of a lingstream service (no torch): REST, queue following, and a live session over
the embedded WebRTC transport (aiortc) or LiveKit (the `livekit` SDK). docs/client.md has a complete example.

    async with ServiceClient(url, api_key=key) as service:
        info = await service.wait_streaming((await service.create(config={"fps": 16})).id)
        async with await connect(service, info) as stream:
            await stream.send_keys({"w"})
            frame = await stream.next_frame(timeout=10)   # frame.image: (h, w, 3) uint8; frame.chunk: its status
            await stream.stop()

`ServiceClient` (`api.py`) is the REST half, `LiveStream` and `connect` (`stream.py`) the media half, over a `Link`
(`links.py`: embedded WebRTC or LiveKit), its frames labelled by `ChunkTracker` (`tracker.py`); errors are typed by
the service's stable codes (`errors.py`). `verify_webhook` checks the signature of a webhook delivery
(`transport.webhook_signature`, docs/webhooks.md).
"""

from __future__ import annotations

from transport.client.api import (
    STREAMING_STATUSES,
    TERMINAL_STATUSES,
    ClientToken,
    RecordingInfo,
    ServiceClient,
    SessionInfo,
    ShareLinkInfo,
    UsageInfo,
)
from transport.client.errors import (
    ApiError,
    ClientError,
    ConnectError,
    ControlRefusedError,
    InvalidInputError,
    LiveKitTokenError,
    RateLimitedError,
    RecordingError,
    RoomInUseError,
    RoomNotFoundError,
    SessionEndedError,
    SessionNotFoundError,
    SessionNotRunningError,
    SessionStartError,
    TokenError,
    UnauthorizedError,
    UnavailableError,
    UnreachableError,
    api_error,
    error_classes,
)
from transport.client.links import CommandLink, EmbeddedLink, Link, LiveKitLink, default_ice_addresses
from transport.client.reconnect import RECONNECT_TIMEOUT, ReconnectPolicy
from transport.client.stream import LiveStream, ReceivedFrame, StreamStatistics, connect
from transport.client.tracker import ChunkTracker
from transport.webhook_signature import SIGNATURE_HEADER, WebhookSignatureError, verify_webhook

__all__ = [
    "RECONNECT_TIMEOUT",
    "SIGNATURE_HEADER",
    "STREAMING_STATUSES",
    "TERMINAL_STATUSES",
    "ApiError",
    "ChunkTracker",
    "ClientError",
    "ClientToken",
    "CommandLink",
    "ConnectError",
    "ControlRefusedError",
    "EmbeddedLink",
    "InvalidInputError",
    "Link",
    "LiveKitLink",
    "LiveKitTokenError",
    "LiveStream",
    "RateLimitedError",
    "ReceivedFrame",
    "ReconnectPolicy",
    "RecordingError",
    "RecordingInfo",
    "RoomInUseError",
    "RoomNotFoundError",
    "ServiceClient",
    "SessionEndedError",
    "SessionInfo",
    "SessionNotFoundError",
    "SessionNotRunningError",
    "SessionStartError",
    "ShareLinkInfo",
    "StreamStatistics",
    "TokenError",
    "UnauthorizedError",
    "UnavailableError",
    "UnreachableError",
    "UsageInfo",
    "WebhookSignatureError",
    "api_error",
    "connect",
    "default_ice_addresses",
    "error_classes",
    "verify_webhook",
]
