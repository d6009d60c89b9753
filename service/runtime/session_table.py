"""`SessionTable`: the records of the sessions one runtime keeps, live and recently finished, and what they add up to.

A session enters the table when it is created here (or adopted from another replica's queue) and is *live* until its
terminal state; then it stays readable as one of the last `history` finished sessions (oldest forgotten first), and
is counted by final state (and by the limit that ended it). A rejected create, and a queued session another replica
took over, leave at once. The table also knows when no session is live (`wait_idle`: what the drain and shutdown
wait for). It decides nothing and starts nothing: `ServiceRuntime` and its `SessionConductor` tell it what happened.
Everything runs on the event loop.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter, OrderedDict

from service.errors import SessionNotFoundError
from service.runtime.limits import PAUSED_TOO_LONG, TIME_LIMIT
from service.runtime.sessions import LIVE_STATES, Session, SessionState

__all__ = ["SessionTable"]


class SessionTable:
    """The runtime's sessions by id: every live one and the last `history` finished ones."""

    def __init__(self, history: int) -> None:
        self._history = history
        self._sessions: dict[str, Session] = {}
        self._live: set[str] = set()
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._ended_total: Counter[str] = Counter()
        self._ended_by_limit: Counter[str] = Counter()
        self._idle = asyncio.Event()
        self._idle.set()

    def get(self, session_id: str) -> Session | None:
        """The record of the session (live, or finished and remembered), if there is one."""
        return self._sessions.get(session_id)

    def __getitem__(self, session_id: str) -> Session:
        """The record of the session; raises `SessionNotFoundError` (not `KeyError`) when there is none."""
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionNotFoundError(session_id)
        return session

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def visible(self, owner: str, session_id: str) -> Session:
        """The record of `owner`'s session; raises `SessionNotFoundError` for an unknown one or another owner's (the
        two are told apart by no answer and no timing)."""
        session = self._sessions.get(session_id)
        if session is None or not secrets.compare_digest(session.owner, owner):
            raise SessionNotFoundError(session_id)
        return session

    def of_owner(self, owner: str) -> list[Session]:
        return [session for session in self._sessions.values() if session.owner == owner]

    @property
    def live_count(self) -> int:
        return len(self._live)

    def admitted(self) -> list[Session]:
        """The live sessions past the queue (they hold, or are about to give back, a slot)."""
        return [self._sessions[sid] for sid in self._live if self._sessions[sid].past_queue]

    def queued(self) -> list[Session]:
        return [self._sessions[sid] for sid in self._live if self._sessions[sid].state is SessionState.QUEUED]

    def by_state(self) -> dict[str, int]:
        """Live sessions by state, every live state named (in the enum's order)."""
        counts = Counter(self._sessions[sid].state.value for sid in self._live)
        return {state.value: counts.get(state.value, 0) for state in SessionState if state in LIVE_STATES}

    def slots_held(self) -> int:
        return sum(1 for sid in self._live if self._sessions[sid].holds_slot)

    def ended_total(self) -> dict[str, int]:
        return dict(self._ended_total)

    def ended_by_limit(self) -> dict[str, int]:
        return {reason: self._ended_by_limit.get(reason, 0) for reason in (TIME_LIMIT, PAUSED_TOO_LONG)}

    # -- what happened

    def add(self, session: Session) -> None:
        """A new live session (created here, or adopted)."""
        self._sessions[session.id] = session
        self._live.add(session.id)
        self._idle.clear()

    def drop(self, session_id: str) -> None:
        """Forget a session without counting it: a rejected create, or a queued one that lives on elsewhere."""
        self._sessions.pop(session_id, None)
        self._live.discard(session_id)
        self._update_idle()

    def ended(self, session: Session) -> None:
        """The session reached its final state: count it, keep it among the remembered finished ones."""
        self._ended_total[session.state.value] += 1
        if session.reason in (TIME_LIMIT, PAUSED_TOO_LONG):
            self._ended_by_limit[session.reason] += 1
        self._live.discard(session.id)
        self._finished[session.id] = None
        while len(self._finished) > self._history:
            forgotten, _ = self._finished.popitem(last=False)
            self._sessions.pop(forgotten, None)
        self._update_idle()

    async def wait_idle(self, deadline: float | None) -> bool:
        """Wait until no session is live, up to `deadline` (loop time; None: no bound); whether none is."""
        if self._idle.is_set():
            return True
        try:
            async with asyncio.timeout_at(deadline):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def _update_idle(self) -> None:
        if self._live:
            self._idle.clear()
        else:
            self._idle.set()
