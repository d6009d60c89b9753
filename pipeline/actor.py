"""The seam between the orchestrator and whatever runs a stage.

A *stage* is the user's stateful logic for one logical step (VAE encode, DiT denoise, ...): it processes one
`StageCall` at a time and keeps per-session state until `release(session_id)`. A *stage actor* owns one stage and
runs it somewhere: `LocalStageActor` on one thread of this process, `ParallelWorkerStageActor` in spawned worker
processes. The orchestrator only ever talks to actors through `StageActor`, so tests inject fakes at this seam.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["ActorStatistics", "CallDone", "CallbackStageActor", "DeathListener", "Stage", "StageActor", "StageCall"]


@dataclass(frozen=True, slots=True)
class StageCall:
    """One invocation of a stage: the joined inputs of one `(session_id, sequence_id)`."""

    stage_id: str
    session_id: str
    sequence_id: int
    inputs: Mapping[str, object]


@runtime_checkable
class Stage(Protocol):
    """The user's stateful stage logic. Runs serially: never two calls at once on one stage object."""

    def process(self, call: StageCall) -> Mapping[str, object]:
        """Consume `call.inputs` and return every artifact the stage produces (keyed by artifact name)."""
        ...

    def release(self, session_id: str) -> None:
        """Drop everything held for `session_id`. Must be idempotent: unknown ids are a no-op."""
        ...


@dataclass(frozen=True, slots=True)
class ActorStatistics:
    """A snapshot of one actor, read by metrics, health and tests."""

    name: str
    healthy: bool
    incarnation: int
    in_flight: int
    calls: int
    failures: int
    restarts: int


DeathListener = Callable[[str, int, str], None]
"""Called as `listener(actor_name, dead_incarnation, reason)` on the event loop when an actor's runtime dies."""


class StageActor(Protocol):
    """Runs one stage for the orchestrator.

    Contract:
    - `invoke` runs one call and returns the produced artifacts. A stage exception surfaces as
      `StageFailedError` (the session fails; the actor stays healthy). If the actor's runtime dies during the call,
      `ActorDiedError` is raised; if it is stopped or restarting, `ActorUnavailableError`.
    - `incarnation` increases every time the runtime is (re)started; per-session state from an older incarnation
      is gone. The orchestrator fails sessions whose state lived in a dead incarnation.
    - `release_session` drops one session's state inside the runtime; raising means the release failed.
    - Cancelling an `invoke` never interrupts the stage mid-call: the call in flight finishes and its result is
      dropped (the actor's own docstring states the details).
    """

    @property
    def name(self) -> str: ...

    @property
    def capacity(self) -> int:
        """How many calls the actor runs at once (1 for a serial stage)."""
        ...

    @property
    def healthy(self) -> bool: ...

    @property
    def incarnation(self) -> int: ...

    def add_death_listener(self, listener: DeathListener) -> None: ...

    async def start(self) -> None: ...

    async def invoke(self, call: StageCall) -> Mapping[str, object]: ...

    async def release_session(self, session_id: str) -> None: ...

    async def aclose(self) -> None: ...

    def statistics(self) -> ActorStatistics: ...


CallDone = Callable[[Mapping[str, object] | None, BaseException | None], None]
"""Called as `done(outputs, None)` or `done(None, error)` on the event loop, exactly once per started call, with
what `invoke` would have returned or raised (the same errors)."""


@runtime_checkable
class CallbackStageActor(StageActor, Protocol):
    """A `StageActor` that can also start a call and report its outcome by callback, with no task or future per call.

    The orchestrator uses `start_call` where an actor offers it (a stage thread: the hop is most of the cost of a
    short call) and `invoke` otherwise. `start_call` returns at once and never raises; `done` runs later on the
    event loop in `context` (the caller passes one it owns), and the stage in a copy of it, so what the stage sets
    in its context does not reach `done`. Every started call gets its outcome before `aclose` returns. The other
    guarantees are `invoke`'s (ordering, failures, a call in flight is never interrupted).
    """

    def start_call(self, call: StageCall, done: CallDone, context: contextvars.Context) -> None: ...
