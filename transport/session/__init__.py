"""What binds one session to a client whichever the transport: the binding core and its lifecycle, control
intake, the status outbox, frame pacing, viewer places and credentials, and timers. Loads neither LiveKit nor
aiortc."""

from __future__ import annotations

from transport.session.binding import (
    TERMINAL_BINDING_STATES,
    BindingCore,
    BindingCoreStatistics,
    BindingLifecycle,
    BindingSettings,
    BindingState,
    DeliverFrame,
    EncodeStatus,
    TransitionTable,
)
from transport.session.control import CallAnswer, CallRefusal, ControlIntake, ControlStatistics
from transport.session.outbox import Outbound, OutboxStatistics, StatusOutbox
from transport.session.pacing import (
    FramePacer,
    FrameSink,
    PacedFrame,
    PacerStatistics,
    PacingConfig,
    PacingCore,
    SendFrame,
    WaitUntil,
)
from transport.session.timers import GraceTimer, LoopTimers, TimerHandle, Timers
from transport.session.viewers import (
    DEFAULT_MAX_VIEWERS,
    ViewerCredential,
    ViewerCredentials,
    ViewerSeats,
    ViewerStatistics,
)

__all__ = [
    "DEFAULT_MAX_VIEWERS",
    "TERMINAL_BINDING_STATES",
    "BindingCore",
    "BindingCoreStatistics",
    "BindingLifecycle",
    "BindingSettings",
    "BindingState",
    "CallAnswer",
    "CallRefusal",
    "ControlIntake",
    "ControlStatistics",
    "DeliverFrame",
    "EncodeStatus",
    "FramePacer",
    "FrameSink",
    "GraceTimer",
    "LoopTimers",
    "Outbound",
    "OutboxStatistics",
    "PacedFrame",
    "PacerStatistics",
    "PacingConfig",
    "PacingCore",
    "SendFrame",
    "StatusOutbox",
    "TimerHandle",
    "Timers",
    "TransitionTable",
    "ViewerCredential",
    "ViewerCredentials",
    "ViewerSeats",
    "ViewerStatistics",
    "WaitUntil",
]
