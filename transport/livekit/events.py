"""Room events the LiveKit binding acts on, whichever way they arrive.

The service participant sees participants come and go in its room (`livekit.rtc` events); LiveKit also reports
them to the service by webhook, which still works while the service participant's own connection is down. Both
paths are translated into these events, and the binding handles them idempotently (the same departure reported
twice starts one grace timer).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ParticipantJoined", "ParticipantLeft", "RoomEvent", "RoomFinished"]


@dataclass(frozen=True, slots=True)
class ParticipantJoined:
    room: str
    identity: str


@dataclass(frozen=True, slots=True)
class ParticipantLeft:
    room: str
    identity: str


@dataclass(frozen=True, slots=True)
class RoomFinished:
    """The room ended (deleted, or closed by its empty/departure timeout): the session has no room any more."""

    room: str


RoomEvent = ParticipantJoined | ParticipantLeft | RoomFinished
