"""The vocabulary of the scheduling core: the session lifecycle and the records `SchedulerCore` trades with its driver.

`PipelineSessionState` is a session's lifecycle with its transition table (the diagram is in `pipeline.core.scheduler`'s
docstring); `CloseMode` says how a close treats queued work (the model-worker seam, `pipeline.bidirectional`,
re-exports it: its closes mean the same; defined here, it keeps `pipeline.core` free of imports back up the
package). The core answers the driver's events with `Dispatch` records to start and `Notice` records of what
changed, classifies every stage result with a `ResultKind`, hands readable outputs over as `OutputItem`s, and
reports a finished release as a `CloseReport`; `CoreStatistics` is its frozen snapshot, and `ActorView` the seam
through which it reads the actors. `pipeline` and `pipeline.core` re-export them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from pipeline.actor import StageCall

__all__ = [
    "ActorView",
    "CloseMode",
    "CloseReport",
    "CoreStatistics",
    "Dispatch",
    "Notice",
    "NoticeKind",
    "OutputItem",
    "PipelineSessionState",
    "ResultKind",
]


class CloseMode(enum.Enum):
    """How a close treats a session's work: the one close mode of the scheduling core's session, of the
    orchestrator's and of a model worker's (`pipeline.core` and `pipeline.bidirectional` re-export it)."""

    DRAIN = "drain"  # deliver what was accepted (the chunk in progress, every accepted sequence), then close
    CANCEL = "cancel"  # discard queued work, wait for the calls in flight (their results dropped), then close


class PipelineSessionState(enum.Enum):
    OPEN = "open"  # accepting input
    DRAINING = "draining"  # no new input; every accepted sequence runs through to the outputs
    CANCELLING = "cancelling"  # no new input; queued work discarded; in-flight calls finish, results dropped
    FAILED = "failed"  # a stage failed or its actor died; queued work discarded; waiting to release
    RELEASING = "releasing"  # stage-owned state is being released through the owning actors
    CLOSED = "closed"  # released cleanly; the id may be used again
    POISONED = "poisoned"  # a release failed; the id stays unusable until a retry of the failed stages succeeds

    # Members are singletons compared by identity, so the identity hash is consistent; Enum's own hashes the name in
    # Python, which the scheduler pays on every membership test (`ACCEPTS_RESULTS`) of every event.
    __hash__ = object.__hash__


SESSION_TRANSITIONS: Mapping[PipelineSessionState, frozenset[PipelineSessionState]] = {
    PipelineSessionState.OPEN: frozenset(
        {PipelineSessionState.DRAINING, PipelineSessionState.CANCELLING, PipelineSessionState.FAILED}
    ),
    PipelineSessionState.DRAINING: frozenset(
        {PipelineSessionState.CANCELLING, PipelineSessionState.FAILED, PipelineSessionState.RELEASING}
    ),
    PipelineSessionState.CANCELLING: frozenset({PipelineSessionState.RELEASING}),
    PipelineSessionState.FAILED: frozenset({PipelineSessionState.RELEASING}),
    PipelineSessionState.RELEASING: frozenset({PipelineSessionState.CLOSED, PipelineSessionState.POISONED}),
    PipelineSessionState.POISONED: frozenset({PipelineSessionState.RELEASING}),
    PipelineSessionState.CLOSED: frozenset(),
}
ACCEPTS_RESULTS = frozenset({PipelineSessionState.OPEN, PipelineSessionState.DRAINING})
DISCARDED = frozenset({PipelineSessionState.CANCELLING, PipelineSessionState.FAILED})


class NoticeKind(enum.Enum):
    ROOM = "room"  # ingress room freed or the session stopped accepting input: wake submitters
    OUTPUT = "output"  # output became readable or the stream ended: wake readers
    QUIESCENT = "quiescent"  # a closing or failed session has nothing left running: its release may start
    FAILED = "failed"  # the session failed: the driver starts its release

    # Identity hash, as for `PipelineSessionState`: the driver keys its waiters by (kind, session) on every notice.
    __hash__ = object.__hash__


@dataclass(frozen=True, slots=True)
class Notice:
    kind: NoticeKind
    session_id: str


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A stage call the driver must start now."""

    invocation_id: int
    call: StageCall


@dataclass(frozen=True, slots=True)
class OutputItem:
    session_id: str
    sequence_id: int
    artifact: str
    payload: object


class ResultKind(enum.Enum):
    DELIVERED = "delivered"  # the result was accepted and its artifacts moved on
    STALE = "stale"  # the invocation's session was cancelled, failed or closing: result dropped
    ORPHANED = "orphaned"  # no such invocation or session is known: result dropped
    DUPLICATE = "duplicate"  # the invocation had already completed: result dropped
    REJECTED = "rejected"  # the result did not match the stage's declared outputs: the session failed


@dataclass(frozen=True, slots=True)
class CloseReport:
    session_id: str
    state: PipelineSessionState
    failure: str | None
    released_stages: tuple[str, ...]
    failed_stages: Mapping[str, str]
    slot_leaks: int
    discarded_items: int
    outputs_emitted: int


@dataclass(frozen=True, slots=True)
class CoreStatistics:
    sessions_by_state: Mapping[str, int]
    poisoned_sessions: tuple[str, ...]
    in_flight_by_stage: Mapping[str, int]
    eligible_by_stage: Mapping[str, int]
    dispatched: int
    delivered: int
    stale_results: int
    orphaned_results: int
    duplicate_results: int
    rejected_results: int
    cleanup_failures: int
    slot_leaks: int
    # Ready-heap entries the scheduler examined while picking (live and stale): it grows with the dispatches, never
    # with the sessions waiting (see `pipeline.core.scheduler`'s invariants).
    sessions_examined: int = 0


class ActorView(Protocol):
    """What the core needs to know about the actors: availability, concurrency, and their incarnation."""

    def available(self, stage_id: str) -> bool: ...

    def capacity(self, stage_id: str) -> int: ...

    def incarnation(self, stage_id: str) -> int: ...
