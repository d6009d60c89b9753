"""The recovery decisions of one session: re-seed it from its checkpoint after a worker loss, or give up.

A pure core (no awaits, no threads; the caller passes the time), driven by the service's session loop
(`service.LingBotService._drive`) and tested step by step (tests/unit/pipeline/lingbot/test_recovery.py):

    RUNNING ──failed(cause)──► RECOVERING ──rebuilt()──► RUNNING
       │                         │  │
       │                         │  └─failed(cause) again: another attempt, or FAILED
       │                         └─stopped() (stop, drain, cancel, close while recovering)──► ENDED
       └─failed(cause) when it cannot recover──► FAILED
       └─stopped()──► ENDED

When it cannot recover (`RecoveryDecision.recover` False, the state FAILED): the failure is not one a re-seed can
fix (`failure_cause` returns None: e.g. the model's context is exhausted), there is no checkpoint, `attempts`
re-seeds in a row failed before a chunk came out (a re-seed that delivers a chunk starts the count again), or the
recovery has taken longer than `timeout_s` since the failure that started it. The session then ends with today's
stable code (`model_failure`) and a message that says why it was not rebuilt.

Causes. A worker group that died or was unavailable (its rank exited, was killed, or got stuck past the call timeout:
`worker_lost`) and a stage that raised (`stage_failed`) are both re-seeded; the budget stops a stage that raises
every time. The failure reasons come from the orchestrator (`pipeline.orchestrator`, `pipeline.core`): "actor 'x' died
(incarnation n): ..." and "stage 'x': ActorDiedError: ..." / "...ActorUnavailableError: ..." for a lost worker.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "RecoveryBudget",
    "RecoveryCause",
    "RecoveryDecision",
    "RecoveryError",
    "RecoveryState",
    "RecoveryTracker",
    "failure_cause",
]

_WORKER_LOST_MARKS = ("' died (incarnation ", "ActorDiedError", "ActorUnavailableError")
_FINAL_MARKS = ("model_context_exhausted", "ModelContextExhaustedError")
"""Failures a re-seed cannot fix: `models.errors.CONTEXT_EXHAUSTED_REASON` (not imported: the models package is heavy;
a test pins the two together) and its exception's name."""


class RecoveryCause(enum.Enum):
    # A worker group died, was killed, got stuck past its call timeout, or was restarting.
    WORKER_LOST = "worker_lost"
    # A stage raised for this session (its worker lives on).
    STAGE_FAILED = "stage_failed"


class RecoveryState(enum.Enum):
    # Generating (or idle) on a live pipeline session.
    RUNNING = "running"
    # Failed; waiting for the workers, or re-seeded and waiting for its first chunk.
    RECOVERING = "recovering"
    # Could not be rebuilt: ends with its failure (terminal).
    FAILED = "failed"
    # Stopped, drained, cancelled or closed (terminal; not a failure).
    ENDED = "ended"


TRANSITIONS: Mapping[RecoveryState, frozenset[RecoveryState]] = MappingProxyType(
    {
        RecoveryState.RUNNING: frozenset({RecoveryState.RECOVERING, RecoveryState.FAILED, RecoveryState.ENDED}),
        RecoveryState.RECOVERING: frozenset(
            {RecoveryState.RECOVERING, RecoveryState.RUNNING, RecoveryState.FAILED, RecoveryState.ENDED}
        ),
        RecoveryState.FAILED: frozenset(),
        RecoveryState.ENDED: frozenset(),
    }
)
TERMINAL: frozenset[RecoveryState] = frozenset(state for state, moves in TRANSITIONS.items() if not moves)


class RecoveryError(RuntimeError):
    """An illegal move of the recovery state machine (a bug in its driver, never the client's doing)."""


@dataclass(frozen=True, slots=True)
class RecoveryBudget:
    """How hard a session is rebuilt: `attempts` re-seeds in a row without a chunk, within `timeout_s` of the
    failure that started the recovery."""

    attempts: int = 3
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {self.attempts}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")


@dataclass(frozen=True, slots=True)
class RecoveryDecision:
    """What to do about a failure: re-seed (`recover`, attempt number `attempt`) or give up (`why` says why)."""

    recover: bool
    cause: RecoveryCause | None
    attempt: int
    why: str | None = None


