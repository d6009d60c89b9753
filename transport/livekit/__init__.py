"""The LiveKit transport: one room per session (or the caller's room), the service participant that publishes the
video and takes control packets and RPC calls, tokens, the RoomService client, webhooks and room events, its
config, a caller-minted token's reader and the service participant's attributes. Importing it never loads the
`livekit.rtc` native library (loaded on first use, on the event loop), so it is safe before a fork. The LiveKit
Agents integration (`transport.livekit.agents.WorldSession`) is imported from its module, not from here: it belongs
to an agent's process and brings the REST client along."""

from __future__ import annotations

from transport.livekit.attributes import AttributeCoalescer, AttributeStatistics
from transport.livekit.binding import ControllerPresence, LiveKitBindingStatistics, LiveKitSessionBinding
from transport.livekit.caller_tokens import CallerToken, caller_url_allowed, read_caller_token
from transport.livekit.config import LIVEKIT_IDLE_FRAME_INTERVAL, LiveKitConfig
from transport.livekit.events import ParticipantJoined, ParticipantLeft, RoomEvent, RoomFinished
from transport.livekit.room import (
    OVER_DISCONNECT_REASONS,
    LiveKitRoom,
    LiveKitVideo,
    LocalParticipantHandle,
    LocalVideo,
    Room,
    RoomConnectionState,
    RoomFactory,
    RoomJoinOptions,
    RpcFailure,
    RpcHandler,
    VideoPublishOptions,
)
from transport.livekit.rooms import ParticipantEntry, RoomAdmin, RoomConfig, RoomInfo, RoomManager
from transport.livekit.rpc import NOT_CONTROLLER, RPC_ERROR_CODES, RPC_METHODS, ControlRpc, rpc_error_code
from transport.livekit.tokens import IssuedToken, ParticipantRole, TokenIssuer, room_name_for
from transport.livekit.transport import LiveKitTransport, LiveKitTransportStatistics
from transport.livekit.webhooks import WebhookHandler

__all__ = [
    "LIVEKIT_IDLE_FRAME_INTERVAL",
    "NOT_CONTROLLER",
    "OVER_DISCONNECT_REASONS",
    "RPC_ERROR_CODES",
    "RPC_METHODS",
    "AttributeCoalescer",
    "AttributeStatistics",
    "CallerToken",
    "ControlRpc",
    "ControllerPresence",
    "IssuedToken",
    "LiveKitBindingStatistics",
    "LiveKitConfig",
    "LiveKitRoom",
    "LiveKitSessionBinding",
    "LiveKitTransport",
    "LiveKitTransportStatistics",
    "LiveKitVideo",
    "LocalParticipantHandle",
    "LocalVideo",
    "ParticipantEntry",
    "ParticipantJoined",
    "ParticipantLeft",
    "ParticipantRole",
    "Room",
    "RoomAdmin",
    "RoomConfig",
    "RoomConnectionState",
    "RoomEvent",
    "RoomFactory",
    "RoomFinished",
    "RoomInfo",
    "RoomJoinOptions",
    "RoomManager",
    "RpcFailure",
    "RpcHandler",
    "TokenIssuer",
    "VideoPublishOptions",
    "WebhookHandler",
    "caller_url_allowed",
    "read_caller_token",
    "room_name_for",
    "rpc_error_code",
]
