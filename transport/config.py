"""The transports' configuration, as plain frozen dataclasses (the service converts its settings once, at start).

Every field is validated on construction and a bad value raises `TransportConfigError` naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from transport.errors import TransportConfigError
from transport.protocol import MAX_STATUS_BYTES, MIN_STATUS_BYTES
from transport.rooms import RoomConfig
from transport.tokens import DEFAULT_JOIN_TTL
from transport.viewers import DEFAULT_MAX_VIEWERS

__all__ = ["CONTROL_TOPIC", "LIVEKIT_IDLE_FRAME_INTERVAL", "STATUS_TOPIC", "EmbeddedConfig", "LiveKitConfig"]

CONTROL_TOPIC = "lingstream.control"
"""LiveKit data topic of client-to-service control messages."""
STATUS_TOPIC = "lingstream.status"
"""LiveKit data topic of service-to-client status messages."""
LIVEKIT_IDLE_FRAME_INTERVAL = 0.1
"""LiveKit's default keep-warm: seconds an idle stream goes without a frame before the last one is published again
(0 turns it off). The embedded transport's default is off: measured with Chromium, its receiver shows the first
frame after a silent gap at once, and low-rate repeats only delay it (README, Key-to-photon)."""


def _check_max_viewers(value: int) -> None:
    if not 0 <= value <= 1000:
        raise TransportConfigError(f"max_viewers must be in 0..1000, got {value}")


def _check_idle_frame_interval(value: float) -> None:
    if not (math.isfinite(value) and 0 <= value <= 60):
        raise TransportConfigError(f"idle_frame_interval must be in [0, 60] seconds (0: off), got {value}")


def _positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise TransportConfigError(f"{name} must be a positive number of seconds, got {value}")


@dataclass(frozen=True, slots=True)
class LiveKitConfig:
    """The LiveKit transport.

    `url`: where the service participant and the RoomService API reach the server (ws(s):// or http(s)://).
    `client_url`: the URL browsers are told to join (defaults to `url`; differs when the service reaches LiveKit
    on an internal address). `join_ttl`: seconds a minted join token admits a join. `reconnect_grace`: seconds a
    departed controller has to come back before the session closes. `initial_join_timeout`: seconds the
    controller has to join at all. `codec`/`max_bitrate`: the published video track (its `max_framerate` is the
    session's fps). `rejoin_attempts`/`rejoin_backoff`: how the service participant rejoins after losing its
    connection (backoff doubles per attempt, capped at 5 s). `lossy_max_bytes`: a chunk status up to this size
    goes as a lossy packet (one MTU); bigger ones, and every discrete message, go reliable.
    `status_flush_timeout`: on detach, seconds to wait for the last status messages (the final `done`) to go out.
    `max_viewers`: viewers a session's room may have at once (0: none). `idle_frame_interval`: seconds without a
    frame after which the last one is published again, and how often while the stream stays idle (0: off;
    `transport.pacing`, keep-warm; default `LIVEKIT_IDLE_FRAME_INTERVAL`).
    """

    url: str
    api_key: str
    api_secret: str = field(repr=False)
    client_url: str | None = None
    join_ttl: float = DEFAULT_JOIN_TTL
    reconnect_grace: float = 20.0
    initial_join_timeout: float = 60.0
    codec: Literal["vp8", "h264"] = "vp8"
    max_bitrate: int = 1_500_000
    room: RoomConfig = field(default_factory=RoomConfig)
    room_prefix: str = "lingstream-"
    track_name: str = "lingstream-video"
    connect_timeout: float = 10.0
    rejoin_attempts: int = 5
    rejoin_backoff: float = 0.5
    control_topic: str = CONTROL_TOPIC
    status_topic: str = STATUS_TOPIC
    lossy_max_bytes: int = 1200
    status_max_bytes: int = MAX_STATUS_BYTES
    status_flush_timeout: float = 0.5
    ring_frames: int = 32
    reanchor_after: float = 0.5
    idle_frame_interval: float = LIVEKIT_IDLE_FRAME_INTERVAL
    max_viewers: int = DEFAULT_MAX_VIEWERS

    def __post_init__(self) -> None:
        _check_max_viewers(self.max_viewers)
        _check_idle_frame_interval(self.idle_frame_interval)
        if not self.url:
            raise TransportConfigError("LiveKit url must be set")
        if not self.api_key or not self.api_secret:
            raise TransportConfigError("LiveKit api_key and api_secret must both be set")
        for name in ("join_ttl", "reconnect_grace", "initial_join_timeout", "connect_timeout", "status_flush_timeout"):
            _positive(name, getattr(self, name))
        if self.rejoin_backoff < 0:
            raise TransportConfigError(f"rejoin_backoff must not be negative, got {self.rejoin_backoff}")
        if self.codec not in ("vp8", "h264"):
            raise TransportConfigError(f"codec must be 'vp8' or 'h264', got {self.codec!r}")
        if self.max_bitrate < 10_000:
            raise TransportConfigError(f"max_bitrate must be at least 10000 bit/s, got {self.max_bitrate}")
        if self.rejoin_attempts < 0:
            raise TransportConfigError(f"rejoin_attempts must not be negative, got {self.rejoin_attempts}")
        if not MIN_STATUS_BYTES <= self.status_max_bytes <= MAX_STATUS_BYTES:
            raise TransportConfigError(
                f"status_max_bytes must be in {MIN_STATUS_BYTES}..{MAX_STATUS_BYTES}, got {self.status_max_bytes}"
            )
        if not 0 <= self.lossy_max_bytes <= self.status_max_bytes:
            raise TransportConfigError(f"lossy_max_bytes must be in 0..status_max_bytes, got {self.lossy_max_bytes}")
        if self.control_topic == self.status_topic:
            raise TransportConfigError("control_topic and status_topic must differ")

    @property
    def join_url(self) -> str:
        return self.client_url or self.url


@dataclass(frozen=True, slots=True)
class EmbeddedConfig:
    """The embedded WebRTC transport (aiortc).

    `ice_host_addresses`: the local addresses host candidates are gathered on. The default, loopback only, suits
    tests and a browser on the same machine; a deployment lists the address browsers can reach (e.g. the pod's
    IP), or sets None for aioice's default (every interface except loopback). `ice_servers`: STUN/TURN URLs
    (none by default: nothing outside is contacted). `offer_path`: the REST path of the SDP offer, with a
    `{session_id}` placeholder. `answer_timeout`: seconds to answer an offer (candidate gathering included).
    `status_flush_timeout`: on detach, seconds to wait for the last status messages (the final `done`) to go out.
    `status_buffer_bytes`: the most status bytes the data channel may hold unsent (its `bufferedAmount`); while a
    client does not consume them, further status messages are dropped and counted instead of piling up (for the
    controller and each viewer alike). `max_viewers`: viewers a session may have at once (0: none);
    `viewer_join_ttl`: seconds a viewer credential admits an offer; `watch_path`: the REST path of a viewer's offer.
    `idle_frame_interval`: seconds without a frame after which the last one is sent again, and how often while the
    stream stays idle (0, the default: off; `transport.pacing`, keep-warm).
    """

    ice_host_addresses: tuple[str, ...] | None = ("127.0.0.1",)
    ice_servers: tuple[str, ...] = ()
    reconnect_grace: float = 20.0
    initial_join_timeout: float = 60.0
    offer_path: str = "/v1/sessions/{session_id}/webrtc"
    max_offer_bytes: int = 64 * 1024
    answer_timeout: float = 10.0
    control_label: str = "control"
    status_max_bytes: int = MAX_STATUS_BYTES
    status_flush_timeout: float = 0.5
    status_buffer_bytes: int = 64 * 1024
    ring_frames: int = 32
    reanchor_after: float = 0.5
    idle_frame_interval: float = 0.0
    max_viewers: int = DEFAULT_MAX_VIEWERS
    viewer_join_ttl: float = DEFAULT_JOIN_TTL
    watch_path: str = "/v1/sessions/{session_id}/watch"

    def __post_init__(self) -> None:
        for name in ("reconnect_grace", "initial_join_timeout", "answer_timeout", "status_flush_timeout"):
            _positive(name, getattr(self, name))
        _positive("viewer_join_ttl", self.viewer_join_ttl)
        _check_max_viewers(self.max_viewers)
        _check_idle_frame_interval(self.idle_frame_interval)
        if "{session_id}" not in self.watch_path:
            raise TransportConfigError(f"watch_path must contain {{session_id}}, got {self.watch_path!r}")
        if self.ice_host_addresses is not None and not self.ice_host_addresses:
            raise TransportConfigError("ice_host_addresses must name at least one address (or be None)")
        if "{session_id}" not in self.offer_path:
            raise TransportConfigError(f"offer_path must contain {{session_id}}, got {self.offer_path!r}")
        if self.max_offer_bytes < 1024:
            raise TransportConfigError(f"max_offer_bytes must be at least 1024, got {self.max_offer_bytes}")
        if not MIN_STATUS_BYTES <= self.status_max_bytes <= MAX_STATUS_BYTES:
            raise TransportConfigError(
                f"status_max_bytes must be in {MIN_STATUS_BYTES}..{MAX_STATUS_BYTES}, got {self.status_max_bytes}"
            )
        if not self.control_label:
            raise TransportConfigError("control_label must not be empty")
        if self.status_buffer_bytes < self.status_max_bytes:
            raise TransportConfigError(
                f"status_buffer_bytes must be at least status_max_bytes ({self.status_max_bytes}), "
                f"got {self.status_buffer_bytes}"
            )
