"""Session admission (layer 1) and the FIFO execution lease (layer 2) of lingstream; stdlib only.

Layer 1, `AdmissionController` (+ `AdmissionDriver`, its asyncio shell): which session holds a slot on which model
worker, a bounded FIFO for the rest, queue and heartbeat timeouts, drain and worker health. Layer 2,
`ExecutionLease` (+ `LeaseCore`): which admitted session may run its next chunk on one model worker, strictly FIFO.
"""

from __future__ import annotations

from admission.clock import Clock, MonotonicClock
from admission.config import AdmissionConfig, AdmissionStatistics
from admission.controller import AdmissionController, AdmissionListener
from admission.driver import AdmissionDriver
from admission.errors import (
    AdmissionClosedError,
    AdmissionConfigError,
    AdmissionError,
    AdmissionInvariantError,
    IllegalTransitionError,
    LeaseAlreadyRequestedError,
    LeaseError,
    LeaseSessionRemovedError,
    TicketExistsError,
    UnknownTicketError,
    UnknownWorkerError,
)
from admission.lease import ExecutionLease, LeaseCore, LeaseStatistics
from admission.quota import UNLIMITED, KeyQuota, quota_verdict
from admission.summary import DurationSummary, PercentileMethod, RingBufferSummary, percentile
from admission.ticket import (
    INITIAL_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    AdmissionEvent,
    AdmissionEventKind,
    TicketReason,
    TicketState,
    TicketView,
    require_transition,
)

__all__ = [
    "INITIAL_STATES",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "UNLIMITED",
    "AdmissionClosedError",
    "AdmissionConfig",
    "AdmissionConfigError",
    "AdmissionController",
    "AdmissionDriver",
    "AdmissionError",
    "AdmissionEvent",
    "AdmissionEventKind",
    "AdmissionInvariantError",
    "AdmissionListener",
    "AdmissionStatistics",
    "Clock",
    "DurationSummary",
    "ExecutionLease",
    "IllegalTransitionError",
    "KeyQuota",
    "LeaseAlreadyRequestedError",
    "LeaseCore",
    "LeaseError",
    "LeaseSessionRemovedError",
    "LeaseStatistics",
    "MonotonicClock",
    "PercentileMethod",
    "RingBufferSummary",
    "TicketExistsError",
    "TicketReason",
    "TicketState",
    "TicketView",
    "UnknownTicketError",
    "UnknownWorkerError",
    "percentile",
    "quota_verdict",
    "require_transition",
]
