"""The pure scheduling core of the streaming orchestrator: decides what runs next, never runs anything.

`SchedulerCore` holds every session's bounded edges, joins, per-stage ordering and lifecycle, and answers the
driver's events (`try_submit`, `complete`, `fail`, `actor_died`, `output_read`, close and release steps) with
`Dispatch` records to start and `Notice` records of what changed. It has no awaits, no threads and an injected
clock, so tests drive it step by step. The asyncio driver (`pipeline.orchestrator`) is a thin shell around it.

State machine of a session (see `PipelineSessionState`)::

    OPEN ──close(drain)──► DRAINING ──quiescent──► RELEASING ──all released──► CLOSED (id reusable)
      │ └─close(cancel)─► CANCELLING ─quiescent─┘       │
      └──stage error / actor death──► FAILED ──quiescent─┘ └──a release failed──► POISONED ──retry──► RELEASING

Scheduling. A stage is *eligible* for a session when the next sequence's inputs are all joined (strict
ordering: exactly sequence `next`, nothing of the session in flight at that stage; `NONE`: any joined sequence,
up to the per-session limit). When the stage has a free slot, the session that became eligible there first and
whose downstream has room goes first (this is what makes sessions interleave fairly: a session re-enters at the
tail after each dispatch). Dispatching reserves one slot on every downstream edge (and in the output buffer for
outputs) of every produced artifact and takes the inputs off their edges, so in-flight work always owns the room it
will need. `pump` loops until nothing more can be dispatched; nothing in the scheduling path recurses.

Ready structures (cost per event independent of how many sessions are open, and of how long they ran), kept by
`ReadyQueues` (`pipeline.core._ready`). Per stage s:

- `heaps[s]`, a binary heap of `(stamp, session)`: the sessions whose `slot[s]` is READY, ordered by `stamp[s]`,
  a global counter taken when the session became eligible at s. Entries are removed lazily: an entry is live iff
  its session's `slot[s]` is READY and its `stamp[s]` equals the entry's; `ready_count[s]` counts the live ones,
  and the heap is rebuilt from them once it holds more than twice as many entries plus a constant, so it stays
  O(live) in size and every removal is O(1) amortised.
- A session's `slot[s]` is IDLE (not eligible), READY (one live heap entry) or PARKED (eligible, no entry).
  `pump` pops the oldest live entry; if the session's own downstream of s is full (an out edge's items plus
  reservations at capacity, or its output buffer full) it is PARKED with that reason as its `blocker[s]`, else it
  is dispatched. Room on s's downstream frees only when a consumer's dispatch takes an item off an out edge of s,
  a reader frees an output slot, or a reservation is returned; each of these moves the session at s from PARKED
  back to READY with its old stamp (`unpark`), so it keeps its place among the eligible.
- `block_note[s]`: the `BlockNote` that the sessions becoming READY at s take; when `pump` finds the stage itself
  blocked (stage limit, actor busy or down, resource group) with sessions waiting, it fills the note once and
  sessions ready later take a fresh one. So the idle interval of a dispatched session names the first stage-level
  blocker seen since it became eligible (its own downstream blocker, when it had one, wins) without visiting the
  waiting sessions.

Invariants, after every public call:

1. `slot[s]` is not IDLE iff the session accepts results and is eligible at s (`_refresh_eligible` runs after
   every change of a join, an in-flight count or the state; a discard sets every slot IDLE).
2. Each READY session has exactly one live entry in `heaps[s]`; PARKED and IDLE have none; `ready_count[s]` and
   `parked_count[s]` count them. Stamps are unique, so a heap comparison never reaches the session.
3. A PARKED session's downstream of s is full (room freeing unparks it). Hence the oldest READY session whose
   downstream has room is the oldest eligible session with room (what a scan of every eligible one would pick).
4. Per event (a submit, a result, a read, a close), the scheduler does O(stages + edges of the stages involved)
   work plus O(log n) per heap push or pop; the sessions it examines while picking (`sessions_examined` in the
   statistics) are the dispatched ones, plus at most one park per unpark and one stale entry per removal. No
   operation but `actor_died` (which visits only the sessions that ran on the stage, to fail those its dead
   incarnation held) visits other sessions; `statistics()` reads counters kept as the states change.

The records it exchanges with the driver (`PipelineSessionState`, `Dispatch`, `Notice`, `CloseReport`, ...) live in
`pipeline.core.records` and the per-session bookkeeping in `pipeline.core._session`; this module holds
`SchedulerCore` and its scheduling path, the ready queues are `pipeline.core._ready` and the close path (close,
fail, discard, quiescence, release) `pipeline.core._close`; `pipeline.core` exports the records and the core.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Iterable, Mapping

from pipeline.actor import StageCall
from pipeline.clock import Clock
from pipeline.core._close import ClosePath
from pipeline.core._ready import ReadyQueues
from pipeline.core._session import CoreSession, Invocation, Join
from pipeline.core.records import (
    ACCEPTS_RESULTS,
    ActorView,
    CloseMode,
    CloseReport,
    CoreStatistics,
    Dispatch,
    Notice,
    NoticeKind,
    OutputItem,
    PipelineSessionState,
    ResultKind,
)
from pipeline.errors import (
    SequenceError,
    SessionClosedError,
    SessionError,
    SessionExistsError,
    SessionPoisonedError,
    UnknownArtifactError,
    UnknownSessionError,
)
from pipeline.metrics import IdleReason, StreamingSessionMetrics
from pipeline.spec import PipelineGraph, StageOrdering

__all__ = ["SchedulerCore"]

# Completed invocation ids remembered to tell a duplicate result from an orphaned one (bounded).
_RECENT_RESULTS = 1024
_STAGE_LIMIT: tuple[IdleReason, str | None] = (IdleReason.STAGE_LIMIT, None)
_ACTOR_BUSY: tuple[IdleReason, str | None] = (IdleReason.ACTOR_BUSY, None)


class SchedulerCore:
    """Pure scheduling state for all sessions of one pipeline; see the module docstring."""

    def __init__(self, graph: PipelineGraph, actors: ActorView, clock: Clock, *, metrics_window: int = 256) -> None:
        self._graph = graph
        self._actors = actors
        self._clock = clock
        self._metrics_window = metrics_window
        stages = graph.stages
        # the graph's properties as plain attributes: the scheduling path reads them several times per event
        self._stages = stages
        self._edges = graph.edges
        self._in_count = [len(graph.in_edges[s]) for s in range(len(stages))]
        self._produces = [frozenset(s.produces) for s in stages]
        self._stage_ids = tuple(s.stage_id for s in stages)
        self._ready = ReadyQueues(len(stages))
        # per stage: the sessions that have run there (what a death of its actor may concern)
        self._ran_on: list[dict[str, CoreSession]] = [{} for _ in stages]
        self._state_counts: Counter[PipelineSessionState] = Counter()
        self._in_flight = [0] * len(stages)
        self._spec_limit = [s.max_in_flight for s in stages]
        self._group_of = [s.resource_group for s in stages]
        self._group_limit = {g.name: g.max_concurrency for g in graph.spec.resource_groups}
        self._group_used = dict.fromkeys(self._group_limit, 0)
        self._sessions: dict[str, CoreSession] = {}
        self._poisoned: dict[str, CoreSession] = {}
        self._invocations: dict[int, Invocation] = {}
        self._recent_results: deque[int] = deque(maxlen=_RECENT_RESULTS)
        self._recent_set: set[int] = set()
        self._next_invocation = 1
        self._notices: list[Notice] = []
        self._counters = dict.fromkeys(
            (
                *("dispatched", "delivered", "stale", "orphaned", "duplicate", "rejected", "cleanup_failures"),
                "leaks",
            ),
            0,
        )
        # the stage each edge feeds and the stage that produces into it (None: external), by edge index
        self._edge_target = [graph.stage_index[e.target] for e in graph.edges]
        self._edge_source = [None if e.source is None else graph.stage_index[e.source] for e in graph.edges]
        self._close = ClosePath(
            graph,
            self._ready,
            sessions=self._sessions,
            poisoned=self._poisoned,
            invocations=self._invocations,
            ran_on=self._ran_on,
            counters=self._counters,
            notices=self._notices,
            state_counts=self._state_counts,
        )

    # -- sessions --------------------------------------------------------------------------------------------

    def open_session(self, session_id: str) -> StreamingSessionMetrics:
        if session_id in self._poisoned:
            failed = sorted(self._poisoned[session_id].release_failures)
            raise SessionPoisonedError(
                f"session {session_id!r} is poisoned: releasing stages {failed} failed; retry the release first"
            )
        if session_id in self._sessions:
            raise SessionExistsError(f"session {session_id!r} is already open")
        metrics = StreamingSessionMetrics(session_id, window=self._metrics_window, stage_ids=self._stage_ids)
        graph = self._graph
        session = CoreSession.opened(
            session_id,
            metrics,
            graph.external_artifacts,
            graph.spec.outputs,
            self._ready.block_note,
            len(self._edges),
            self._clock.now(),
        )
        self._sessions[session_id] = session
        self._state_counts[PipelineSessionState.OPEN] += 1
        return session.metrics

    def state(self, session_id: str) -> PipelineSessionState:
        return self._any(session_id).state

    def has_session(self, session_id: str) -> bool:
        return session_id in self._sessions

    def metrics(self, session_id: str) -> StreamingSessionMetrics:
        return self._get(session_id).metrics

    def failure(self, session_id: str) -> str | None:
        return self._get(session_id).failure

    def readable(self, session_id: str) -> deque[OutputItem]:
        """The session's readable outputs, in order. The reader pops from it and then calls `output_read`."""
        return self._get(session_id).readable

    def stream_ended(self, session_id: str) -> bool:
        """True when no more outputs can become readable for the session (readable ones may remain)."""
        session = self._sessions.get(session_id)
        return session is None or session.state not in ACCEPTS_RESULTS

    def next_sequence(self, session_id: str, artifact: str) -> int:
        session = self._get(session_id)
        if artifact not in session.external_next:
            raise UnknownArtifactError(self._unknown_artifact(artifact))
        return session.external_next[artifact]

    # -- ingress ---------------------------------------------------------------------------------------------

    def try_submit(self, session_id: str, items: Mapping[str, tuple[int, object]]) -> bool:
        """Accept all `items` (artifact → (sequence id, payload)) or none; False when any edge lacks room.

        Raises for misuse: unknown session or artifact, a closed session, or a sequence id that is not the next
        dense id of its artifact (a gap or a replay).
        """
        session = self._get(session_id)
        if not items:
            raise SessionError("try_submit needs at least one artifact")
        if session.state is not PipelineSessionState.OPEN:
            raise SessionClosedError(f"session {session_id!r} is {session.state.value} and accepts no input")
        for artifact, (sequence_id, _) in items.items():
            expected = session.external_next.get(artifact)
            if expected is None:
                raise UnknownArtifactError(self._unknown_artifact(artifact))
            if sequence_id != expected:
                kind = "a replay" if sequence_id < expected else "a gap"
                raise SequenceError(
                    f"session {session_id!r}, artifact {artifact!r}: sequence {sequence_id} is {kind}; "
                    f"the next accepted sequence is {expected}"
                )
        edges = self._edges
        for artifact in items:
            for e in self._graph.ingress_edges[artifact]:
                if len(session.edge_items[e]) >= edges[e].capacity:
                    return False
        now = self._clock.now()
        anchor = self._graph.spec.latency_anchor_artifact
        session.metrics.on_ingress(now)
        for artifact, (sequence_id, payload) in items.items():
            session.external_next[artifact] = sequence_id + 1
            if artifact == anchor:
                session.metrics.on_anchor(sequence_id, now)
            for e in self._graph.ingress_edges[artifact]:
                self._deliver(session, e, sequence_id, payload, now)
        return True

    def has_room(self, session_id: str, artifacts: Iterable[str]) -> bool:
        session = self._get(session_id)
        edges = self._edges
        return all(
            len(session.edge_items[e]) < edges[e].capacity
            for artifact in artifacts
            for e in self._graph.ingress_edges.get(artifact, ())
        )

    # -- scheduling ------------------------------------------------------------------------------------------

    def pump(self) -> list[Dispatch]:
        """Dispatch everything that can run now, oldest eligible session first per stage. Iterative."""
        dispatches: list[Dispatch] = []
        ready = self._ready
        # A stage found blocked stays blocked until this call returns: dispatching only takes slots and permits.
        blocked_stages: set[int] = set()
        progress = True
        while progress:
            progress = False
            for s in self._graph.topo_order:
                while ready.ready_count[s] and s not in blocked_stages:
                    blocked = self._stage_blocked(s)
                    if blocked is not None:
                        blocked_stages.add(s)
                        ready.note_blocked(s, blocked)
                        break
                    session = ready.pop(s)
                    reason = self._downstream_blocked(session, s)
                    if reason is not None:
                        ready.park(session, s, reason)
                        continue
                    ready.take(session, s)
                    dispatch = self._dispatch(session, s)
                    if dispatch is not None:
                        dispatches.append(dispatch)
                    progress = True
        return dispatches

    def complete(self, invocation_id: int, outputs: Mapping[str, object], started: float) -> ResultKind:
        """Take a stage result. Late results are classified and dropped; their reserved room is returned."""
        now = self._clock.now()
        settled = self._settle(invocation_id, now)
        if isinstance(settled, ResultKind):
            return settled
        inv, session = settled
        stage = self._stages[inv.stage]
        if outputs.keys() != self._produces[inv.stage]:
            self._unreserve(session, inv)
            self._counters["rejected"] += 1
            self._close.fail(
                session,
                f"stage {stage.stage_id!r} returned artifacts {sorted(outputs)} for sequence {inv.sequence_id}; "
                f"it declares {sorted(stage.produces)}",
            )
            return ResultKind.REJECTED
        session.metrics.on_stage(stage.stage_id, inv.sequence_id, inv.inputs_ready, inv.admitted, started, now)
        for artifact in stage.produces:
            payload = outputs[artifact]
            for e in self._graph.out_edges[inv.stage].get(artifact, ()):
                session.edge_reserved[e] -= 1
                self._deliver(session, e, inv.sequence_id, payload, now)
            if artifact in self._graph.output_set:
                session.output_reserved[artifact] -= 1
                session.output_reorder[artifact][inv.sequence_id] = payload
                self._flush_outputs(session, artifact, now)
        self._counters["delivered"] += 1
        # No refresh of the stage itself: `_settle` did it, and delivering downstream cannot change it (a DAG).
        self._close.check_quiescent(session)
        return ResultKind.DELIVERED

    def fail(self, invocation_id: int, reason: str) -> ResultKind:
        """A call raised (stage error, actor died or unavailable): fail its session unless it was discarded."""
        settled = self._settle(invocation_id, self._clock.now())
        if isinstance(settled, ResultKind):
            return settled
        inv, session = settled
        self._unreserve(session, inv)
        self._close.fail(session, reason)
        return ResultKind.DELIVERED

    def earlier_in_flight(self, invocation_id: int) -> bool:
        """Whether the session of call `invocation_id` still waits for a call of an earlier sequence (any stage).

        The driver holds a stage error back until those settle, so a pipelined session (sequence k decoding while
        k + 1 runs upstream) still delivers what came before the failing sequence, as a session with one sequence in
        flight would. False for a call already settled or a session that no longer takes results."""
        inv = self._invocations.get(invocation_id)
        if inv is None or inv.session.state not in ACCEPTS_RESULTS:
            return False
        for other_id in inv.session.invocations:
            other = self._invocations.get(other_id)
            if other is not None and not other.cancelled and other.sequence_id < inv.sequence_id:
                return True
        return False

    def _settle(self, invocation_id: int, now: float) -> tuple[Invocation, CoreSession] | ResultKind:
        """Finish a call's bookkeeping; classify it as duplicate, orphaned or stale, or return it to be used."""
        inv = self._invocations.pop(invocation_id, None)
        if inv is None:
            return self._unknown_result(invocation_id)
        self._remember(invocation_id)
        session = self._finish_invocation(inv, now)
        if session is None:
            self._counters["orphaned"] += 1
            return ResultKind.ORPHANED
        if inv.cancelled or session.state not in ACCEPTS_RESULTS:
            self._unreserve(session, inv)
            session.metrics.stale_results += 1
            self._counters["stale"] += 1
            self._close.check_quiescent(session)
            return ResultKind.STALE
        return inv, session

    def actor_died(self, stage_id: str, incarnation: int, reason: str) -> list[str]:
        """Fail every live session whose state lived in the dead incarnation of `stage_id`'s actor."""
        s = self._graph.stage_index[stage_id]
        failed: list[str] = []
        for session in list(self._ran_on[s].values()):
            if session.touched[s] == incarnation and session.state in ACCEPTS_RESULTS:
                self._close.fail(session, f"actor {stage_id!r} died (incarnation {incarnation}): {reason}")
                failed.append(session.session_id)
        return failed

    def output_read(self, session_id: str, artifact: str) -> None:
        """A reader popped one item of `artifact` from the session's readable buffer: its slot is free."""
        session = self._sessions.get(session_id)
        if session is not None and session.output_unread[artifact] > 0:
            session.output_unread[artifact] -= 1
            self._ready.unpark(session, self._graph.producer[artifact])

    # -- closing ---------------------------------------------------------------------------------------------

    def begin_close(self, session_id: str, mode: CloseMode) -> None:
        """Stop input; with CANCEL also discard queued work. Idempotent; a later CANCEL upgrades a DRAIN."""
        self._close.begin_close(self._get(session_id), mode)

    def abandon_in_flight(self, session_id: str) -> int:
        """Stop waiting for the session's in-flight calls (a close timed out); returns how many were abandoned.

        The calls keep their stage slots until they really finish (the actor is busy with them), but the session
        no longer waits: the room they hold is reclaimed and counted as slot leaks when the session is released,
        and their results are dropped as orphaned.
        """
        return self._close.abandon_in_flight(self._get(session_id))

    def is_quiescent(self, session_id: str) -> bool:
        return self._close.quiescent(self._get(session_id))

    def begin_release(self, session_id: str) -> tuple[str, ...]:
        """Enter RELEASING; return the stages whose per-session state must be released, in reverse topo order.

        For a poisoned session only the stages whose release failed are returned (the retry).
        """
        return self._close.begin_release(self._any(session_id))

    def finish_release(self, session_id: str, released: Iterable[str], failures: Mapping[str, str]) -> CloseReport:
        """Record the release outcome, verify no capacity slot is left, and close or poison the session."""
        return self._close.finish_release(self._any(session_id), released, failures)

    # -- reading ---------------------------------------------------------------------------------------------

    def take_notices(self) -> list[Notice]:
        notices = self._notices.copy()  # the close path appends to the same list
        self._notices.clear()
        return notices

    def session_ids(self) -> tuple[str, ...]:
        return tuple(self._sessions)

    def poisoned_ids(self) -> tuple[str, ...]:
        return tuple(self._poisoned)

    def statistics(self) -> CoreStatistics:
        by_state = {state.value: count for state, count in self._state_counts.items() if count}
        c = self._counters
        return CoreStatistics(
            sessions_by_state=by_state,
            poisoned_sessions=tuple(self._poisoned),
            in_flight_by_stage=dict(zip(self._stage_ids, self._in_flight, strict=True)),
            eligible_by_stage={
                sid: self._ready.ready_count[s] + self._ready.parked_count[s] for s, sid in enumerate(self._stage_ids)
            },
            dispatched=c["dispatched"],
            delivered=c["delivered"],
            stale_results=c["stale"],
            orphaned_results=c["orphaned"],
            duplicate_results=c["duplicate"],
            rejected_results=c["rejected"],
            cleanup_failures=c["cleanup_failures"],
            slot_leaks=c["leaks"],
            sessions_examined=self._ready.examined,
        )

    def invariant_violations(self) -> list[str]:
        """Check the ready structures against invariants 1-3 of the module docstring; one sentence per violation.

        For tests and debugging: it visits every session and heap entry (O(sessions x stages)), so the scheduling
        path never calls it.
        """
        return self._ready.violations(
            self._sessions.values(), self._stage_ids, self._eligible, self._downstream_blocked
        )

    # -- internals -------------------------------------------------------------------------------------------

    def _any(self, session_id: str) -> CoreSession:
        """An open or a poisoned session."""
        session = self._sessions.get(session_id) or self._poisoned.get(session_id)
        if session is None:
            raise UnknownSessionError(f"no session {session_id!r}")
        return session

    def _get(self, session_id: str) -> CoreSession:
        session = self._sessions.get(session_id)
        if session is None:
            if session_id in self._poisoned:
                return self._poisoned[session_id]
            raise UnknownSessionError(f"no open session {session_id!r}")
        return session

    def _unknown_artifact(self, artifact: str) -> str:
        return f"{artifact!r} is not an external input of this pipeline (external: {list(self._graph.ingress_edges)})"

    def _notify(self, kind: NoticeKind, session: CoreSession) -> None:
        self._notices.append(Notice(kind, session.session_id))

    def _deliver(self, session: CoreSession, edge: int, sequence_id: int, payload: object, now: float) -> None:
        session.edge_items[edge][sequence_id] = payload
        s = self._edge_target[edge]
        join = session.joins[s].get(sequence_id)
        if join is None:
            join = session.joins[s][sequence_id] = Join()
        join.count += 1
        join.last_artifact = self._edges[edge].artifact
        if join.count == self._in_count[s]:
            join.ready_at = now
            if self._stages[s].ordering is StageOrdering.NONE:
                heapq.heappush(session.none_ready[s], sequence_id)
            self._refresh_eligible(session, s, now)

    def _eligible(self, session: CoreSession, s: int) -> bool:
        if session.state not in ACCEPTS_RESULTS:
            return False
        spec = self._stages[s]
        if spec.ordering is StageOrdering.PER_SESSION_STRICT:
            if session.stage_in_flight[s]:
                return False
            join = session.joins[s].get(session.stage_next[s])
            return join is not None and join.count == self._in_count[s]
        return bool(session.none_ready[s]) and session.stage_in_flight[s] < spec.max_in_flight_per_session

    def _refresh_eligible(self, session: CoreSession, s: int, now: float) -> None:
        if self._eligible(session, s):
            self._ready.enter(session, s, now)
        else:
            self._ready.make_idle(session, s)

    def _stage_blocked(self, s: int) -> tuple[IdleReason, str | None] | None:
        stage_id = self._stage_ids[s]
        limit = self._spec_limit[s]
        if limit is not None and self._in_flight[s] >= limit:
            return _STAGE_LIMIT
        # A busy actor first: with many sessions waiting, that is what a pump finds at every stage it looks at.
        if self._in_flight[s] >= self._actors.capacity(stage_id) or not self._actors.available(stage_id):
            return _ACTOR_BUSY
        group = self._group_of[s]
        if group is not None and self._group_used[group] >= self._group_limit[group]:
            return (IdleReason.RESOURCE_GROUP, group)
        return None

    def _downstream_blocked(self, session: CoreSession, s: int) -> tuple[IdleReason, str | None] | None:
        edges = self._edges
        for artifact, out in self._graph.out_edges[s].items():
            for e in out:
                if len(session.edge_items[e]) + session.edge_reserved[e] >= edges[e].capacity:
                    return (IdleReason.EDGE_FULL, artifact)
        capacity = self._graph.spec.output_capacity
        for artifact in self._stages[s].produces:
            if artifact in self._graph.output_set and self._output_occupancy(session, artifact) >= capacity:
                return (IdleReason.OUTPUT_FULL, artifact)
        return None

    @staticmethod
    def _output_occupancy(session: CoreSession, artifact: str) -> int:
        return (
            session.output_reserved[artifact] + len(session.output_reorder[artifact]) + session.output_unread[artifact]
        )

    def _dispatch(self, session: CoreSession, s: int) -> Dispatch | None:
        spec = self._stages[s]
        stage_id = spec.stage_id
        incarnation = self._actors.incarnation(stage_id)
        touched = session.touched[s]
        if touched is not None and touched != incarnation:
            self._close.fail(
                session,
                f"actor {stage_id!r} restarted (incarnation {touched} -> {incarnation}); the session's state is lost",
            )
            return None
        session.touched[s] = incarnation
        self._ran_on[s][session.session_id] = session
        now = self._clock.now()
        if spec.ordering is StageOrdering.PER_SESSION_STRICT:
            sequence_id = session.stage_next[s]
            session.stage_next[s] = sequence_id + 1
        else:
            sequence_id = heapq.heappop(session.none_ready[s])
        join = session.joins[s].pop(sequence_id)
        inputs: dict[str, object] = {}
        for e in self._graph.in_edges[s]:
            inputs[self._edges[e].artifact] = session.edge_items[e].pop(sequence_id)
            source = self._edge_source[e]
            if source is None:
                self._notify(NoticeKind.ROOM, session)
            else:
                self._ready.unpark(session, source)
        for out in self._graph.out_edges[s].values():
            for e in out:
                session.edge_reserved[e] += 1
        for artifact in spec.produces:
            if artifact in self._graph.output_set:
                session.output_reserved[artifact] += 1
        if session.stage_in_flight[s] == 0:
            self._record_idle(session, s, join, now)
        session.stage_in_flight[s] += 1
        self._in_flight[s] += 1
        group = self._group_of[s]
        if group is not None:
            self._group_used[group] += 1
        invocation_id = self._next_invocation
        self._next_invocation += 1
        self._invocations[invocation_id] = Invocation(
            invocation_id, s, session.session_id, sequence_id, join.ready_at, now, session
        )
        session.invocations.add(invocation_id)
        self._counters["dispatched"] += 1
        self._refresh_eligible(session, s, now)
        return Dispatch(invocation_id, StageCall(stage_id, session.session_id, sequence_id, inputs))

    def _record_idle(self, session: CoreSession, s: int, join: Join, now: float) -> None:
        since = session.idle_since[s]
        session.idle_since[s] = None
        if since is None:
            return
        stage_id = self._stage_ids[s]
        eligible_at = session.eligible_at[s]
        if eligible_at < since:
            eligible_at = since
        ready_at = join.ready_at
        if ready_at > since:
            session.metrics.on_idle(
                stage_id, since, ready_at if ready_at < now else now, IdleReason.MISSING_INPUT, join.last_artifact
            )
        blocker = session.blocker[s] or session.block_note[s].reason
        start = ready_at if ready_at > eligible_at else eligible_at
        if blocker is not None and now > start:
            session.metrics.on_idle(stage_id, start, now, blocker[0], blocker[1])
        session.blocker[s] = None

    def _finish_invocation(self, inv: Invocation, now: float) -> CoreSession | None:
        """Return the stage slot and the resource permit of a finished call; the session if it still exists."""
        self._in_flight[inv.stage] -= 1
        group = self._group_of[inv.stage]
        if group is not None:
            self._group_used[group] -= 1
        session = inv.session
        if inv.abandoned or self._sessions.get(inv.session_id) is not session:
            return None
        session.invocations.discard(inv.invocation_id)
        session.stage_in_flight[inv.stage] -= 1
        if session.stage_in_flight[inv.stage] == 0:
            session.idle_since[inv.stage] = now
        if session.state in ACCEPTS_RESULTS:
            self._refresh_eligible(session, inv.stage, now)
        return session

    def _unreserve(self, session: CoreSession, inv: Invocation) -> None:
        for out in self._graph.out_edges[inv.stage].values():
            for e in out:
                session.edge_reserved[e] -= 1
        for artifact in self._stages[inv.stage].produces:
            if artifact in self._graph.output_set:
                session.output_reserved[artifact] -= 1
        self._ready.unpark(session, inv.stage)

    def _flush_outputs(self, session: CoreSession, artifact: str, now: float) -> None:
        reorder = session.output_reorder[artifact]
        primary = artifact == self._graph.spec.outputs[0]
        emitted = False
        while session.output_next[artifact] in reorder:
            sequence_id = session.output_next[artifact]
            payload = reorder.pop(sequence_id)
            session.output_next[artifact] = sequence_id + 1
            session.output_unread[artifact] += 1
            session.readable.append(OutputItem(session.session_id, sequence_id, artifact, payload))
            if primary:
                session.metrics.on_output(sequence_id, now)
            emitted = True
        if emitted:
            self._notify(NoticeKind.OUTPUT, session)

    def _unknown_result(self, invocation_id: int) -> ResultKind:
        if invocation_id in self._recent_set:
            self._counters["duplicate"] += 1
            return ResultKind.DUPLICATE
        self._counters["orphaned"] += 1
        return ResultKind.ORPHANED

    def _remember(self, invocation_id: int) -> None:
        if len(self._recent_results) == self._recent_results.maxlen:
            self._recent_set.discard(self._recent_results[0])
        self._recent_results.append(invocation_id)
        self._recent_set.add(invocation_id)
