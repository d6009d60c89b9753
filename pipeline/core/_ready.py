"""The ready queues of the scheduling core: per stage, the sessions eligible to run there, oldest first.

Package-private (only `pipeline.core.scheduler` uses it). The structure and its invariants (1-3) are drawn in the
scheduler's docstring: per stage s a binary heap of `(stamp, session)` with lazy removal, the live entries counted,
a session's `slot[s]` IDLE, READY or PARKED, and the `BlockNote` that sessions becoming ready take. Whether a
session *is* eligible is the scheduler's to decide; this module only keeps the order and the counts.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence

from pipeline.core._session import BlockNote, CoreSession, Slot
from pipeline.metrics import IdleReason

__all__ = ["ReadyQueues"]

# A ready heap is rebuilt from its live entries once it holds more than twice as many plus this many.
_HEAP_SLACK = 64

_ReadyEntry = tuple[int, CoreSession]


class ReadyQueues:
    """The per-stage ready heaps, their live counts, the parked counts and the stage-level block notes.

    `enter` makes an IDLE eligible session READY with a fresh stamp (the tail), `pop` takes the oldest live entry
    off (the caller then dispatches it with `take` or parks it with `park`), `unpark` puts a PARKED session back
    with its old stamp, `make_idle` drops it from the structure (a stale heap entry stays, skipped when it
    surfaces). `examined` counts the entries `pop` looked at (`sessions_examined` in the core's statistics).
    """

    def __init__(self, n_stages: int) -> None:
        self.heaps: list[list[_ReadyEntry]] = [[] for _ in range(n_stages)]
        self.ready_count = [0] * n_stages
        self.parked_count = [0] * n_stages
        self.block_note = [BlockNote() for _ in range(n_stages)]
        self.examined = 0
        self._stamp = 0

    def enter(self, session: CoreSession, s: int, now: float) -> None:
        """The session is eligible at s: if it was IDLE, it becomes READY at the tail (a no-op otherwise)."""
        if session.slot[s] is not Slot.IDLE:
            return
        self._stamp += 1
        session.stamp[s] = self._stamp
        session.eligible_at[s] = now
        session.blocker[s] = None
        note = self.block_note[s]
        if note.reason is not None:  # filled for the sessions before: this one waits for the next blocker
            note = self.block_note[s] = BlockNote()
        session.block_note[s] = note
        self._push(session, s)

    def _push(self, session: CoreSession, s: int) -> None:
        session.slot[s] = Slot.READY
        self.ready_count[s] += 1
        heap = self.heaps[s]
        heapq.heappush(heap, (session.stamp[s], session))
        if len(heap) > 2 * self.ready_count[s] + _HEAP_SLACK:
            live = [(stamp, other) for stamp, other in heap if _live(stamp, other, s)]
            heapq.heapify(live)
            self.heaps[s] = live

    def pop(self, s: int) -> CoreSession:
        """The oldest READY session at s, taken off the heap (its slot is still READY; `take` or `park` it)."""
        heap = self.heaps[s]
        while True:
            stamp, session = heapq.heappop(heap)
            self.examined += 1
            if _live(stamp, session, s):
                self.ready_count[s] -= 1
                return session

    @staticmethod
    def take(session: CoreSession, s: int) -> None:
        """A popped session is dispatched at s: IDLE until it is eligible again."""
        session.slot[s] = Slot.IDLE

    def park(self, session: CoreSession, s: int, reason: tuple[IdleReason, str | None]) -> None:
        """A popped session's own downstream of s is full: PARKED (no heap entry) with `reason` as its blocker."""
        session.blocker[s] = reason
        session.slot[s] = Slot.PARKED
        self.parked_count[s] += 1

    def note_blocked(self, s: int, blocked: tuple[IdleReason, str | None]) -> None:
        """The stage itself is blocked with sessions waiting: the first blocker since they became ready."""
        note = self.block_note[s]
        if note.reason is None:
            note.reason = blocked

    def make_idle(self, session: CoreSession, s: int) -> None:
        """No longer eligible at s: a READY entry goes stale in the heap (skipped when it surfaces)."""
        slot = session.slot[s]
        if slot is Slot.READY:
            self.ready_count[s] -= 1
        elif slot is Slot.PARKED:
            self.parked_count[s] -= 1
        session.slot[s] = Slot.IDLE

    def unpark(self, session: CoreSession, s: int | None) -> None:
        """Room freed on the session's downstream of s: a PARKED session is ready again, with its old stamp."""
        if s is not None and session.slot[s] is Slot.PARKED:
            self.parked_count[s] -= 1
            self._push(session, s)

    def violations(
        self,
        sessions: Iterable[CoreSession],
        stage_ids: Sequence[str],
        eligible: Callable[[CoreSession, int], bool],
        downstream_blocked: Callable[[CoreSession, int], object],
    ) -> list[str]:
        """Invariants 1-3 of the scheduler's docstring, one sentence per violation (visits everything)."""
        sessions = list(sessions)
        found: list[str] = []
        live: list[set[str]] = [set() for _ in stage_ids]
        for s, heap in enumerate(self.heaps):
            for stamp, session in heap:
                if _live(stamp, session, s):
                    if session.session_id in live[s]:
                        found.append(f"{session.session_id} has two live entries at {stage_ids[s]}")
                    live[s].add(session.session_id)
        for s, stage_id in enumerate(stage_ids):
            ready = parked = 0
            for session in sessions:
                slot = session.slot[s]
                is_eligible = eligible(session, s)
                if is_eligible == (slot is Slot.IDLE):
                    found.append(f"{session.session_id} is {slot.value} at {stage_id} but eligible={is_eligible}")
                if (slot is Slot.READY) != (session.session_id in live[s]):
                    found.append(f"{session.session_id} is {slot.value} at {stage_id} with a live entry mismatch")
                if slot is Slot.PARKED and downstream_blocked(session, s) is None:
                    found.append(f"{session.session_id} is parked at {stage_id} although its downstream has room")
                ready += slot is Slot.READY
                parked += slot is Slot.PARKED
            if (ready, parked) != (self.ready_count[s], self.parked_count[s]):
                found.append(
                    f"{stage_id}: counted {self.ready_count[s]} ready / {self.parked_count[s]} parked, "
                    f"found {ready} / {parked}"
                )
        return found


def _live(stamp: int, session: CoreSession, s: int) -> bool:
    return session.slot[s] is Slot.READY and session.stamp[s] == stamp