def failure_cause(reason: str) -> RecoveryCause | None:
    """The cause of a pipeline failure `reason`; None for a failure a re-seed cannot fix."""
    if any(mark in reason for mark in _FINAL_MARKS):
        return None
    if any(mark in reason for mark in _WORKER_LOST_MARKS):
        return RecoveryCause.WORKER_LOST
    return RecoveryCause.STAGE_FAILED


class RecoveryTracker:
    """One session's recovery state and budget (module docstring). Not thread-safe: the session's loop owns it."""

    def __init__(self, budget: RecoveryBudget) -> None:
        self._budget = budget
        self._state = RecoveryState.RUNNING
        self._attempts = 0
        self._started_at: float | None = None
        self._cause: RecoveryCause | None = None
        self.recoveries = 0
        """Recoveries completed (a chunk came out after the re-seed)."""
        self.interrupted = False
        """Stopped (or cancelled, or closed) while recovering: the failure that started it is not the session's."""

    @property
    def state(self) -> RecoveryState:
        return self._state

    @property
    def cause(self) -> RecoveryCause | None:
        """What started the recovery in progress (None when running)."""
        return self._cause

    @property
    def attempts(self) -> int:
        """Re-seeds since the last chunk came out."""
        return self._attempts

    @property
    def deadline(self) -> float | None:
        """When the recovery in progress runs out of time (None when running)."""
        return None if self._started_at is None else self._started_at + self._budget.timeout_s

    def failed(self, now: float, reason: str, *, has_checkpoint: bool) -> RecoveryDecision:
        """The session's pipeline session failed with `reason`: recover (RECOVERING) or give up (FAILED)."""
        cause = failure_cause(reason)
        if self._state is RecoveryState.RUNNING:
            self._started_at = now
            self._cause = cause
        deadline = self.deadline
        why: str | None = None
        if cause is None:
            why = "the failure is not one a re-seed can fix"
        elif not has_checkpoint:
            why = "the session has no checkpoint"
        elif self._attempts >= self._budget.attempts:
            why = f"{self._attempts} re-seed(s) in a row failed"
        elif deadline is not None and now > deadline:
            why = f"recovery took longer than {self._budget.timeout_s:g} s"
        if why is not None:
            self._move(RecoveryState.FAILED)
            return RecoveryDecision(False, cause, self._attempts, why)
        self._move(RecoveryState.RECOVERING)
        self._attempts += 1
        return RecoveryDecision(True, cause, self._attempts)

    def expired(self, now: float) -> bool:
        """While recovering: True once the budget's time is spent (the workers did not come back in time)."""
        deadline = self.deadline
        return self._state is RecoveryState.RECOVERING and deadline is not None and now > deadline

    def give_up(self, why: str) -> str:
        """End a recovery in progress as failed (e.g. `expired`); returns `why` for the session's failure."""
        self._move(RecoveryState.FAILED)
        return why

    def rebuilt(self, now: float) -> float | None:
        """A chunk came out. After a re-seed it completes the recovery: RUNNING again, returns the seconds since the
        failure; None when the session was running anyway."""
        if self._state is not RecoveryState.RECOVERING:
            if self._state is not RecoveryState.RUNNING:
                raise RecoveryError(f"a chunk came out of a session whose recovery is {self._state.value}")
            self._attempts = 0
            return None
        started = self._started_at
        self._move(RecoveryState.RUNNING)
        self._attempts = 0
        self._started_at = None
        self._cause = None
        self.recoveries += 1
        return None if started is None else max(0.0, now - started)

    def stopped(self) -> None:
        """The session was stopped, drained, cancelled or closed (also while recovering): no recovery after it."""
        if self._state not in TERMINAL:
            self.interrupted = self._state is RecoveryState.RECOVERING
            self._move(RecoveryState.ENDED)

    def _move(self, new: RecoveryState) -> None:
        if new not in TRANSITIONS[self._state]:
            raise RecoveryError(f"recovery cannot move from {self._state.value} to {new.value}")
        self._state = new
