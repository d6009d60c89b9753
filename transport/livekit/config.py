"""The LiveKit transport's configuration (`LiveKitConfig`), validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from transport.config import (
    CONTROL_TOPIC,
    DEFAULT_JOIN_TTL,
    STATUS_TOPIC,
    check_idle_frame_interval,
    check_max_viewers,
    check_status_max_bytes,
    positive_seconds,
)
from transport.errors import TransportConfigError
from transport.livekit.attributes import ATTRIBUTE_BURST, ATTRIBUTE_INTERVAL
from transport.livekit.rooms import RoomConfig, room_capacity
from transport.protocol import MAX_STATUS_BYTES
from transport.session.viewers import DEFAULT_MAX_VIEWERS

__all__ = ["LIVEKIT_IDLE_FRAME_INTERVAL", "LiveKitConfig"]

LIVEKIT_IDLE_FRAME_INTERVAL = 0.1
"""LiveKit's default keep-warm: seconds an idle stream goes without a frame before the last one is published again
(0 turns it off). The embedded transport's default is off: measured with Chromium, its receiver shows the first
frame after a silent gap at once, and low-rate repeats only delay it (README, Key-to-photon)."""


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
    `transport.session.pacing`, keep-warm; default `LIVEKIT_IDLE_FRAME_INTERVAL`).

    `caller_urls`: the LiveKit servers a create's caller-minted token may send the service to (patterns, see
    `transport.livekit.caller_tokens.caller_url_allowed`; the service's own `url` and `client_url` are always
    allowed). With no project (`url`, `api_key`, `api_secret` all empty) the transport joins callers' rooms with
    their tokens only, and `caller_urls` must name at least one server. `attribute_burst`/`attribute_interval`:
    how often the service participant's attributes may change (`transport.livekit.attributes`).
    """

    url: str
    api_key: str
    api_secret: str = field(repr=False)
    caller_urls: tuple[str, ...] = ()
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
    attribute_burst: int = ATTRIBUTE_BURST
    attribute_interval: float = ATTRIBUTE_INTERVAL

    def __post_init__(self) -> None:
        check_max_viewers(self.max_viewers)
        capacity = room_capacity(self.max_viewers)
        if self.room.max_participants != 0 and self.room.max_participants < capacity:
            raise TransportConfigError(
                f"room max_participants {self.room.max_participants} is below what {self.max_viewers} viewers need "
                f"({capacity}: the controller and the viewers)"
            )
        check_idle_frame_interval(self.idle_frame_interval)
        project = (bool(self.url), bool(self.api_key), bool(self.api_secret))
        if not any(project):
            if not self.caller_urls:
                raise TransportConfigError(
                    "LiveKit needs a project (url, api_key, api_secret) or caller_urls (callers' tokens only)"
                )
        elif not self.url:
            raise TransportConfigError("LiveKit url must be set")
        elif not self.api_key or not self.api_secret:
            raise TransportConfigError("LiveKit api_key and api_secret must both be set")
        for name in ("join_ttl", "reconnect_grace", "initial_join_timeout", "connect_timeout", "status_flush_timeout"):
            positive_seconds(name, getattr(self, name))
        if self.rejoin_backoff < 0:
            raise TransportConfigError(f"rejoin_backoff must not be negative, got {self.rejoin_backoff}")
        if self.codec not in ("vp8", "h264"):
            raise TransportConfigError(f"codec must be 'vp8' or 'h264', got {self.codec!r}")
        if self.max_bitrate < 10_000:
            raise TransportConfigError(f"max_bitrate must be at least 10000 bit/s, got {self.max_bitrate}")
        if self.rejoin_attempts < 0:
            raise TransportConfigError(f"rejoin_attempts must not be negative, got {self.rejoin_attempts}")
        check_status_max_bytes(self.status_max_bytes)
        if not 0 <= self.lossy_max_bytes <= self.status_max_bytes:
            raise TransportConfigError(f"lossy_max_bytes must be in 0..status_max_bytes, got {self.lossy_max_bytes}")
        if self.control_topic == self.status_topic:
            raise TransportConfigError("control_topic and status_topic must differ")

    @property
    def has_project(self) -> bool:
        """Whether the service has a LiveKit project of its own (rooms, tokens, webhooks), not only callers'."""
        return bool(self.url)

    @property
    def join_url(self) -> str:
        return self.client_url or self.url
