"""The embedded WebRTC transport's configuration (`EmbeddedConfig`), validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

from transport.config import (
    DEFAULT_JOIN_TTL,
    check_idle_frame_interval,
    check_max_viewers,
    check_status_max_bytes,
    positive_seconds,
)
from transport.errors import TransportConfigError
from transport.protocol import MAX_STATUS_BYTES
from transport.session.viewers import DEFAULT_MAX_VIEWERS

__all__ = ["EmbeddedConfig"]


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
    stream stays idle (0, the default: off; `transport.session.pacing`, keep-warm).
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
            positive_seconds(name, getattr(self, name))
        positive_seconds("viewer_join_ttl", self.viewer_join_ttl)
        check_max_viewers(self.max_viewers)
        check_idle_frame_interval(self.idle_frame_interval)
        if "{session_id}" not in self.watch_path:
            raise TransportConfigError(f"watch_path must contain {{session_id}}, got {self.watch_path!r}")
        if self.ice_host_addresses is not None and not self.ice_host_addresses:
            raise TransportConfigError("ice_host_addresses must name at least one address (or be None)")
        if "{session_id}" not in self.offer_path:
            raise TransportConfigError(f"offer_path must contain {{session_id}}, got {self.offer_path!r}")
        if self.max_offer_bytes < 1024:
            raise TransportConfigError(f"max_offer_bytes must be at least 1024, got {self.max_offer_bytes}")
        check_status_max_bytes(self.status_max_bytes)
        if not self.control_label:
            raise TransportConfigError("control_label must not be empty")
        if self.status_buffer_bytes < self.status_max_bytes:
            raise TransportConfigError(
                f"status_buffer_bytes must be at least status_max_bytes ({self.status_max_bytes}), "
                f"got {self.status_buffer_bytes}"
            )
