"""The close path of the scheduling core: closing, failing, discarding and releasing a session.

Package-private (only `pipeline.core.scheduler` uses it). `ClosePath` holds the lifecycle moves of the state
machine drawn in the scheduler's docstring past OPEN: DRAINING and CANCELLING (`begin_close`), FAILED (`fail`),
RELEASING (`begin_release`), CLOSED or POISONED (`finish_release`), and quiescence, the condition for a release.
It is told the core's tables (the same objects the scheduler holds, never copies) and decides nothing about
scheduling: a discard makes every slot IDLE through the ready queues, and the scheduler's next `pump` sees it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from pipeline.core._ready import ReadyQueues
from pipeline.core._session import CoreSession, Invocation, Slot
from pipeline.core.records import (
    ACCEPTS_RESULTS,
    DISCARDED,
    CloseMode,
    CloseReport,
    Notice,
    NoticeKind,
    PipelineSessionState,
)
from pipeline.errors import SessionError
from pipeline.spec import PipelineGraph

__all__ = ["ClosePath"]


class ClosePath:
    """The lifecycle moves of a session past OPEN, on the core's own tables (see the module docstring).

    `sessions` and `poisoned` are the core's open and poisoned sessions, `invocations` its calls in flight,
    `ran_on` per stage the sessions that ran there, `counters` its statistics counters, `notices` the list it hands
    the driver, `state_counts` the sessions per state. Every method takes a session the core already looked up.
    """

    def __init__(
        self,
        graph: PipelineGraph,
        ready: ReadyQueues,
        *,
        sessions: dict[str, CoreSession],
        poisoned: dict[str, CoreSession],
        invocations: dict[int, Invocation],
        ran_on: list[dict[str, CoreSession]],
        counters: dict[str, int],
        notices: list[Notice],
        state_counts: Counter[PipelineSessionState],
    ) -> None:
        self._graph = graph
        self._ready = ready
        self._sessions = sessions
        self._poisoned = poisoned
        self._invocations = invocations
        self._ran_on = ran_on
        self._counters = counters
        self._notices = notices
        self._state_counts = state_counts

    def move(self, session: CoreSession, to: PipelineSessionState) -> None:
        left = session.move(to)
        self._state_counts[left] -= 1
        if to is not PipelineSessionState.CLOSED:
            self._state_counts[to] += 1

    def notify(self, kind: NoticeKind, session: CoreSession) -> None:
        self._notices.append(Notice(kind, session.session_id))

    def begin_close(self, session: CoreSession, mode: CloseMode) -> None:
        """Stop input; with CANCEL also discard queued work. Idempotent; a later CANCEL upgrades a DRAIN."""
        if mode is CloseMode.DRAIN and session.state is PipelineSessionState.OPEN:
            self.move(session, PipelineSessionState.DRAINING)
            self.notify(NoticeKind.ROOM, session)
        elif mode is CloseMode.CANCEL and session.state in ACCEPTS_RESULTS:
            self.move(session, PipelineSessionState.CANCELLING)
            self.discard(session)
            self.notify(NoticeKind.ROOM, session)
            self.notify(NoticeKind.OUTPUT, session)
        self.check_quiescent(session)

    def abandon_in_flight(self, session: CoreSession) -> int:
        """Stop waiting for the session's in-flight calls; returns how many were abandoned (see the core's
        `abandon_in_flight`)."""
        for invocation_id in session.invocations:
            inv = self._invocations[invocation_id]
            inv.cancelled = True
            inv.abandoned = True
        count = len(session.invocations)
        session.invocations.clear()
        self.check_quiescent(session)
        return count

    def fail(self, session: CoreSession, reason: str) -> None:
        if session.state not in ACCEPTS_RESULTS:
            return
        session.failure = reason
        self.move(session, PipelineSessionState.FAILED)
        self.discard(session)
        self.notify(NoticeKind.FAILED, session)
        self.notify(NoticeKind.ROOM, session)
        self.notify(NoticeKind.OUTPUT, session)
        self.check_quiescent(session)

    def discard(self, session: CoreSession) -> int:
        """Drop queued work (edge items, joins, unordered outputs); mark in-flight calls cancelled."""
        discarded = 0
        for items in session.edge_items:
            discarded += len(items)
            items.clear()
        for s, joins in enumerate(session.joins):
            joins.clear()
            session.none_ready[s].clear()
            self._ready.make_idle(session, s)
        for reorder in session.output_reorder.values():
            discarded += len(reorder)
            reorder.clear()
        for invocation_id in session.invocations:
            self._invocations[invocation_id].cancelled = True
        session.metrics.forget_anchors()
        session.metrics.discarded_items += discarded
        return discarded

    @staticmethod
    def quiescent(session: CoreSession) -> bool:
        if session.invocations:
            return False
        if session.state in DISCARDED or session.state is PipelineSessionState.POISONED:
            return True
        if session.state is PipelineSessionState.DRAINING:
            return all(slot is Slot.IDLE for slot in session.slot)
        return False

    def check_quiescent(self, session: CoreSession) -> None:
        if session.state in (PipelineSessionState.DRAINING, *DISCARDED) and self.quiescent(session):
            self.notify(NoticeKind.QUIESCENT, session)

    def begin_release(self, session: CoreSession) -> tuple[str, ...]:
        """Enter RELEASING; return the stages whose per-session state must be released, in reverse topo order.

        For a poisoned session only the stages whose release failed are returned (the retry).
        """
        if session.state is PipelineSessionState.POISONED:
            stages = tuple(s for s in self._graph.release_order() if s in session.release_failures)
        else:
            if not self.quiescent(session):
                raise SessionError(f"session {session.session_id!r} still has work running; it cannot be released yet")
            stages = self._graph.release_order()
        self.move(session, PipelineSessionState.RELEASING)
        self.notify(NoticeKind.OUTPUT, session)
        return stages

    def finish_release(self, session: CoreSession, released: Iterable[str], failures: Mapping[str, str]) -> CloseReport:
        """Record the release outcome, verify no capacity slot is left, and close or poison the session."""
        session_id = session.session_id
        if session.state is not PipelineSessionState.RELEASING:
            raise SessionError(f"session {session_id!r} is {session.state.value}, not releasing")
        self.discard(session)
        leaks = self._reclaim_leaks(session)
        session.released.extend(released)
        session.release_failures = dict(failures)
        session.metrics.cleanup_failures += len(failures)
        self._counters["cleanup_failures"] += len(failures)
        if failures:
            self.move(session, PipelineSessionState.POISONED)
            self._sessions.pop(session_id, None)
            self._poisoned[session_id] = session
        else:
            self.move(session, PipelineSessionState.CLOSED)
            self._sessions.pop(session_id, None)
            self._poisoned.pop(session_id, None)
            for ran_on in self._ran_on:
                ran_on.pop(session_id, None)
        self._notices.append(Notice(NoticeKind.OUTPUT, session_id))
        self._notices.append(Notice(NoticeKind.ROOM, session_id))
        return CloseReport(
            session_id=session_id,
            state=session.state,
            failure=session.failure,
            released_stages=tuple(session.released),
            failed_stages=dict(failures),
            slot_leaks=leaks,
            discarded_items=session.metrics.discarded_items,
            outputs_emitted=session.metrics.outputs,
        )

    def _reclaim_leaks(self, session: CoreSession) -> int:
        """Count and zero any capacity the session still holds after its work is gone (should be none)."""
        leaks = sum(session.edge_reserved) + sum(session.stage_in_flight) + sum(session.output_reserved.values())
        leaks += sum(len(items) for items in session.edge_items)
        for i in range(len(session.edge_reserved)):
            session.edge_reserved[i] = 0
        # The stage's global slot stays with an abandoned call until it really returns (the core's
        # `_finish_invocation`).
        for s in range(len(session.stage_in_flight)):
            session.stage_in_flight[s] = 0
        for artifact in session.output_reserved:
            session.output_reserved[artifact] = 0
        session.metrics.slot_leaks += leaks
        self._counters["leaks"] += leaks
        return leaks
