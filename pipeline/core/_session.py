"""The per-session bookkeeping of the scheduling core: what `SchedulerCore` keeps for each session and each call.

`CoreSession` holds one session's lifecycle state, edge buffers and reservations, joins, per-stage ordering and idle
tracking, where it stands in each stage's ready structure (`Slot`), and its output buffers; the scheduler moves it
between `PipelineSessionState`s only along the transition table. `Join` counts the inputs of one sequence that have
reached a stage, `Invocation` is one dispatched stage call until its result is settled, and `BlockNote` records the
first stage-level blocker seen by the sessions that became ready since the previous one. Package-private: only the
scheduler (`pipeline.core.scheduler`) and its ready queues and close path (`_ready.py`, `_close.py`) use these (the
invariants are in the scheduler's docstring).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pipeline.core.records import SESSION_TRANSITIONS, OutputItem, PipelineSessionState
from pipeline.errors import SessionError
from pipeline.metrics import IdleReason, StreamingSessionMetrics

__all__: list[str] = []


class Slot(enum.Enum):
    """Where a session stands in one stage's ready structure."""

    IDLE = "idle"  # not eligible at the stage (nothing joined to run, a strict call in flight, or not accepting)
    READY = "ready"  # eligible, with exactly one live entry in the stage's ready heap
    PARKED = "parked"  # eligible, but its own downstream of the stage was full when last picked; no heap entry


@dataclass(slots=True)
class BlockNote:
    """The first stage-level blocker (stage limit, busy actor, resource group) observed after the sessions holding
    this note became ready; None until one is observed. One object shared by many sessions: filling it is O(1)."""

    reason: tuple[IdleReason, str | None] | None = None


@dataclass(slots=True)
class Join:
    count: int = 0
    last_artifact: str = ""
    ready_at: float = 0.0


@dataclass(slots=True)
class Invocation:
    invocation_id: int
    stage: int
    session_id: str
    sequence_id: int
    inputs_ready: float
    admitted: float
    session: CoreSession
    cancelled: bool = False  # the session discarded its work: the result will be dropped as stale
    abandoned: bool = False  # the session stopped waiting for it (close timeout): its held room counts as leaked


@dataclass(slots=True)
class CoreSession:
    session_id: str
    state: PipelineSessionState
    metrics: StreamingSessionMetrics
    edge_items: list[dict[int, object]]
    edge_reserved: list[int]
    joins: list[dict[int, Join]]
    stage_next: list[int]
    stage_in_flight: list[int]
    none_ready: list[list[int]]
    idle_since: list[float | None]
    eligible_at: list[float]
    blocker: list[tuple[IdleReason, str | None] | None]
    touched: list[int | None]
    slot: list[Slot]
    stamp: list[int]  # per stage: when the session last became eligible there (the ready heap's order)
    block_note: list[BlockNote]
    external_next: dict[str, int]
    output_next: dict[str, int]
    output_reorder: dict[str, dict[int, object]]
    output_reserved: dict[str, int]
    output_unread: dict[str, int]
    readable: deque[OutputItem] = field(default_factory=deque)
    invocations: set[int] = field(default_factory=set)
    failure: str | None = None
    release_failures: dict[str, str] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)

    @classmethod
    def opened(
        cls,
        session_id: str,
        metrics: StreamingSessionMetrics,
        external: Iterable[str],
        outputs: Sequence[str],
        block_notes: Sequence[BlockNote],
        n_edges: int,
        now: float,
    ) -> CoreSession:
        """A new OPEN session: empty edges and joins, IDLE at every stage since `now`, holding each stage's
        current block note."""
        n_stages = len(block_notes)
        return cls(
            session_id=session_id,
            state=PipelineSessionState.OPEN,
            metrics=metrics,
            edge_items=[{} for _ in range(n_edges)],
            edge_reserved=[0] * n_edges,
            joins=[{} for _ in range(n_stages)],
            stage_next=[0] * n_stages,
            stage_in_flight=[0] * n_stages,
            none_ready=[[] for _ in range(n_stages)],
            idle_since=[now] * n_stages,
            eligible_at=[now] * n_stages,
            blocker=[None] * n_stages,
            touched=[None] * n_stages,
            slot=[Slot.IDLE] * n_stages,
            stamp=[0] * n_stages,
            block_note=list(block_notes),
            external_next=dict.fromkeys(external, 0),
            output_next=dict.fromkeys(outputs, 0),
            output_reorder={a: {} for a in outputs},
            output_reserved=dict.fromkeys(outputs, 0),
            output_unread=dict.fromkeys(outputs, 0),
        )

    def move(self, to: PipelineSessionState) -> PipelineSessionState:
        """Move along the transition table; returns the state left."""
        if to not in SESSION_TRANSITIONS[self.state]:
            raise SessionError(f"session {self.session_id!r} cannot go from {self.state.value} to {to.value}")
        left, self.state = self.state, to
        return left
