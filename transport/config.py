"""What both transports' configurations share: the data topics, the join TTL, and the checks of shared fields.

Each transport's own record lives with it (`transport.livekit.config.LiveKitConfig`,
`transport.embedded.config.EmbeddedConfig`): plain frozen dataclasses the service converts its settings to once, at
start. Every field is validated on construction and a bad value raises `TransportConfigError` naming the field.
"""

from __future__ import annotations

import math

from transport.errors import TransportConfigError
from transport.protocol import MAX_STATUS_BYTES, MIN_STATUS_BYTES

__all__ = [
    "CONTROL_TOPIC",
    "DEFAULT_JOIN_TTL",
    "STATUS_TOPIC",
    "check_idle_frame_interval",
    "check_max_viewers",
    "check_status_max_bytes",
    "positive_seconds",
]

CONTROL_TOPIC = "lingstream.control"
"""LiveKit data topic of client-to-service control messages."""
STATUS_TOPIC = "lingstream.status"
"""LiveKit data topic of service-to-client status messages."""
DEFAULT_JOIN_TTL = 60.0
"""Seconds a minted join token or viewer credential admits a join."""


def check_max_viewers(value: int) -> None:
    if not 0 <= value <= 1000:
        raise TransportConfigError(f"max_viewers must be in 0..1000, got {value}")


def check_idle_frame_interval(value: float) -> None:
    if not (math.isfinite(value) and 0 <= value <= 60):
        raise TransportConfigError(f"idle_frame_interval must be in [0, 60] seconds (0: off), got {value}")


def positive_seconds(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise TransportConfigError(f"{name} must be a positive number of seconds, got {value}")


def check_status_max_bytes(value: int) -> None:
    if not MIN_STATUS_BYTES <= value <= MAX_STATUS_BYTES:
        raise TransportConfigError(f"status_max_bytes must be in {MIN_STATUS_BYTES}..{MAX_STATUS_BYTES}, got {value}")
