"""The runtime's own lifecycle: `RuntimeState`, its transition table, and `RuntimeLifecycle`, the one place it moves.

    new ──► serving ──► draining ──► closing ──► closed
     │  │                  ▲            ▲
     │  └──────────────────┘            │
     └─────────── (serving too) ────────┘

A drain may begin before `start()` has finished (a SIGTERM while the app starts): NEW moves to DRAINING, and the
start that finishes later leaves it there. `aclose()` may come from any live state. The table has the shape of the
session's (`service.runtime.sessions`) and the bindings' (`transport.session.binding`): an enum with a comment per
state, every legal move written out, the terminal states a frozenset, and an illegal move raises with a sentence
(`RuntimeTransitionError`, a bug) and changes nothing.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from types import MappingProxyType

from service.errors import RuntimeTransitionError

__all__ = ["RUNTIME_TRANSITIONS", "TERMINAL_RUNTIME_STATES", "RuntimeLifecycle", "RuntimeState"]

logger = logging.getLogger(__name__)


class RuntimeState(enum.Enum):
    # Built; `start()` has not finished: admits nothing, not ready.
    NEW = "new"
    # Started: admission and the transport are up, the model workers start in the background (ready once they are).
    SERVING = "serving"
    # A drain began (SIGTERM, POST /internal/drain): not ready, no new admissions, sessions end by its deadline.
    DRAINING = "draining"
    # `aclose()` is under way: sessions are cancelled, then the workers, the transport and admission stop.
    CLOSING = "closing"
    # Closed: every task awaited (terminal).
    CLOSED = "closed"


RUNTIME_TRANSITIONS: Mapping[RuntimeState, frozenset[RuntimeState]] = MappingProxyType(
    {
        RuntimeState.NEW: frozenset({RuntimeState.SERVING, RuntimeState.DRAINING, RuntimeState.CLOSING}),
        RuntimeState.SERVING: frozenset({RuntimeState.DRAINING, RuntimeState.CLOSING}),
        RuntimeState.DRAINING: frozenset({RuntimeState.CLOSING}),
        RuntimeState.CLOSING: frozenset({RuntimeState.CLOSED}),
        RuntimeState.CLOSED: frozenset(),
    }
)
"""Every legal move of the runtime, from each state."""

TERMINAL_RUNTIME_STATES: frozenset[RuntimeState] = frozenset(
    state for state, moves in RUNTIME_TRANSITIONS.items() if not moves
)
_SHUTTING_DOWN = frozenset({RuntimeState.CLOSING, RuntimeState.CLOSED})


class RuntimeLifecycle:
    """The runtime's state and the only place it changes: `move` checks `RUNTIME_TRANSITIONS`."""

    def __init__(self) -> None:
        self._state = RuntimeState.NEW

    @property
    def state(self) -> RuntimeState:
        return self._state

    @property
    def closing(self) -> bool:
        """`aclose()` has begun (or finished): nothing new may start."""
        return self._state in _SHUTTING_DOWN

    def can_move(self, new: RuntimeState) -> bool:
        return new in RUNTIME_TRANSITIONS[self._state]

    def move(self, new: RuntimeState) -> None:
        """Move to `new`; raises `RuntimeTransitionError` (and stays where it is) unless the table allows it."""
        if not self.can_move(new):
            allowed = sorted(state.value for state in RUNTIME_TRANSITIONS[self._state])
            why = (
                "it is closed"
                if not allowed
                else f"a {self._state.value} runtime can only become " + ", ".join(allowed)
            )
            raise RuntimeTransitionError(f"the runtime cannot move from {self._state.value} to {new.value}: {why}")
        logger.debug("runtime: %s -> %s", self._state.value, new.value)
        self._state = new
