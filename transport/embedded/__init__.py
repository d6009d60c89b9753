"""The embedded transport: direct WebRTC between the browser and the service (aiortc) — the transport that answers
offers, each session's binding, its viewers, the RTC helpers (paced video track, host candidates) and its config."""

from __future__ import annotations

from transport.embedded.binding import EmbeddedBindingStatistics, EmbeddedSessionBinding, PeerPresence
from transport.embedded.config import EmbeddedConfig
from transport.embedded.rtc import PacedVideoTrack, ice_host_addresses
from transport.embedded.transport import EmbeddedTransport, EmbeddedTransportStatistics
from transport.embedded.viewers import VIEWER_CANNOT_CONTROL, EmbeddedViewers, EmbeddedViewersStatistics

__all__ = [
    "VIEWER_CANNOT_CONTROL",
    "EmbeddedBindingStatistics",
    "EmbeddedConfig",
    "EmbeddedSessionBinding",
    "EmbeddedTransport",
    "EmbeddedTransportStatistics",
    "EmbeddedViewers",
    "EmbeddedViewersStatistics",
    "PacedVideoTrack",
    "PeerPresence",
    "ice_host_addresses",
]
